"""kvlane.Agent, DList and RegistrationReport: the Python face of libkvlane."""

import math
import numbers
import operator

from . import _kvlane
from .errors import UsageError, UnsupportedError, InvalidArgument

__all__ = ["Agent", "DList", "RegistrationReport", "RegEntry", "RegOutcome", "memory_of"]


# ---- registration report -----------------------------------------------------

class RegOutcome:
    """One backend's answer for one region: ``backend``, ``status`` (int),
    ``name`` (status name), ``ok``, ``detail`` (path used, or the reason)."""

    __slots__ = ("backend", "status", "detail")

    def __init__(self, backend, status, detail):
        self.backend, self.status, self.detail = backend, status, detail

    @property
    def ok(self):
        return self.status == 0

    @property
    def name(self):
        return _kvlane.status_name(self.status)

    def __repr__(self):
        return f"RegOutcome({self.backend!r}, {self.name}, {self.detail!r})"


class RegEntry:
    """One region of a registration: ``addr``, ``len``, ``kind`` ("DRAM",
    ...), ``dev``, ``status``, ``reused`` (already registered: reference
    count incremented), ``outcomes`` (list of :class:`RegOutcome`)."""

    __slots__ = ("addr", "len", "kind", "dev", "status", "reused", "outcomes")

    def __init__(self, addr, length, kind, dev, status, reused, outcomes):
        self.addr, self.len, self.kind, self.dev = addr, length, kind, dev
        self.status, self.reused = status, bool(reused)
        self.outcomes = [RegOutcome(*o) for o in outcomes]

    @property
    def ok(self):
        return self.status == 0

    @property
    def backends(self):
        """Backends that accepted the region."""
        return [o.backend for o in self.outcomes if o.ok]

    def __repr__(self):
        return (f"RegEntry(0x{self.addr:x}+{self.len}, {self.kind}, dev={self.dev}, "
                f"{_kvlane.status_name(self.status)}, backends={self.backends})")


class RegistrationReport:
    """What every backend said about every region. ``str()`` is the readable
    table; ``entries`` the regions (:class:`RegEntry`); ``outcomes`` every
    (region index, :class:`RegOutcome`) pair; ``ok`` whether all regions
    registered."""

    def __init__(self, text, entries):
        self._c = None
        self._text = text
        self._entries = entries

    @classmethod
    def _from_tuple(cls, t):
        """From what _kvlane returns: None, a RegReport (read lazily) or a
        (text, entries) tuple."""
        if t is None:
            return None
        if isinstance(t, tuple):
            text, entries = t
            return cls(text, [RegEntry(*e) for e in entries])
        r = cls(None, None)
        r._c = t
        return r

    @property
    def text(self):
        if self._text is None:
            self._text = self._c.text()
        return self._text

    def __reduce__(self):
        return (RegistrationReport, (self.text, self.entries))

    @property
    def entries(self):
        if self._entries is None:
            self._entries = [RegEntry(*e) for e in self._c.entries()]
        return self._entries

    @property
    def outcomes(self):
        return [(i, o) for i, e in enumerate(self.entries) for o in e.outcomes]

    @property
    def ok(self):
        return all(e.ok for e in self.entries)

    def __len__(self):
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, i):
        return self.entries[i]

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"<kvlane.RegistrationReport: {len(self.entries)} regions, ok={self.ok}>"


# ---- memory objects --------------------------------------------------------------

def _itemsize(typestr):
    try:
        return int(typestr[2:])
    except (ValueError, TypeError):
        raise InvalidArgument(f"array interface typestr {typestr!r} has no item size") from None


def _check_contiguous(shape, strides, itemsize, what):
    if strides is None:
        return
    expect = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim > 1 and stride != expect:
            raise InvalidArgument(
                f"{what} is not C-contiguous (shape {tuple(shape)}, strides {tuple(strides)})",
                hint="register the base array (or a contiguous copy), not a strided view")
        expect *= dim


def memory_of(obj):
    """(addr, nbytes, dev, kind) of a memory object.

    Accepted: an (addr, len[, dev]) tuple; a PyTorch tensor (duck typed:
    ``data_ptr()``, ``nbytes`` or ``numel()*element_size()``, ``device``);
    anything with ``__cuda_array_interface__`` (VRAM) or
    ``__array_interface__`` (NumPy, DRAM); anything exporting the buffer
    protocol (bytearray, mmap, memoryview: DRAM). dev is -1 (detect) when
    the object does not say; kind is None for plain tuples (detect).
    """
    # int or a NumPy integer (engines compute addresses with NumPy)
    if isinstance(obj, (tuple, list)) and obj and isinstance(obj[0], numbers.Integral):
        if not 2 <= len(obj) <= 4:
            raise InvalidArgument(f"a region tuple is (addr, len[, dev]), got {obj!r}")
        dev = obj[2] if len(obj) > 2 else -1
        try:  # not int(): it would take a len of 16.5 as 16
            return operator.index(obj[0]), operator.index(obj[1]), operator.index(dev), None
        except TypeError:
            raise InvalidArgument(f"a region tuple is (addr, len[, dev]) of integers, "
                                  f"got {obj!r}") from None
    data_ptr = getattr(obj, "data_ptr", None)
    device = getattr(obj, "device", None)
    if callable(data_ptr) and device is not None and hasattr(device, "type"):
        is_contig = getattr(obj, "is_contiguous", None)
        if callable(is_contig) and not is_contig():
            raise InvalidArgument("tensor is not contiguous",
                                  hint="register the storage's base tensor or .contiguous()")
        nbytes = getattr(obj, "nbytes", None)
        if nbytes is None:
            nbytes = obj.numel() * obj.element_size()
        if device.type == "cuda":
            idx = device.index
            return int(data_ptr()), int(nbytes), -1 if idx is None else int(idx), "VRAM"
        if device.type == "cpu":
            return int(data_ptr()), int(nbytes), -1, "DRAM"
        raise UnsupportedError(f"tensor on device type {device.type!r}: kvlane moves cpu and "
                               "cuda memory")
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        isz = _itemsize(cai["typestr"])
        _check_contiguous(shape, cai.get("strides"), isz, "CUDA array")
        return int(cai["data"][0]), math.prod(shape) * isz, -1, "VRAM"
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None and isinstance(ai.get("data"), tuple):
        shape = tuple(ai["shape"])
        isz = _itemsize(ai["typestr"])
        _check_contiguous(shape, ai.get("strides"), isz, "array")
        return int(ai["data"][0]), math.prod(shape) * isz, -1, "DRAM"
    if isinstance(obj, tuple) and obj and isinstance(obj[0], (float, str, bytes)):
        raise InvalidArgument(f"a region tuple is (addr, len[, dev]) of integers, got {obj!r}")
    try:
        addr, nbytes, _ro = _kvlane.buffer_info(obj)
    except (TypeError, BufferError):
        raise InvalidArgument(
            f"cannot register a {type(obj).__name__}: pass (addr, len, dev) tuples, tensors, "
            "NumPy arrays, objects with __cuda_array_interface__ or buffers") from None
    return addr, nbytes, -1, "DRAM"


def _regions(mem, kind):
    """(regions for the C call, kind, objects to keep alive)."""
    if isinstance(mem, (tuple, list)) and mem and isinstance(mem[0], numbers.Integral):
        mem = [mem]
    if isinstance(mem, list) or (isinstance(mem, tuple) and mem and
                                 isinstance(mem[0], (tuple, list))):
        if mem and isinstance(mem[0], tuple):
            # A list of region tuples is parsed in C, without a Python loop.
            return mem, kind, None
        items = [memory_of(m) for m in mem]
        keep = list(mem)
    else:
        items = [memory_of(mem)]
        keep = [mem]
    regions = [(a, n, d) for a, n, d, _k in items]
    if kind is None:
        kinds = {k for _a, _n, _d, k in items if k is not None}
        if len(kinds) == 1:
            kind = kinds.pop()
    return regions, kind, keep


# ---- DList -----------------------------------------------------------------------

class DList(_kvlane.DList):
    """A descriptor list: plain entries (addr, len, dev) and strided entries
    (base, stride, count, len, dev). Build big lists from arrays:
    ``add_array(addrs, lens)`` (NumPy int64/uint64 used in place, int32 and
    lists converted in C), ``add_strided_array(bases, stride, count, len)``,
    ``add_descs([(addr, len, dev), ...])`` or an (N, 3) array."""

    __slots__ = ()

    @classmethod
    def from_arrays(cls, addrs, lens=None, len=0, kind="DRAM", dev=-1):  # noqa: A002
        dl = cls(kind, _n(addrs))
        dl.add_array(addrs, lens, len, dev)
        return dl

    @classmethod
    def from_descs(cls, descs, kind="DRAM", dev=None):
        dl = cls(kind, _n(descs))
        dl.add_descs(descs, dev)
        return dl

    @classmethod
    def from_strided(cls, bases, stride, count, len, kind="DRAM", dev=-1):  # noqa: A002
        dl = cls(kind, _n(bases))
        dl.add_strided_array(bases, stride, count, len, dev)
        return dl

    def entries(self):
        """Every entry as (addr, stride, count, len, dev) (a Python list: for inspection)."""
        return [self.get(i) for i in range(_kvlane.DList.__len__(self))]


def _n(x):
    try:
        return len(x)
    except TypeError:
        return 0


# ---- Agent -----------------------------------------------------------------------

class Agent(_kvlane.Agent):
    """An agent: one per process or engine rank.

    ``Agent(name, backends=("shm",), timeout_ms=None, secret=None, workers=None,
    notif_max_bytes=None, notif_max_msgs=None, notif_peer_percent=None)``:
    the last three bound the notifications received and not yet taken
    (default 64 MiB and 65536, one sending agent at most 50% of that; a
    sender past them gets :class:`kvlane.RemoteFull`; see
    ``notif_queue_info()``).
    ``backends`` are created at once with default parameters;
    ``create_backend(name, params)`` adds more. Use it as a context manager,
    or call ``close()``; agents still open at interpreter exit are closed by
    an atexit hook (transfers cancelled, memory deregistered, then backends
    closed).
    """

    def __init__(self, name, backends=("shm",), timeout_ms=None, secret=None, workers=None,
                 notif_max_bytes=None, notif_max_msgs=None, notif_peer_percent=None):
        if isinstance(backends, str):
            backends = [backends]
        super().__init__(name, ",".join(backends), timeout_ms or 0, secret, workers or 0,
                         notif_max_bytes or 0, notif_max_msgs or 0, notif_peer_percent or 0)
        self._keep = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self.closed:
            return "<kvlane.Agent (closed)>"
        return f"<kvlane.Agent {self.name!r} backends={self.backends()}>"

    # -- memory --
    def register_memory(self, mem, kind=None, backends=None, strict=False, dev=None):
        """Register memory; returns a :class:`RegistrationReport`.

        mem: an (addr, len, dev) tuple, a list of them, a tensor, a NumPy
        array, an object with ``__cuda_array_interface__``, a buffer, or a
        list of such objects. kind: "DRAM", "VRAM", "FILE" or None (detect).
        backends: names to offer the regions to (default: every backend that
        serves the kind). strict: every named backend must accept. dev: use
        this device for every region (None: each region's own). A list is
        all or nothing. Registered objects are kept alive until deregistered.
        On failure the exception's ``report`` holds every backend's answer.
        """
        regions, kind, keep = _regions(mem, kind)
        rep = self._register(regions, kind, backends, strict, dev)
        if keep:
            for obj, (addr, length, _dev) in zip(keep, regions):
                slot = self._keep.setdefault((addr, length), [])
                slot.append(obj)
        return RegistrationReport._from_tuple(rep)

    def deregister_memory(self, mem, dev=None):
        """Drop one registration of each region (same forms as register_memory)."""
        regions, _kind, _keep = _regions(mem, None)
        self._deregister(regions, dev)
        for r in regions:
            slot = self._keep.get((r[0], r[1]))
            if slot:
                slot.pop()
                if not slot:
                    del self._keep[(r[0], r[1])]

    # -- descriptor lists and transfers --
    def prep(self, dlist, remote=None):
        """Prepare a DList: local when remote is None, else against a remote agent."""
        if remote is None:
            return self.prep_local(dlist)
        return self.prep_remote(_name(remote), dlist)

    def xfer(self, op, local, remote, remote_list, notif=None, backend=None, timeout_ms=0):
        """Create a transfer between two DLists (see create_xfer)."""
        return self.create_xfer(op, local, _name(remote), remote_list, notif, backend, timeout_ms)

    def xfer_prepped(self, op, local, local_idx, remote, remote_idx, notif=None, backend=None,
                     timeout_ms=0):
        """Create a transfer from prepared lists and index arrays (lists, NumPy int32/int64,
        or None for all entries in order)."""
        return self.create_xfer_prepped(op, local, local_idx, remote, remote_idx, notif,
                                        backend, timeout_ms)

    # -- notifications and metadata (short names) --
    def send(self, remote, msg):
        self.send_notif(_name(remote), msg)

    def poll(self, max=-1):  # noqa: A002
        return self.poll_notifs(max)

    def fetch(self, host_port):
        return self.fetch_metadata(host_port)

    def push(self, host_port):
        self.push_metadata(host_port)

    def invalidate(self, host_port=None):
        self.invalidate_metadata(host_port)


def _name(remote):
    if isinstance(remote, (bytes, bytearray)):
        return bytes(remote).decode()
    return remote
