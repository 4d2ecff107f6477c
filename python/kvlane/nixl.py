"""NIXL's Python agent on kvlane: engines written against NIXL run unchanged.

    from nixl._api import nixl_agent, nixl_agent_config    # with build/python-nixl on PYTHONPATH
    from kvlane.nixl import nixl_agent, nixl_agent_config  # or, with an import change

Signatures, return values and exceptions follow NIXL 1.4+ (``nixl._api``),
checked against the calls of vLLM's NixlConnector, SGLang's NIXL KV manager,
Dynamo's nixl_connect and LMCache's NIXL channel. NIXL's network transport
names (``UCX`` and the like) create kvlane's whole transport set for this
host, so every transfer takes the fastest path that reaches both sides.
docs/python.md ("kvlane.nixl") has the mapping table and every difference.
"""

import enum
import io
import itertools
import logging
import operator
import os
import pickle
import sys
import time

from . import _kvlane
from ._agent import Agent, DList, RegistrationReport, memory_of
from .errors import (Error, UsageError, UnsupportedError, InvalidArgument, NotFound, StateError,
                     as_nixl, nixlBackendError, nixlNotPostedError, nixlRepostActiveError,
                     nixlNoTelemetryError, nixlNotFoundError)

__all__ = ["nixl_agent", "nixl_agent_config", "nixl_reg_dlist", "nixl_xfer_dlist",
           "nixl_prepped_dlist_handle", "nixl_xfer_handle", "nixl_xfer_telemetry",
           "nixlRegDList", "nixlXferDList", "nixlXferTelemetry", "nixl_mem_t", "nixl_xfer_op_t",
           "nixl_thread_sync_t", "DEFAULT_COMM_PORT", "NIXL_INIT_AGENT", "transport_set",
           "TRANSPORT_NAMES", "STORAGE_NAMES", "FILE_NAMES"]

log = logging.getLogger("kvlane.nixl")

DEFAULT_COMM_PORT = 8888
NIXL_INIT_AGENT = "NIXL_INIT_AGENT"


# ---- enums (NIXL's values) ------------------------------------------------------------

class nixl_mem_t(enum.IntEnum):
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


class nixl_xfer_op_t(enum.IntEnum):
    NIXL_READ = 0
    NIXL_WRITE = 1


class nixl_thread_sync_t(enum.Enum):
    """NIXL's thread-safety modes. kvlane agents are always safe to call from
    any thread (what NIXL calls STRICT); the value is accepted and kept."""
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 3


# NIXL memory type names (and nixl_mem_t values) -> kvlane kinds.
_MEM = {"DRAM": "DRAM", "VRAM": "VRAM", "FILE": "FILE", "cpu": "DRAM", "cuda": "VRAM",
        nixl_mem_t.DRAM_SEG: "DRAM", nixl_mem_t.VRAM_SEG: "VRAM", nixl_mem_t.FILE_SEG: "FILE"}
_MEM_LATER = {"BLOCK": "BLOCK memory (raw block devices) is not served by kvlane",
              "OBJ": "OBJ memory (object stores) is not served by kvlane",
              nixl_mem_t.BLK_SEG: "BLOCK memory (raw block devices) is not served by kvlane",
              nixl_mem_t.OBJ_SEG: "OBJ memory (object stores) is not served by kvlane"}
_MEM_STR = {k: v for k, v in _MEM.items() if type(k) is str}
_new_object = object.__new__
_time_ns = time.time_ns
_SEG = {"DRAM": nixl_mem_t.DRAM_SEG, "VRAM": nixl_mem_t.VRAM_SEG, "FILE": nixl_mem_t.FILE_SEG}


def _mem(mem_type):
    """kvlane kind for a NIXL memory type; None stays None."""
    if mem_type is None:
        return None
    try:
        return _MEM[mem_type]
    except (KeyError, TypeError):
        pass
    try:
        why = _MEM_LATER.get(mem_type)
    except TypeError:
        why = None
    if why is not None:
        raise UnsupportedError(f"memory type {mem_type!r}: {why}",
                               hint="kvlane moves DRAM and VRAM ('cpu' and 'cuda' as in NIXL) "
                                    "and FILE (with POSIX, GDS or GDS_MT)")
    raise InvalidArgument(f"memory type {mem_type!r} is not one of NIXL's: 'DRAM', 'VRAM', "
                          "'FILE', 'BLOCK', 'OBJ' (or 'cpu', 'cuda', or a nixl_mem_t)")


# ---- backend names ------------------------------------------------------------------------

# NIXL plugins that mean "a network transport": each creates kvlane's whole
# transport set for this host (see transport_set()).
TRANSPORT_NAMES = ("UCX", "UCCL", "LIBFABRIC", "MOONCAKE", "GPUNETIO", "TCPXO", "UCX_MO")
# NIXL storage plugins: known names. The file ones (FILE_NAMES) are served by
# kvlane's posix backend; the others are not served by this kvlane version.
STORAGE_NAMES = ("POSIX", "GDS", "GDS_MT", "OBJ", "HF3FS", "3FS", "AZURE_BLOB", "GUSLI",
                 "INFINIA")
FILE_NAMES = ("POSIX", "GDS", "GDS_MT")
# kvlane's own backends: an explicit name forces that one backend.
_KVLANE_NAMES = ("shm", "tcp", "ucx", "cuda")
_FORCED = {"SHM": "shm", "TCP": "tcp", "CUDA": "cuda", "shm": "shm", "tcp": "tcp", "ucx": "ucx",
           "cuda": "cuda", "posix": "posix", "POSIX": "posix", "GDS": "posix",
           "GDS_MT": "posix"}
_BACKEND_MEMS = {"shm": ["DRAM"], "tcp": ["DRAM", "VRAM"], "ucx": ["DRAM", "VRAM"],
                 "cuda": ["DRAM", "VRAM"], "posix": ["DRAM", "VRAM", "FILE"]}
# NIXL's file plugin parameters: what they mean on kvlane's posix backend.
_POSIX_PARAMS = {"engine", "queue_depth", "threads", "gds"}
# What NIXL's UCX plugin reports as its parameters (get_plugin_params("UCX")).
_UCX_DEFAULTS = {"ucx_devices": "", "num_workers": "1", "ucx_error_handling_mode": "peer"}
_NO_EFFECT_SEEN = set()


_SET = None


def transport_set():
    """kvlane backends that a NIXL transport name creates on this host, fastest
    first: shm (same host, DRAM), cuda (when a CUDA driver and GPU are
    present: GPU memory on this host), ucx (when its module loads and an RDMA
    device is usable), tcp (any host). KVLANE_NIXL_TRANSPORTS (comma list of
    kvlane backends) overrides it."""
    global _SET
    if _SET is not None:
        return list(_SET)
    env = os.environ.get("KVLANE_NIXL_TRANSPORTS")
    if env is not None:
        names = [n.strip() for n in env.split(",") if n.strip()]
        bad = [n for n in names if n not in _KVLANE_NAMES]
        if bad or not names:
            raise InvalidArgument(f"KVLANE_NIXL_TRANSPORTS={env!r}: {bad or 'empty'} is not a "
                                  f"comma list of kvlane backends ({', '.join(_KVLANE_NAMES)})")
        out = names
    else:
        out = ["shm"]
        if _kvlane.backend_available("cuda")[0]:
            out.append("cuda")
        if _kvlane.backend_available("ucx")[0] and _kvlane.rdma_usable():
            out.append("ucx")
        if _kvlane.backend_available("tcp")[0]:
            out.append("tcp")
    _SET = list(out)
    return list(out)


def _no_effect(backend, key, value, why):
    if (backend, key) in _NO_EFFECT_SEEN:
        return
    _NO_EFFECT_SEEN.add((backend, key))
    log.info("kvlane.nixl: %s parameter %s=%r has no effect on kvlane (%s)", backend, key,
             value, why)


def _str_params(params, backend):
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidArgument(f"create_backend({backend!r}, initParams): initParams must be a "
                              f"dict of str to str, got {type(params).__name__}")
    return {str(k): str(v) for k, v in params.items()}


def _ucx_set_params(name, params, members, workers):
    """NIXL UCX plugin parameters -> {kvlane backend: {key: value}}."""
    out = {m: {} for m in members}
    have_ucx = "ucx" in members
    for k, v in params.items():
        if "." in k and k.split(".", 1)[0] in _KVLANE_NAMES:
            bk, key = k.split(".", 1)
            if bk not in members:
                raise InvalidArgument(f"create_backend({name!r}): parameter {k!r} is for kvlane's "
                                      f"{bk} backend, which is not in this host's set "
                                      f"({', '.join(members)})")
            out[bk][key] = v
        elif k in ("ucx_devices", "device_list"):
            if have_ucx:
                out["ucx"]["net_devices"] = v.replace(" ", "")
            elif v:
                _no_effect(name, k, v, "kvlane's ucx backend is not in this host's set: "
                           f"{', '.join(members)}")
        elif k == "ucx_error_handling_mode":
            if v not in ("peer", "none"):
                raise InvalidArgument(f"create_backend({name!r}): ucx_error_handling_mode={v!r} "
                                      "is neither 'peer' nor 'none'")
            if have_ucx:
                out["ucx"]["error_handling"] = v
            else:
                _no_effect(name, k, v, "kvlane's shm, cuda and tcp always detect dead peers")
        elif k in ("num_threads", "num_workers", "num_cpus"):
            try:
                n = int(v)
            except ValueError:
                raise InvalidArgument(f"create_backend({name!r}): {k}={v!r} is not an "
                                      "integer") from None
            if n < 0:
                raise InvalidArgument(f"create_backend({name!r}): {k}={v!r} is negative")
            if k == "num_threads" and n and n != workers:
                _no_effect(name, k, v, "kvlane's copy threads are set when the agent is made: "
                           "nixl_agent_config(num_threads=N)")
            elif k != "num_threads":
                _no_effect(name, k, v, "kvlane's progress threads are per backend, not "
                           "configurable")
        elif k == "engine_config":
            for item in filter(None, (s.strip() for s in v.replace(";", ",").split(","))):
                key, _, val = item.partition("=")
                key = key.strip().upper()
                if key.startswith("UCX_"):
                    key = key[4:]
                if have_ucx and key in ("TLS", "NET_DEVICES"):
                    out["ucx"][key.lower()] = val.strip()
                else:
                    _no_effect(name, f"engine_config {key}", val,
                               "only TLS and NET_DEVICES map to kvlane's ucx backend"
                               if have_ucx else "kvlane's ucx backend is not in this host's set")
        elif k in ("split_batch_size", "ucx_num_device_channels", "device_proxy",
                   "sync_mode") or k.startswith("proxy_"):
            _no_effect(name, k, v, "kvlane sizes its batches and channels itself")
        elif name != "UCX":
            # Other NIXL transports' own parameters: kvlane knows no meaning for them.
            _no_effect(name, k, v, f"kvlane serves {name} with its own transports")
        else:
            raise InvalidArgument(
                f"create_backend({name!r}): unknown parameter {k!r}",
                hint="NIXL's UCX parameters: ucx_devices, device_list, num_workers, num_threads, "
                     "ucx_error_handling_mode, engine_config, split_batch_size, "
                     "ucx_num_device_channels; kvlane's own as '<backend>.<key>' (e.g. "
                     "'tcp.port')")
    return out


# ---- configuration ----------------------------------------------------------------------

class nixl_agent_config:
    """NIXL's agent configuration, NIXL 1.4's signature (positional and
    keyword); the older (enable_prog_thread, enable_listen_thread,
    listen_port, backends) order is also recognised. kvlane additions,
    keyword only: listen_host, timeout_ms, secret, notif_max_bytes,
    notif_max_msgs and notif_peer_percent (the bound of notifications
    received and not yet taken by get_new_notifs: default 64 MiB and 65536,
    one sending agent at most 50% of it; a sender past it gets
    kvlane.RemoteFull, a nixlBackendError). Unknown keywords raise
    TypeError, as in NIXL."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False,
                 listen_port=DEFAULT_COMM_PORT, capture_telemetry=False, num_threads=0,
                 backends=None, sync_mode=None, *, listen_host="0.0.0.0", timeout_ms=None,
                 secret=None, notif_max_bytes=None, notif_max_msgs=None,
                 notif_peer_percent=None):
        if isinstance(capture_telemetry, (list, tuple)):   # older positional order
            backends, capture_telemetry = capture_telemetry, False
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t (got "
                            f"{type(sync_mode).__name__!r})")
        if backends is None:
            backends = ["UCX"]
        if isinstance(backends, str) or not all(isinstance(b, str) for b in backends):
            raise TypeError(f"backends must be a list of backend names, got {backends!r}")
        if not isinstance(num_threads, int) or num_threads < 0:
            raise TypeError(f"num_threads must be a non-negative int, got {num_threads!r}")
        if isinstance(listen_port, bool) or not isinstance(listen_port, int) or \
                not 0 <= listen_port <= 65535:
            raise TypeError(f"listen_port must be an int in 0..65535, got {listen_port!r}")
        self.backends = list(backends)
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.sync_mode = sync_mode
        self.listen_host = listen_host
        self.timeout_ms = timeout_ms
        self.secret = secret
        self.notif_max_bytes = notif_max_bytes
        self.notif_max_msgs = notif_max_msgs
        self.notif_peer_percent = notif_peer_percent


# ---- descriptor lists ---------------------------------------------------------------------

class _DescList:
    __slots__ = ()

    def __len__(self):
        return self.descCount()

    def __bool__(self):
        # As NIXL's bound objects: a list is always truthy (NIXL signals bad
        # input with None; kvlane raises instead).
        return True

    def __iter__(self):
        return iter(self.descs())

    def getType(self):
        return _SEG[self.mem_type]

    def isEmpty(self):
        return self.descCount() == 0

    def print(self):
        print(repr(self))
        for d in self.descs():
            print("   ", d)


class nixlRegDList(_DescList):
    """Registration descriptors: (addr, len, dev, meta) entries; what
    register_memory returns. ``report`` is kvlane's RegistrationReport once
    registered. NIXL's constructors: (mem_type[, init_size]),
    (mem_type, (N, 3) array), (mem_type, [(addr, len, dev, meta), ...])."""

    __slots__ = ("mem_type", "_descs", "_rep", "__weakref__")

    def __init__(self, mem_type, descs=0):
        self.mem_type = _mem(mem_type)
        self._rep = None
        if type(descs) is list:     # engines' shape, first
            _check_width(descs, 4, "registration")
            self._descs = list(descs)
        elif isinstance(descs, int):
            self._descs = []
        else:
            self._descs = _reg_rows(descs)

    @property
    def report(self):
        """kvlane's RegistrationReport of the registration that returned
        this list (None before), read from the C report on first use."""
        r = self._rep
        if r is not None and not isinstance(r, RegistrationReport):
            r = self._rep = RegistrationReport._from_tuple(r)
        return r

    @report.setter
    def report(self, value):
        self._rep = value

    def descCount(self):
        return len(self._descs)

    def descs(self):
        return [(int(d[0]), int(d[1]), int(d[2])) for d in self._descs]

    def __getitem__(self, i):
        d = self._descs[i]
        meta = d[3] if len(d) > 3 else b""
        return (int(d[0]), int(d[1]), int(d[2]),
                meta.encode() if isinstance(meta, str) else bytes(meta))

    def __iter__(self):
        return (self[i] for i in range(len(self._descs)))

    def __eq__(self, other):
        return (isinstance(other, nixlRegDList) and self.mem_type == other.mem_type and
                self.descs() == other.descs())

    __hash__ = None

    def addDesc(self, desc):
        _check_width([desc], 4, "registration")
        if not isinstance(self._descs, list):
            self._descs = [tuple(int(v) for v in d[:3]) + ("",) for d in self._descs]
        self._descs.append(tuple(desc))

    append = addDesc

    def clear(self):
        self._descs = []

    def trim(self):
        """The transfer list of the same ranges (NIXL's trim())."""
        return _xfer_dlist(self.mem_type, self.descs())

    def __reduce__(self):
        return (nixlRegDList, (self.mem_type, [self[i] for i in range(len(self._descs))]))

    def __repr__(self):
        return f"<nixlRegDList {self.mem_type}: {len(self)} descs>"


class nixlXferDList(_DescList):
    """Transfer descriptors: (addr, len, dev) entries in a kvlane DList built
    in C. NIXL's constructors: (mem_type[, init_size]), (mem_type, (N, 3)
    array), (mem_type, [(addr, len, dev), ...])."""

    __slots__ = ("mem_type", "_descs", "report", "__weakref__")

    def __init__(self, mem_type, descs=0):
        self.mem_type = _mem(mem_type)
        self.report = None
        if isinstance(descs, DList):
            self._descs = descs
            return
        n = descs if isinstance(descs, int) else len(descs)
        self._descs = DList(self.mem_type, n)
        if not isinstance(descs, int):
            _add_xfer_rows(self._descs, descs, self.mem_type)

    @property
    def dlist(self):
        return self._descs

    def descCount(self):
        return len(self._descs)

    def descs(self):
        out = []
        for addr, stride, count, length, dev in self._descs.entries():
            out.extend((addr + i * stride, length, dev) for i in range(count))
        return out

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.descs()[i]
        n = len(self._descs)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("nixlXferDList index out of range")
        addr, _stride, count, length, dev = self._descs.get(i)
        if count != 1:          # only kvlane-built strided lists have these
            return self.descs()[i]
        return (addr, length, dev)

    def __eq__(self, other):
        return (isinstance(other, nixlXferDList) and self.mem_type == other.mem_type and
                self.descs() == other.descs())

    __hash__ = None

    def addDesc(self, desc):
        _check_width([desc], 3, "transfer")
        self._descs.add(int(desc[0]), int(desc[1]), _dev(self.mem_type, int(desc[2])))

    append = addDesc

    def clear(self):
        self._descs.clear()

    def __reduce__(self):
        return (_xfer_dlist, (self.mem_type, self.descs()))

    def __repr__(self):
        return f"<nixlXferDList {self.mem_type}: {len(self)} descs>"


nixl_reg_dlist = nixlRegDList
nixl_xfer_dlist = nixlXferDList


class _DescUnpickler(pickle.Unpickler):
    """deserialize_descs's unpickler. The bytes come from a peer over the
    network (vLLM, LMCache and Dynamo send descriptor lists so); pickle lets
    them name any importable callable, os.system included, and NIXL
    unpickles them as they are. kvlane lets them name only the
    constructors of its descriptor lists and what NumPy arrays are rebuilt
    with: a peer can send descriptors, not code."""

    _ALLOWED = frozenset({
        ("kvlane.nixl", "nixlRegDList"), ("kvlane.nixl", "_xfer_dlist"),
        # NumPy arrays and scalars (numpy 1.x and 2.x module names)
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
        # bytes in a protocol 2 pickle
        ("_codecs", "encode"),
    })

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"deserialize_descs: the bytes name {module}.{name}, which is not a descriptor "
            f"list: kvlane unpickles only descriptor lists (nixlXferDList, nixlRegDList), "
            f"lists, tuples, numbers, strings, bytes and NumPy arrays, never other objects; "
            f"were they written by get_serialized_descs?")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("deserialize_descs: the bytes hold a persistent id, "
                                     "which get_serialized_descs never writes")


def _dev(kind, dev):
    """DRAM device ids in NIXL descriptors are arbitrary (vLLM passes its TP
    rank, SGLang its GPU id); kvlane checks a DRAM device as a NUMA node, so
    they are replaced by "any"."""
    return -1 if kind == "DRAM" else dev


def _xfer_dlist(mem_type, descs):
    return nixlXferDList(mem_type, list(descs))


# Whether rows are what engines pass to register_memory: a list of exactly
# (int, int, int, str) tuples (the C module checks the address and length
# when it registers them). In C: a Python loop took ~0.1 ms for 1,000 rows.
_engine_rows = _kvlane.engine_rows


def _check_width(rows, width, what):
    """NIXL's tuple shapes: 3-tuples for transfers, 4-tuples for
    registrations (kvlane also takes 3-tuples there: the meta is empty)."""
    if width == 4 and _engine_rows(rows):
        return
    ok = (3, 4) if width == 4 else (3,)
    for i, t in enumerate(rows):
        if not isinstance(t, tuple):
            raise as_nixl(InvalidArgument(
                f"{what} descriptor {i}: a tuple is needed, got {type(t).__name__} {t!r}",
                hint="pass (addr, len, dev) tuples for transfers, (addr, len, dev, meta) for "
                     "registrations"), TypeError)
        if len(t) not in ok:
            raise InvalidArgument(
                f"{what} descriptor {i}: {len(t)}-tuple {t!r}; NIXL's {what} descriptors are "
                + ("(addr, len, dev, meta) 4-tuples" if width == 4 else
                   "(addr, len, dev) 3-tuples"))
        if width == 4:
            # what NIXL's binding takes: an int device, a str (or bytes) meta;
            # an int meta would otherwise become that many zero bytes
            try:
                operator.index(t[2])
            except TypeError:
                raise as_nixl(InvalidArgument(
                    f"{what} descriptor {i}: device {t[2]!r} is not an integer"),
                    TypeError) from None
            if len(t) == 4 and not isinstance(t[3], (str, bytes, bytearray)):
                raise as_nixl(InvalidArgument(
                    f"{what} descriptor {i}: meta {t[3]!r} is not a str or bytes",
                    hint="pass '' when there is nothing to say (NIXL's meta is a string)"),
                    TypeError)


def _array_rows(arr, what):
    """An (N, 3) integer array, checked as NIXL checks it."""
    import numpy as np
    a = np.asarray(arr)
    if a.ndim != 2 or a.shape[1] != 3:
        raise InvalidArgument(
            f"{what} descriptors from a NumPy array of shape {a.shape}: an (N, 3) array of "
            "(addr, len, dev) rows is needed",
            hint="a 1-D array is memory, not descriptors: register it as "
                 "[(a.ctypes.data, a.nbytes, 0, '')], or build rows with np.column_stack")
    if a.dtype not in (np.int64, np.uint64):
        raise InvalidArgument(f"{what} descriptors from a NumPy array of dtype {a.dtype}: "
                              "int64 or uint64 is needed (addresses do not fit in less)")
    return np.ascontiguousarray(a)


def _add_xfer_rows(dl, descs, kind):
    if _is_ndarray(descs):
        dl.add_descs(_array_rows(descs, "transfer"), -1 if kind == "DRAM" else None)
        return
    if not isinstance(descs, (list, tuple)):
        raise InvalidArgument(f"transfer descriptors: a list of (addr, len, dev) tuples or an "
                              f"(N, 3) array is needed, got {type(descs).__name__}")
    _check_width(descs, 3, "transfer")
    dl.add_descs(descs, -1 if kind == "DRAM" else None)


def _reg_rows(descs):
    if _is_ndarray(descs):
        return _array_rows(descs, "registration")
    if not isinstance(descs, (list, tuple)):
        raise InvalidArgument(f"registration descriptors: a list of (addr, len, dev, meta) "
                              f"tuples or an (N, 3) array is needed, got {type(descs).__name__}")
    _check_width(descs, 4, "registration")
    return list(descs)


def _is_tensor(x):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return True
    return callable(getattr(x, "data_ptr", None)) and hasattr(getattr(x, "device", None), "type")


def _is_ndarray(x):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def _tensor_rows(tensors, mem_type, what):
    """Rows and kind of one tensor or a list of tensors (one device)."""
    rows, device = [], None
    for i, t in enumerate(tensors):
        if not _is_tensor(t):
            raise InvalidArgument(f"{what}: item {i} is a {type(t).__name__}, not a tensor; a "
                                  "list must hold only tensors or only tuples")
        dev = t.device
        if device is None:
            device = dev
        elif dev != device:
            raise InvalidArgument(f"{what}: tensors on two devices ({device} and {dev} at item "
                                  f"{i}); one list describes one device",
                                  hint="make one descriptor list per device")
        addr, n, d, kind = memory_of(t)     # refuses non-contiguous tensors
        rows.append((addr, n, 0 if d < 0 else d))
    kind = "VRAM" if device is not None and device.type == "cuda" else "DRAM"
    if device is not None and device.type not in ("cuda", "cpu"):
        raise UnsupportedError(f"{what}: tensors on device type {device.type!r}: kvlane moves "
                               "cpu and cuda memory")
    want = _mem(mem_type)
    if want is not None and want != kind:
        raise InvalidArgument(f"{what}: mem_type {mem_type!r} but the tensors are on {device} "
                              f"({kind})", hint="omit mem_type for tensors, or pass the "
                              "matching one")
    return rows, kind


def _to_reg(descs, mem_type):
    if isinstance(descs, nixlRegDList):
        return descs
    if type(descs) is list and descs and type(descs[0]) is tuple and mem_type is not None:
        # tuples, as engines pass them: built without __init__ (a registration's
        # fixed cost) when the memory type is a name and the rows have NIXL's shape
        kind = _MEM_STR.get(mem_type) if type(mem_type) is str else None
        if kind is not None and _engine_rows(descs):
            d = _new_object(nixlRegDList)
            d.mem_type, d._rep, d._descs = kind, None, descs.copy()
            return d
        return nixlRegDList(mem_type, descs)
    if isinstance(descs, nixlXferDList):
        return nixlRegDList(descs.mem_type, descs.descs())
    if _is_tensor(descs):
        descs = [descs]
    if isinstance(descs, (list, tuple)) and descs and _is_tensor(descs[0]):
        rows, kind = _tensor_rows(descs, mem_type, "get_reg_descs")
        return nixlRegDList(kind, [r + ("",) for r in rows])
    if mem_type is None and not (isinstance(descs, (list, tuple)) and not descs):
        raise InvalidArgument("get_reg_descs: mem_type is needed for tuple or array "
                              "descriptors (NIXL needs it too)",
                              hint="pass 'DRAM' or 'VRAM' (or 'cpu' / 'cuda')")
    return nixlRegDList(mem_type or "DRAM", descs)


def _to_xfer(descs, mem_type):
    if isinstance(descs, nixlXferDList):
        return descs
    if isinstance(descs, nixlRegDList):
        return descs.trim()
    if _is_tensor(descs):
        descs = [descs]
    if isinstance(descs, (list, tuple)) and descs and _is_tensor(descs[0]):
        rows, kind = _tensor_rows(descs, mem_type, "get_xfer_descs")
        return nixlXferDList(kind, rows)
    if mem_type is None and not (isinstance(descs, (list, tuple)) and not descs):
        raise InvalidArgument("get_xfer_descs: mem_type is needed for tuple or array "
                              "descriptors (NIXL needs it too)",
                              hint="pass 'DRAM' or 'VRAM' (or 'cpu' / 'cuda')")
    return nixlXferDList(mem_type or "DRAM", descs)


# ---- handles and telemetry ------------------------------------------------------------------

_IDS = itertools.count(1)


class nixl_prepped_dlist_handle:
    """What prep_xfer_dlist returns; ``release()`` frees it (also on garbage
    collection). Truthy until released."""

    __slots__ = ("prep", "agent_name", "_handle", "__weakref__")

    def __init__(self, prep, agent_name):
        self.prep = prep
        self.agent_name = agent_name
        self._handle = next(_IDS)

    def release(self):
        self.prep.release()

    def __bool__(self):
        return bool(self.prep)

    def __len__(self):
        return len(self.prep)

    def __repr__(self):
        return (f"nixl_prepped_dlist_handle(0x{self._handle:x}, released={not self.prep}, "
                f"agent={self.agent_name or 'local'!r})")


class nixlXferTelemetry:
    """Telemetry of a transfer's last posting, NIXL's fields: startTime (µs
    since the epoch), postDuration and xferDuration (µs), totalBytes,
    descCount; kvlane adds backend, path and segments."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount",
                 "backend", "path", "segments")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k, "" if k in ("backend", "path") else 0))

    def __repr__(self):
        return ("nixlXferTelemetry(" +
                ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")")


nixl_xfer_telemetry = nixlXferTelemetry


class nixl_xfer_handle:
    """What make_prepped_xfer and initialize_xfer return; ``release()``
    frees it (also on garbage collection). Truthy until released.
    ``error`` keeps the kvlane exception of a failed transfer."""

    __slots__ = ("xfer", "_make", "notif", "start_us", "error", "_handle", "__weakref__")

    def __init__(self, xfer, make, notif):
        self.xfer = xfer
        self._make = make
        self.notif = notif
        self.start_us = 0
        self.error = None
        self._handle = next(_IDS)

    def release(self):
        self.xfer.release()

    def __bool__(self):
        return bool(self.xfer)

    def __repr__(self):
        return f"nixl_xfer_handle(0x{self._handle:x}, released={not self.xfer})"


# ---- the agent ------------------------------------------------------------------------------

_EMPTY = ()


class nixl_agent(_kvlane.NixlAgentBase):
    """NIXL's Python agent on kvlane (see the module docstring).
    register_memory, deregister_memory, transfer and check_xfer_state come
    from the C base class for the shapes engines pass; it calls the
    methods named _..._py below for every other call."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if nixl_conf is not None and instantiate_all:
            log.warning("Ignoring instantiate_all based on the provided config in agent "
                        "creation.")
            instantiate_all = False
        if nixl_conf is None:
            nixl_conf = nixl_agent_config()
        if not isinstance(nixl_conf, nixl_agent_config):
            raise TypeError(f"nixl_conf must be a nixl_agent_config, got "
                            f"{type(nixl_conf).__name__}")
        self.name = agent_name
        self.conf = nixl_conf
        self.notifs = {}
        self.backends = {}           # NIXL name -> tuple of kvlane backends
        self.backend_options = {}
        self.backend_mems = {}
        self._path_fds = {}          # path-mode FILE id -> descriptor kvlane opened
        self._telemetry = bool(nixl_conf.capture_telemetry) or \
            os.environ.get("NIXL_TELEMETRY_ENABLE", "").lower() in ("y", "yes", "1", "true",
                                                                    "on")
        self.plugin_list = self._plugins()
        self.plugin_b_options = {}
        self.plugin_mem_types = {}
        for p in self.plugin_list:
            self.plugin_b_options[p] = self._plugin_params(p)
            self.plugin_mem_types[p] = self._plugin_mems(p)
        workers = nixl_conf.num_threads or None
        if workers:
            workers = min(workers, os.cpu_count() or 1)
        self._workers = workers or 1
        self.agent = Agent(agent_name, backends=(), timeout_ms=nixl_conf.timeout_ms,
                           secret=nixl_conf.secret, workers=workers,
                           notif_max_bytes=getattr(nixl_conf, "notif_max_bytes", None),
                           notif_max_msgs=getattr(nixl_conf, "notif_max_msgs", None),
                           notif_peer_percent=getattr(nixl_conf, "notif_peer_percent", None))
        self.listen_address = None
        self._etcd = None            # NIXL_ETCD_ENDPOINTS when attached
        self._etcd_pending = set()   # names fetched from etcd in the background, not ended
        try:
            wanted = self.plugin_list if instantiate_all else list(nixl_conf.backends)
            for b in wanted:
                self._check_name(b)
                if b in STORAGE_NAMES and b not in FILE_NAMES:
                    log.warning("Skipping backend registration %s due to the missing plugin: "
                                "%s", b, _storage_why(b))
                    continue
                init = {}
                if nixl_conf.num_threads > 0 and b in TRANSPORT_NAMES:
                    init["num_cpus" if b == "UCCL" else "num_threads"] = str(nixl_conf.num_threads)
                self.create_backend(b, init)
            if nixl_conf.enable_listen:
                self.listen_address = self.agent.listen(nixl_conf.listen_host,
                                                        int(nixl_conf.port))
            eps = os.environ.get("NIXL_ETCD_ENDPOINTS", "").strip()
            if eps:
                # NIXL attaches to etcd when the variable is set; kvlane checks
                # that it answers (and authenticates) here, bounded, rather than
                # at the first publish.
                self.agent.etcd_attach(eps, prefix=os.environ.get("NIXL_ETCD_NAMESPACE") or None,
                                       lease_ttl_s=_env_int("KVL_ETCD_LEASE_TTL"),
                                       user=os.environ.get("KVL_ETCD_USER") or None,
                                       password=os.environ.get("KVL_ETCD_PASSWORD"),
                                       **_etcd_tls_env())
                self._etcd = eps
        except BaseException:
            self.agent.close()
            raise
        log.info("Initialized NIXL agent: %s (kvlane backends: %s)", agent_name,
                 ", ".join(self._members) or "none")

    # ---- plugins and backends ----
    @property
    def _members(self):
        """kvlane backends created on the agent, in order (read from the
        agent: code may replace nixl_agent.agent, as SGLang's HiCache does)."""
        return list(self.agent.backends())

    @staticmethod
    def _plugins():
        out = list(TRANSPORT_NAMES)
        for n in ("shm", "tcp", "cuda"):
            if _kvlane.backend_available(n)[0]:
                out.append(n.upper())
        if _kvlane.backend_available("posix")[0]:
            out.append("POSIX")   # GDS and GDS_MT are accepted by create_backend too
        if _kvlane.backend_available("ucx")[0]:
            out.append("ucx")
        return out

    @staticmethod
    def _plugin_params(p):
        if p == "UCX":
            return dict(_UCX_DEFAULTS)
        if p in TRANSPORT_NAMES:
            return {}
        try:
            return dict(_kvlane.backend_params(_FORCED[p]))
        except (Error, KeyError):
            return {}

    @staticmethod
    def _plugin_mems(p):
        if p in TRANSPORT_NAMES:
            return ["DRAM", "VRAM"]
        if p in FILE_NAMES:
            return ["DRAM", "VRAM", "FILE"]
        return list(_BACKEND_MEMS.get(_FORCED.get(p, ""), []))

    def _check_name(self, b):
        if not isinstance(b, str):
            raise InvalidArgument(f"backend names are strings, got {b!r}")
        if b in TRANSPORT_NAMES or b in STORAGE_NAMES or b in _FORCED:
            return
        raise InvalidArgument(
            f"unknown backend {b!r}",
            hint="NIXL transport names (" + ", ".join(TRANSPORT_NAMES) + ") create kvlane's "
                 "transport set; kvlane's own names (shm, tcp, ucx, cuda; SHM, TCP, CUDA) force "
                 "one backend; available here: " + ", ".join(self.plugin_list))

    def get_plugin_list(self):
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend):
        if backend not in self.plugin_mem_types:
            log.warning("Plugin %s is not available to get its supported mem types.", backend)
            return []
        return list(self.plugin_mem_types[backend])

    def get_plugin_params(self, backend):
        if backend not in self.plugin_b_options:
            log.warning("Plugin %s is not available to get its parameters.", backend)
            return {}
        return dict(self.plugin_b_options[backend])

    def get_backend_mem_types(self, backend):
        if backend not in self.backend_mems:
            log.warning("Backend %s not instantiated to get its supported mem types.", backend)
            return []
        return list(self.backend_mems[backend])

    def get_backend_params(self, backend):
        if backend not in self.backend_options:
            log.warning("Backend %s not instantiated to get its parameters.", backend)
            return {}
        return dict(self.backend_options[backend])

    def create_backend(self, backend, initParams=None):  # noqa: N803 (NIXL's name)
        self._check_name(backend)
        params = _str_params(initParams, backend)
        if backend in FILE_NAMES:
            params = self._file_params(backend, params)
        elif backend in STORAGE_NAMES:
            raise UnsupportedError(f"backend {backend!r}: {_storage_why(backend)}",
                                   hint="kvlane moves DRAM and VRAM between agents; keep a NIXL "
                                        "install for file and object storage for now")
        if backend in TRANSPORT_NAMES:
            members = transport_set()
            per = _ucx_set_params(backend, params, members, self._workers)
            created = []
            for m in members:
                if m in self._members:
                    if per[m]:
                        log.warning("kvlane.nixl: %s: kvlane's %s backend already exists on "
                                    "this agent; parameters %s not applied", backend, m, per[m])
                    created.append(m)
                    continue
                try:
                    self.agent.create_backend(m, per[m])
                except Error as e:
                    if m == "shm" or per[m]:
                        raise      # same-host path, or a parameter the user asked for
                    log.warning("kvlane.nixl: %s: kvlane's %s backend not created (transfers "
                                "use the others):\n%s", backend, m, e)
                    continue
                created.append(m)
            self.backends[backend] = tuple(created)
            opts = dict(self._plugin_params(backend))
            opts.update(params)
            self.backend_options[backend] = opts
            self.backend_mems[backend] = ["DRAM", "VRAM"]
            log.info("Backend %s was instantiated (kvlane: %s)", backend, ", ".join(created))
            return
        m = _FORCED[backend]
        if m not in self._members:
            self.agent.create_backend(m, params)
        elif params:
            log.warning("kvlane.nixl: kvlane's %s backend already exists on this agent; "
                        "parameters %s not applied", m, params)
        self.backends[backend] = (m,)
        opts = dict(self._plugin_params(backend))
        opts.update(params)
        self.backend_options[backend] = opts
        self.backend_mems[backend] = list(_BACKEND_MEMS[m])

    @staticmethod
    def _file_params(name, params):
        """NIXL POSIX/GDS/GDS_MT parameters -> kvlane posix parameters."""
        out = {}
        for k, v in params.items():
            key = k.split(".", 1)[1] if k.startswith("posix.") else k
            if key in _POSIX_PARAMS:
                out[key] = v
            elif key == "use_uring" and v.lower() in ("false", "0", "no"):
                out["engine"] = "threads"
            elif key in ("use_uring", "use_aio", "use_posix_aio"):
                _no_effect(name, k, v, "kvlane's posix backend runs on io_uring, or on "
                           "pread/pwrite threads when the kernel refuses io_uring")
            else:
                _no_effect(name, k, v, f"kvlane serves {name} with its posix backend (DRAM to "
                           "and from files); parameters it knows: engine, queue_depth, "
                           "threads, gds")
        if name != "POSIX":
            log.info("kvlane.nixl: %s is served by kvlane's posix backend: GPU memory moves "
                     "through cuFile (GPUDirect Storage) where libcufile works, else staged "
                     "through pinned host buffers; the registration report says which and why",
                     name)
        return out

    def _bk(self, backends, what):
        """kvlane backends for a NIXL backends argument: None for "any that
        fits" (nothing named, or every created backend named)."""
        if backends is None or (isinstance(backends, (list, tuple)) and not backends):
            return None
        if isinstance(backends, str):
            backends = [backends]
        if not isinstance(backends, (list, tuple)):
            raise InvalidArgument(
                f"{what}: backends must be a list of backend names, got {backends!r} (NIXL 1.x "
                "removed is_sorted, which came before backends in older releases)",
                hint="pass (list, mem_type, backends) or backends=[...]")
        out = []
        for b in backends:
            if b in self.backends:
                names = self.backends[b]
            elif _FORCED.get(b) in self._members:
                names = (_FORCED[b],)
            else:
                raise as_nixl(InvalidArgument(
                    f"{what}: backend {b!r} is not created on agent {self.name!r}",
                    hint="created: " + (", ".join(self.backends) or "none") +
                         "; create_backend(name) first"), KeyError)
            out.extend(n for n in names if n not in out)
        return None if set(out) >= set(self._members) else out

    def _one_bk(self, backends, what):
        bk = self._bk(backends, what)
        if bk is None:
            return None
        if len(bk) == 1:
            return bk[0]
        raise UnsupportedError(f"{what}: backends={backends!r} names {len(bk)} of kvlane's "
                               f"backends ({', '.join(bk)}) but not all of them",
                               hint="name one backend to force it, or none to let kvlane pick "
                                    "the fastest that reaches both sides")

    # ---- descriptor lists ----
    def get_reg_descs(self, descs, mem_type=None, *, is_sorted=False):
        return _to_reg(descs, mem_type)

    def get_xfer_descs(self, descs, mem_type=None, *, is_sorted=False):
        return _to_xfer(descs, mem_type)

    def get_serialized_descs(self, descs):
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs):
        """NIXL's: the pickle get_serialized_descs wrote (engines send it to
        the peer). Unpickled by _DescUnpickler: only descriptor lists, lists,
        tuples, numbers, strings, bytes and NumPy arrays, never an object
        that names other code to run (pickle.UnpicklingError, naming it)."""
        if not isinstance(serialized_descs, (bytes, bytearray, memoryview)):
            raise TypeError(f"deserialize_descs: expects the bytes get_serialized_descs "
                            f"returned, got {type(serialized_descs).__name__}")
        return _DescUnpickler(io.BytesIO(serialized_descs)).load()

    # ---- memory ----
    def _register_memory_py(self, reg_list, mem_type=None, backends=_EMPTY, *, is_sorted=False):
        descs = reg_list if type(reg_list) is nixlRegDList else _to_reg(reg_list, mem_type)
        bk = None if backends is _EMPTY else self._bk(backends, "register_memory")
        rows = descs._descs
        if not rows:
            return descs
        kind, opened = descs.mem_type, ()
        if kind == "FILE":
            rows, opened = self._file_rows(descs)
        try:
            # a RegistrationReport on first use of descs.report; NIXL's DRAM
            # device id is no NUMA node
            descs._rep = self.agent._register(rows, kind, bk, False,
                                              -1 if kind == "DRAM" else None)
        except Error as e:
            self._file_close(opened)
            raise as_nixl(e, nixlBackendError) from None
        for dev_id, fd in opened:
            self._path_fds[dev_id] = fd
        return descs

    def _deregister_memory_py(self, dereg_list, backends=_EMPTY):
        descs = dereg_list if type(dereg_list) is nixlRegDList else _to_reg(dereg_list, None)
        if backends is not _EMPTY:
            self._bk(backends, "deregister_memory")
        if not descs._descs:
            return
        rows, closing = descs._descs, []
        if descs.mem_type == "FILE" and self._path_fds:
            rows = []
            for d in descs._descs:
                fd = self._path_fds.get(int(d[2])) if _path_spec(d) else None
                if fd is not None:
                    closing.append(int(d[2]))
                rows.append((int(d[0]), int(d[1]), int(d[2]) if fd is None else fd))
        try:
            self.agent._deregister(rows, -1 if descs.mem_type == "DRAM" else None)
        except Error as e:
            raise as_nixl(e, nixlBackendError) from None
        if closing:
            self._file_close([(i, self._path_fds.pop(i)) for i in closing
                              if i in self._path_fds])

    # ---- FILE registrations ----
    def _file_rows(self, descs):
        """(offset, len, fd, meta) rows as kvlane registers them. NIXL's path
        mode (meta "<flags>:<path>", flags from ro, rw, create, direct; the
        third field an id the caller picks): kvlane opens the file, the id
        stands for its descriptor in later lists, deregistration closes it.
        Otherwise the third field is the caller's open descriptor."""
        rows, opened = [], []
        try:
            for i, d in enumerate(descs._descs):
                spec = _path_spec(d)
                if spec is None:
                    rows.append(tuple(d))
                    continue
                flags, path = spec
                dev_id = int(d[2])
                if dev_id in self._path_fds or any(o[0] == dev_id for o in opened):
                    raise InvalidArgument(
                        f"register_memory: FILE descriptor {i} names id {dev_id} for {path!r}, "
                        "which a path-mode registration of this agent already uses",
                        hint="give every path-mode FILE registration its own id (as SGLang's "
                             "HiCache does), or deregister the old one first")
                fd = _open_spec(flags, path, i)
                opened.append((dev_id, fd))
                rows.append((int(d[0]), int(d[1]), fd, path))
        except BaseException:
            self._file_close(opened)
            raise
        return rows, opened

    @staticmethod
    def _file_close(pairs):
        for _dev_id, fd in pairs:
            try:
                os.close(fd)
            except OSError:
                pass

    def _file_list(self, descs):
        """A FILE transfer list whose ids name path-mode registrations, with
        the descriptors kvlane opened for them."""
        if descs.mem_type != "FILE" or not self._path_fds:
            return descs
        rows = descs.descs()
        if not any(r[2] in self._path_fds for r in rows):
            return descs
        return nixlXferDList("FILE", [(a, n, self._path_fds.get(d, d)) for a, n, d in rows])

    def query_memory(self, reg_list, backend, mem_type=None):
        """For each range: None unless one registered region holds all of it
        on one of the backend's kvlane backends, else a dict of str: kind,
        dev, backends, region_addr, region_len."""
        descs = self.get_reg_descs(reg_list, mem_type)
        if backend not in self.backends:
            raise ValueError(f"Backend '{backend}' not found. Available backends: "
                             f"{list(self.backends.keys())}")
        if descs.mem_type == "FILE":
            return [_file_info(d) for d in descs._descs]
        members = set(self.backends[backend])
        out = []
        for addr, length, _dev in descs.descs():
            found = self.agent.query_range(addr, length) if length else None
            if found is None:
                out.append(None)
                continue
            kind, dev, raddr, rlen, names = found
            names = [n for n in names if n in members]
            out.append(None if not names else {
                "kind": kind, "dev": str(dev), "backends": ",".join(names),
                "region_addr": str(raddr), "region_len": str(rlen)})
        return out

    # ---- metadata ----
    def get_agent_metadata(self):
        return self.agent.get_metadata()

    def get_partial_agent_metadata(self, descs=None, inc_conn_info=False, backends=_EMPTY):
        """Partial metadata, as NIXL's getLocalPartialMD: no descriptors,
        connection info only (of every backend or of ``backends``); else the
        registered regions the descriptors lie in, with connection info only
        when inc_conn_info. A descriptor outside registered memory is refused
        (nixlNotFoundError), never dropped."""
        return self._partial_md(descs, inc_conn_info, backends, "get_partial_agent_metadata")

    def _partial_md(self, descs, inc_conn_info, backends, what):
        bk = self._bk(backends, what)
        d = None
        if descs is not None and not (isinstance(descs, (list, tuple)) and not descs):
            d = self.get_xfer_descs(descs, None if isinstance(
                descs, (nixlRegDList, nixlXferDList)) else "DRAM")
            d = d.dlist if d.descCount() else None
        try:
            return self.agent.get_partial_metadata(d, bool(inc_conn_info), bk)
        except Error as e:
            raise as_nixl(e, nixlNotFoundError) from None

    def add_remote_agent(self, metadata):
        return self.agent.load_metadata(metadata).encode()

    def remove_remote_agent(self, agent):
        self.agent.remove_remote(_name(agent))

    def check_remote_metadata(self, agent, descs=None):
        name = _name(agent)
        if name in self._etcd_pending:
            try:
                if self.agent.etcd_fetch_status(name):
                    self._etcd_pending.discard(name)
            except StateError:
                self._etcd_pending.discard(name)   # its result was forgotten (4096 newer)
            except Error as e:
                self._etcd_pending.discard(name)
                _fetch_failed(name, e)
        if not self.agent.check_remote(name):
            return False
        if descs is None:
            return True
        d = self.get_xfer_descs(descs)
        if d.descCount() == 0:
            return True
        try:
            self.agent.prep_remote(name, d.dlist).release()
        except Error:
            return False
        return True

    def make_connection(self, remote_agent, backends=_EMPTY):
        self._bk(backends, "make_connection")
        name = _name(remote_agent)
        if not self.agent.check_remote(name):
            raise _not_loaded(name)

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        if not ip_addr:
            if not self._etcd:
                raise _no_central_store()
            self.agent.etcd_publish()
            return
        self.agent.push_metadata(f"{ip_addr}:{port}")

    def send_partial_agent_metadata(self, descs=None, inc_conn_info=False, backends=_EMPTY,
                                    ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        """Partial metadata (get_partial_agent_metadata) to the listener at
        ip_addr, or into etcd under ``label`` (required there; the default
        label keeps the full metadata). The peer merges it."""
        if not ip_addr:
            if not self._etcd:
                raise _no_central_store()
            if not label:
                raise InvalidArgument("send_partial_agent_metadata: a metadata label is "
                                      "required to publish partial metadata in etcd",
                                      hint="pass label=..., as NIXL requires")
        blob = self._partial_md(descs, inc_conn_info, backends, "send_partial_agent_metadata")
        if not ip_addr:
            self.agent.etcd_publish(label, blob)
            return
        self.agent.push_partial_metadata(f"{ip_addr}:{port}", blob)

    def fetch_remote_metadata(self, remote_agent, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        if not ip_addr:
            if not self._etcd:
                raise _no_central_store()
            # As NIXL: asynchronous (the agent's background fetch
            # threads); check_remote_metadata(name) turns True once loaded
            # (waiting up to 5 s for the peer to publish). A failure is
            # logged, by kvlane and by check_remote_metadata.
            name = _name(remote_agent)
            try:
                self.agent.etcd_fetch_async(name, label or None, wait_ms=_ETCD_WATCH_MS)
            except Error as e:
                _fetch_failed(name, e)
                return None
            self._etcd_pending.add(name)
            return None
        got = self.agent.fetch_metadata(f"{ip_addr}:{port}")
        want = _name(remote_agent)
        if want and got != want:
            self.agent.remove_remote(got)
            raise as_nixl(NotFound(f"{ip_addr}:{port} serves agent {got!r}, not {want!r}; "
                                   "nothing was loaded",
                                   hint="check the address, or pass the name it serves"),
                          nixlNotFoundError)
        return got

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        if not ip_addr and self._etcd:
            self.agent.etcd_unpublish()
            return
        self.agent.invalidate_metadata(f"{ip_addr}:{port}" if ip_addr else None)

    # ---- transfers ----
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=_EMPTY, *,
                        is_sorted=False):
        descs = self._file_list(self.get_xfer_descs(xfer_list, mem_type))
        self._bk(backends, "prep_xfer_dlist")
        name = _name(agent_name)
        if name in ("", NIXL_INIT_AGENT):
            return nixl_prepped_dlist_handle(self.agent.prep_local(descs.dlist), None)
        if descs.mem_type == "FILE" and name == self.name:
            # files are this agent's own: kvlane needs no loopback metadata
            return nixl_prepped_dlist_handle(self.agent.prep_remote(name, descs.dlist), name)
        if name == self.name and not self.agent.check_remote(name):
            self.agent.load_metadata(self.agent.get_metadata())   # loopback
        return nixl_prepped_dlist_handle(self.agent.prep_remote(name, descs.dlist), name)

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side,
                          remote_indices, notif_msg=b"", backends=_EMPTY, skip_desc_merge=False):
        op = _op(operation)
        lp, rp = _prep(local_xfer_side), _prep(remote_xfer_side)
        for what, idx in (("local_indices", local_indices), ("remote_indices", remote_indices)):
            if idx is None:   # kvlane's own xfer_prepped reads None as 0..n-1; NIXL refuses it
                raise TypeError(f"make_prepped_xfer: {what} is None: a list or 1-D NumPy "
                                f"array of indices into the prepared list is needed")
        backend = self._one_bk(backends, "make_prepped_xfer")

        def make(notif):
            return self.agent.create_xfer_prepped(op, lp, local_indices, rp, remote_indices,
                                                  notif, backend)
        notif = _msg(notif_msg)
        return nixl_xfer_handle(make(notif), make, notif)

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent,
                        notif_msg=b"", backends=_EMPTY):
        op = _op(operation)
        local = self.get_xfer_descs(local_descs)
        remote = self._file_list(self.get_xfer_descs(remote_descs))
        name = _name(remote_agent)
        if name == self.name and remote.mem_type != "FILE" and not self.agent.check_remote(name):
            self.agent.load_metadata(self.agent.get_metadata())   # loopback
        backend = self._one_bk(backends, "initialize_xfer")

        def make(notif):
            return self.agent.create_xfer(op, local.dlist, name, remote.dlist, notif, backend)
        notif = _msg(notif_msg)
        return nixl_xfer_handle(make(notif), make, notif)

    def estimate_xfer_cost(self, req_handle):
        _xh(req_handle)
        raise UnsupportedError("estimate_xfer_cost: kvlane does not estimate transfer costs",
                               hint="time transfers with get_xfer_telemetry, or `kvlane bench`")

    def _transfer_py(self, handle, notif_msg=b""):
        h = handle if type(handle) is nixl_xfer_handle else _xh(handle)
        notif = (None if notif_msg is None or (type(notif_msg) is bytes and not notif_msg)
                 else _msg(notif_msg))
        if notif is not None and notif != h.notif:
            if h.xfer and h.xfer.state == "POSTED":
                raise as_nixl(StateError("transfer: the handle is still in progress; a new "
                                         "notification cannot replace its message now",
                                         hint="wait for DONE, then post again"),
                              nixlRepostActiveError)
            # NIXL lets a posting replace the message: rebuild with it.
            old = h.xfer
            h.xfer = h._make(notif)
            h.notif = notif
            old.release()
        h.start_us = _time_ns() // 1000
        h.error = None
        try:
            return "DONE" if h.xfer.post() else "PROC"
        except Exception as e:
            _xfer_failed(h, e, True)

    def _check_xfer_state_py(self, handle):
        h = handle if type(handle) is nixl_xfer_handle else _xh(handle)
        try:
            return "DONE" if h.xfer.test() else "PROC"
        except Exception as e:
            _xfer_failed(h, e, False)

    def query_xfer_backend(self, handle):
        """The kvlane backend that moved (or moves) the transfer, upper case
        ("SHM", "CUDA", "TCP", "UCX")."""
        return _xh(handle).xfer.stats()["backend"].upper()

    def get_xfer_telemetry(self, handle):
        h = _xh(handle)
        if not self._telemetry:
            raise as_nixl(StateError(
                "get_xfer_telemetry: telemetry is off for this agent",
                hint="nixl_agent_config(capture_telemetry=True) or NIXL_TELEMETRY_ENABLE=y, as "
                     "in NIXL"), nixlNoTelemetryError)
        s = h.xfer.stats()
        return nixlXferTelemetry(
            startTime=h.start_us, postDuration=s["post_ns"] // 1000,
            xferDuration=s["duration_ns"] // 1000, totalBytes=s["bytes"],
            descCount=s["blocks"], backend=s["backend"].upper(), path=s["path"],
            segments=s["segments"])

    def release_xfer_handle(self, handle):
        _xh(handle).release()

    def release_dlist_handle(self, handle):
        _prep(handle).release()

    # ---- notifications ----
    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        if backend is not None:
            self._bk([backend], "send_notif")
        msg = notif_msg.encode() if isinstance(notif_msg, str) else notif_msg
        self.agent.send_notif(_name(remote_agent_name), msg)

    def get_new_notifs(self, backends=_EMPTY):
        out = {}
        for sender, msg in self.agent.poll_notifs():
            out.setdefault(sender, []).append(msg)
        return out

    def update_notifs(self, backends=_EMPTY):
        for sender, msgs in self.get_new_notifs().items():
            self.notifs.setdefault(sender, []).extend(msgs)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag, backends=_EMPTY,
                               tag_is_prefix=True):
        if not isinstance(lookup_tag, (str, bytes, bytearray)):
            raise TypeError(f"check_remote_xfer_done: lookup_tag must be bytes or str, got "
                            f"{type(lookup_tag).__name__}")
        self.update_notifs()
        name = _name(remote_agent_name)
        tag = lookup_tag.encode() if isinstance(lookup_tag, str) else bytes(lookup_tag)
        msgs = self.notifs.get(name, [])
        for i, m in enumerate(msgs):
            if (tag_is_prefix and m.startswith(tag)) or (not tag_is_prefix and tag in m):
                del msgs[i]
                return True
        return False

    # ---- kvlane additions ----
    def close(self):
        """Destroy the agent now (also done at interpreter exit); files that
        path-mode registrations opened are closed after it."""
        self.agent.close()
        self._etcd_pending.clear()
        self._file_close(list(self._path_fds.items()))
        self._path_fds.clear()


_PATH_FLAGS = {"ro", "rw", "create", "direct"}


def _path_spec(row):
    """(flags, path) of a path-mode FILE registration's meta, else None."""
    meta = row[3] if len(row) > 3 else ""
    if isinstance(meta, (bytes, bytearray)):
        meta = bytes(meta).decode(errors="replace")
    if not isinstance(meta, str) or ":" not in meta:
        return None
    head, path = meta.split(":", 1)
    flags = [f.strip() for f in head.split(",") if f.strip()]
    if not flags or not path or not set(flags) <= _PATH_FLAGS:
        return None
    return flags, path


def _open_spec(flags, path, i):
    if "ro" in flags and ("rw" in flags or "create" in flags):
        raise InvalidArgument(f"register_memory: FILE descriptor {i}: path-mode flags "
                              f"{','.join(flags)} for {path!r} ask for read-only and for writing",
                              hint="use ro, or rw[,create]")
    mode = os.O_RDONLY if "ro" in flags else os.O_RDWR
    if "create" in flags:
        mode |= os.O_CREAT
    if "direct" in flags:
        mode |= getattr(os, "O_DIRECT", 0)
    try:
        if "create" in flags and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, mode, 0o644)
    except OSError as e:
        why = ("the file system refuses O_DIRECT: drop the direct flag" if e.errno == 22 and
               "direct" in flags else
               "create it first, or add the create flag" if e.errno == 2 else
               "check the path, its permissions and that the file system is writable")
        raise as_nixl(InvalidArgument(f"register_memory: FILE descriptor {i}: cannot open "
                                      f"{path!r} ({','.join(flags)}): {e.strerror}", hint=why),
                      nixlBackendError) from None


def _file_info(row):
    """query_memory of one FILE descriptor: by path (its meta), else by fd;
    None when there is no such file."""
    meta = row[3] if len(row) > 3 else ""
    if isinstance(meta, (bytes, bytearray)):
        meta = bytes(meta).decode(errors="replace")
    spec = _path_spec(row)
    path = spec[1] if spec else meta
    try:
        st = os.stat(path) if path else os.fstat(int(row[2]))
    except (OSError, ValueError):
        return None
    return {"size": str(st.st_size), "mode": str(st.st_mode), "mtime": str(int(st.st_mtime))}


def _storage_why(b):
    return (f"NIXL's {b} storage plugin has no kvlane counterpart in this version (FILE and "
            "OBJ memory are not served)")


def _name(name):
    """Agent names arrive as str or as the bytes add_remote_agent returned."""
    if isinstance(name, (bytes, bytearray, memoryview)):
        return bytes(name).decode()
    return name


def _msg(msg):
    if msg is None:
        return None
    if isinstance(msg, str):
        msg = msg.encode()
    if not isinstance(msg, (bytes, bytearray, memoryview)):
        raise TypeError(f"notif_msg must be bytes or str, got {type(msg).__name__} {msg!r:.60}")
    return bytes(msg) if len(msg) else None


def _op(operation):
    if operation not in ("READ", "WRITE", nixl_xfer_op_t.NIXL_READ, nixl_xfer_op_t.NIXL_WRITE):
        raise InvalidArgument(f"operation must be \"READ\" or \"WRITE\", got {operation!r}")
    if isinstance(operation, nixl_xfer_op_t):
        return "READ" if operation == nixl_xfer_op_t.NIXL_READ else "WRITE"
    return operation


def _prep(h):
    if isinstance(h, nixl_prepped_dlist_handle):
        return h.prep
    if isinstance(h, _kvlane.Prep):
        return h
    raise InvalidArgument(f"a handle from prep_xfer_dlist is needed, got {h!r}")


def _xfer_failed(h, e, posting):
    """Raise what transfer (posting) or check_xfer_state raises for e, the
    exception of h's post or test: NIXL's class for a re-post of an active
    handle or a test of one never posted; h.error keeps any other kvlane
    error. Also called by NixlAgentBase's C methods."""
    if isinstance(e, StateError):
        if h.xfer and h.xfer.state == ("POSTED" if posting else "IDLE"):
            raise as_nixl(e, nixlRepostActiveError if posting else nixlNotPostedError) from None
    elif isinstance(e, Error):
        h.error = e
    raise e


def _xh(h):
    if isinstance(h, nixl_xfer_handle):
        return h
    raise InvalidArgument(f"a handle from make_prepped_xfer or initialize_xfer is needed, "
                          f"got {h!r}")


def _not_loaded(name):
    return NotFound(f"remote agent {name!r} is not loaded",
                    hint="add_remote_agent(metadata) or fetch_remote_metadata(name, ip, port) "
                         "first")


# How long a fetch without ip_addr waits for the peer to publish (NIXL's
# etcdWatchTimeout default, 5 s).
_ETCD_WATCH_MS = 5000


def _fetch_failed(name, e):
    log.error("Failed to fetch metadata from etcd for agent %s: %s", name, e)


def _env_int(var):
    v = os.environ.get(var, "").strip()
    if not v:
        return 0
    if not v.isdigit():
        raise InvalidArgument(f"{var}={v!r} is not a number of seconds")
    return int(v)


def _etcd_tls_env():
    """etcd TLS files from the environment (NIXL defines no variables for
    them): KVL_ETCD_CACERT, KVL_ETCD_CERT, KVL_ETCD_KEY, else etcdctl's
    ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY; KVL_ETCD_TLS_VERIFY_NAME=0
    skips the host name check. See docs/etcd.md."""
    def pick(ours, etcdctl):
        return (os.environ.get(ours, "").strip() or os.environ.get(etcdctl, "").strip()
                or None)
    out = {"cacert": pick("KVL_ETCD_CACERT", "ETCDCTL_CACERT"),
           "cert": pick("KVL_ETCD_CERT", "ETCDCTL_CERT"),
           "key": pick("KVL_ETCD_KEY", "ETCDCTL_KEY")}
    v = os.environ.get("KVL_ETCD_TLS_VERIFY_NAME", "").strip().lower()
    if v:
        if v not in ("0", "1", "false", "true", "no", "yes"):
            raise InvalidArgument(f"KVL_ETCD_TLS_VERIFY_NAME={v!r} is not 0 or 1")
        out["verify_name"] = v in ("1", "true", "yes")
    return out


def _no_central_store():
    etcd = os.environ.get("NIXL_ETCD_ENDPOINTS")
    what = ("kvlane.nixl agent has no central metadata store: ip_addr is required" +
            (f" (NIXL_ETCD_ENDPOINTS={etcd} was set after the agent was created)"
             if etcd else ""))
    return UnsupportedError(what, hint="set NIXL_ETCD_ENDPOINTS before creating the nixl_agent, "
                                       "pass the peer listener's ip_addr and port, or exchange "
                                       "get_agent_metadata() bytes yourself")


# nixl_agent's C base (register_memory, deregister_memory, transfer,
# check_xfer_state) reads these: the list and handle classes, the memory
# type names, how a failed registration becomes a nixlBackendError, what a
# failed post or test raises, and the "left out" sentinel.
_kvlane._nixl_bind(nixlRegDList, nixl_xfer_handle, _MEM_STR,
                   lambda e: as_nixl(e, nixlBackendError), _xfer_failed, Error, _EMPTY)
