"""kvlane exceptions: the class says the kind, the attributes carry the details.

Every failure of a kvlane call raises a subclass of :class:`Error`. The class
follows the status group (usage, system, remote, unsupported, internal) and,
for the common cases, the exact status (:class:`NotFound`,
:class:`OutOfBounds`, :class:`Timeout`, ...). ``str(exc)`` is the full text
libkvlane renders for the error (what failed, where, and what to do).
"""

from . import _kvlane

# ---- NIXL's exception names ------------------------------------------------------
#
# NIXL's Python bindings raise one class per status (each derives from
# Exception only). kvlane's classes derive from the matching one, so code
# written against NIXL (``except nixlBackendError``) catches kvlane's errors,
# and the message stays kvlane's full diagnosis.


class nixlNotPostedError(Exception):
    """NIXL_ERR_NOT_POSTED"""


class nixlInvalidParamError(Exception):
    """NIXL_ERR_INVALID_PARAM"""


class nixlBackendError(Exception):
    """NIXL_ERR_BACKEND"""


class nixlNotFoundError(Exception):
    """NIXL_ERR_NOT_FOUND"""


class nixlMismatchError(Exception):
    """NIXL_ERR_MISMATCH"""


class nixlNotAllowedError(Exception):
    """NIXL_ERR_NOT_ALLOWED"""


class nixlRepostActiveError(Exception):
    """NIXL_ERR_REPOST_ACTIVE"""


class nixlUnknownError(Exception):
    """NIXL_ERR_UNKNOWN"""


class nixlNotSupportedError(Exception):
    """NIXL_ERR_NOT_SUPPORTED"""


class nixlRemoteDisconnectError(Exception):
    """NIXL_ERR_REMOTE_DISCONNECT"""


class nixlCancelledError(Exception):
    """NIXL_ERR_CANCELED"""


class nixlNoTelemetryError(Exception):
    """NIXL_ERR_NO_TELEMETRY"""


NIXL_ERRORS = (
    nixlNotPostedError, nixlInvalidParamError, nixlBackendError, nixlNotFoundError,
    nixlMismatchError, nixlNotAllowedError, nixlRepostActiveError, nixlUnknownError,
    nixlNotSupportedError, nixlRemoteDisconnectError, nixlCancelledError, nixlNoTelemetryError)

__all__ = [
    "Error", "UsageError", "OSFailure", "RemoteError", "UnsupportedError", "InternalError",
    "InvalidArgument", "NotFound", "InUse", "Exists", "OutOfBounds", "DeviceMismatch",
    "StateError", "Cancelled", "NoMemory", "PermissionDenied", "Timeout", "NoDevice",
    "Disconnected", "Refused", "Stale", "BadMetadata", "RemoteFull", "NoBackend", "error_class",
] + [c.__name__ for c in NIXL_ERRORS]


class Error(Exception):
    """Base of every kvlane error.

    Attributes: ``code`` (int status), ``name`` ("KVL_ERR_..."), ``errno``,
    ``backend``, ``device`` (None when not about a device), ``agent`` (remote
    agent involved), ``region``, ``what`` (the exact call that failed and its
    result), ``hint`` (what to do), ``causes`` (list of dicts with code, name,
    errno, backend, device, what, hint: one per backend or region),
    ``report`` (the :class:`kvlane.RegistrationReport` of a failed
    registration, else None).
    """

    code = -500

    def __init__(self, message="", *, code=None, errno=0, backend="", device=None, agent="",
                 region="", what=None, hint="", causes=None, report=None, name=None):
        if code is None:
            code = type(self).code
        self.code = code
        self.name = name or _kvlane.status_name(code)
        self.errno = errno
        self.backend = backend
        self.device = device
        self.agent = agent
        self.region = region
        self.what = message if what is None else what
        self.hint = hint
        self.causes = list(causes or [])
        self.report = report
        if not message:
            message = f"{self.name}: {self.what}"
            if hint:
                message += f"\n  fix: {hint}"
        self.text = message
        super().__init__(message)

    def __str__(self):
        return self.text

    def __reduce__(self):
        both = type(self).__dict__.get("_kvl_as")
        if both is not None:      # made by as_nixl: rebuilt the same way
            return (_rebuild_as, (both[0], both[1], self.text, self.__dict__))
        return (_rebuild, (type(self), self.text, self.__dict__))


def _rebuild(cls, text, state):
    exc = cls.__new__(cls)
    Exception.__init__(exc, text)
    exc.__dict__.update(state)
    return exc


def _rebuild_as(cls, nixl_cls, text, state):
    return as_nixl(_rebuild(cls, text, state), nixl_cls)


class UsageError(Error, nixlInvalidParamError):
    """The call was wrong (-1xx): fix the caller."""
    code = -100


class OSFailure(Error, nixlBackendError):
    """The kernel or a limit refused (-2xx)."""
    code = -200


class RemoteError(Error, nixlBackendError):
    """The peer failed or sent something unacceptable (-3xx)."""
    code = -300


class UnsupportedError(Error, nixlNotSupportedError):
    """Not possible with this build, backend or hardware (-4xx)."""
    code = -400


class InternalError(Error, nixlUnknownError):
    """A kvlane bug (-5xx): please report it."""
    code = -500


class InvalidArgument(UsageError, ValueError):
    code = -100


class NotFound(UsageError, nixlNotFoundError):
    code = -101


class InUse(UsageError, nixlNotAllowedError):
    code = -102


class Exists(UsageError, nixlNotAllowedError):
    code = -103


class OutOfBounds(UsageError):
    code = -104


class DeviceMismatch(UsageError, nixlMismatchError):
    code = -105


class StateError(UsageError, nixlNotAllowedError):
    code = -106


class Cancelled(UsageError, nixlCancelledError):
    code = -107


class NoMemory(OSFailure):
    code = -201


class PermissionDenied(OSFailure):
    code = -202


class Timeout(OSFailure):
    code = -203


class NoDevice(OSFailure):
    code = -204


class Disconnected(RemoteError, nixlRemoteDisconnectError):
    code = -301


class Refused(RemoteError):
    code = -302


class Stale(RemoteError):
    code = -303


class BadMetadata(RemoteError):
    code = -304


class RemoteFull(RemoteError):
    """KVL_ERR_REMOTE_FULL: the remote agent's notification queue is full
    (its application has not taken its notifications). A nixlBackendError,
    as every failed send_notif in NIXL."""
    code = -305


class NoBackend(UnsupportedError):
    code = -401


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgument, NotFound, InUse, Exists, OutOfBounds, DeviceMismatch, StateError,
    Cancelled, NoMemory, PermissionDenied, Timeout, NoDevice, Disconnected, Refused, Stale,
    BadMetadata, RemoteFull, NoBackend)}
_BY_GROUP = {1: UsageError, 2: OSFailure, 3: RemoteError, 4: UnsupportedError,
             5: InternalError}


_AS = {}


def as_nixl(exc, nixl_cls):
    """Make exc also an instance of NIXL's nixl_cls (in place; returns exc):
    a failed registration is a nixlBackendError in NIXL whatever kvlane's
    class says, and engines catch it as such."""
    cls = type(exc)
    if isinstance(exc, nixl_cls) or not isinstance(exc, Error):
        return exc
    key = (cls, nixl_cls)
    both = _AS.get(key)
    if both is None:
        both = type(cls.__name__, (cls, nixl_cls), {"__module__": cls.__module__,
                                                    "__doc__": cls.__doc__,
                                                    "_kvl_as": (cls, nixl_cls)})
        _AS[key] = both
    exc.__class__ = both
    return exc


def error_class(code):
    """The exception class for a status code."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    return _BY_GROUP.get((-code) // 100, InternalError)


def _make(fields, report):
    """Called by the C extension: build the exception for a failed call."""
    from ._agent import RegistrationReport  # late: _agent imports this module
    code = fields["code"]
    rep = RegistrationReport._from_tuple(report) if report is not None else None
    return error_class(code)(
        fields["text"], code=code, name=fields["name"], errno=fields["errno"],
        backend=fields["backend"], device=fields["device"], agent=fields["agent"],
        region=fields["region"], what=fields["what"], hint=fields["hint"],
        causes=fields["causes"], report=rep)


_kvlane._set_error_factory(_make)
