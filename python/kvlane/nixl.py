"""NIXL-compatible agent on kvlane: change the import, keep the connector.

    # from nixl._api import nixl_agent, nixl_agent_config
    from kvlane.nixl import nixl_agent, nixl_agent_config

Method names, argument orders and return conventions follow NIXL's Python
agent (nixl._api) for what vLLM's and SGLang's KV connectors use. Every
difference is listed in docs/python.md ("kvlane.nixl: differences from
NIXL").
"""

import logging
import pickle
import sys
import time
import warnings

from . import _kvlane
from ._agent import Agent, DList, RegistrationReport, memory_of
from .errors import Error, UsageError, UnsupportedError, InvalidArgument

__all__ = ["nixl_agent", "nixl_agent_config", "nixl_reg_dlist", "nixl_xfer_dlist",
           "nixl_prepped_dlist_handle", "nixl_xfer_handle", "nixl_xfer_telemetry",
           "nixlRegDList", "nixlXferDList", "DEFAULT_COMM_PORT", "NIXL_INIT_AGENT"]

log = logging.getLogger("kvlane.nixl")

DEFAULT_COMM_PORT = 8888
NIXL_INIT_AGENT = "NIXL_INIT_AGENT"

_MEM = {"DRAM": "DRAM", "VRAM": "VRAM", "FILE": "FILE", "cpu": "DRAM", "cuda": "VRAM",
        "dram": "DRAM", "vram": "VRAM", "file": "FILE"}

# Memory kinds each kvlane backend serves (for get_plugin_mem_types).
_BACKEND_MEMS = {"shm": ["DRAM"], "tcp": ["DRAM", "VRAM"], "ucx": ["DRAM", "VRAM"],
                 "cuda": ["VRAM", "DRAM"], "file": ["FILE", "DRAM", "VRAM"]}


def _mem(mem_type):
    if mem_type is None:
        return None
    try:
        return _MEM[mem_type]
    except (KeyError, TypeError):
        raise UnsupportedError(f"memory type {mem_type!r}: kvlane serves DRAM, VRAM and FILE "
                               "('cpu' and 'cuda' are accepted as in NIXL)") from None


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
    return msg if len(msg) else None


def _is_tensor(x):
    return callable(getattr(x, "data_ptr", None)) and hasattr(x, "device")


def _is_ndarray2d(x):
    ai = getattr(x, "__array_interface__", None)
    return ai is not None and len(ai.get("shape", ())) == 2


class nixl_agent_config:
    """NIXL's agent configuration. Accepted in NIXL's orders
    (enable_prog_thread, enable_listen_thread, listen_port, capture_telemetry,
    num_threads, backends) and the older (..., listen_port, backends).
    kvlane additions (keyword only): listen_host, timeout_ms, secret."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=0,
                 capture_telemetry=False, num_threads=0, backends=None, *,
                 listen_host="0.0.0.0", timeout_ms=None, secret=None, **_ignored):
        if isinstance(capture_telemetry, (list, tuple)):   # older positional order
            backends, capture_telemetry = capture_telemetry, False
        self.backends = list(backends) if backends is not None else ["UCX"]
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.listen_host = listen_host
        self.timeout_ms = timeout_ms
        self.secret = secret


class _DescList:
    __slots__ = ("mem_type", "_descs", "report")

    def __len__(self):
        return self.descCount()

    def getType(self):
        return self.mem_type

    def isEmpty(self):
        return self.descCount() == 0


class nixl_reg_dlist(_DescList):
    """Registration descriptors: what register_memory returns. Falsy when
    empty. ``report`` is kvlane's RegistrationReport once registered."""

    def __init__(self, mem_type, regions):
        self.mem_type = mem_type
        self._descs = regions          # list of (addr, len, dev) or an (N, 3) array
        self.report = None

    def descCount(self):
        return len(self._descs)

    def descs(self):
        return [tuple(int(v) for v in d[:3]) for d in self._descs]

    def __reduce__(self):
        return (nixl_reg_dlist, (self.mem_type, self.descs()))

    def __repr__(self):
        return f"<nixl_reg_dlist {self.mem_type}: {len(self)} descs>"


class nixl_xfer_dlist(_DescList):
    """Transfer descriptors: a kvlane DList built in C. Falsy when empty."""

    def __init__(self, mem_type, dlist):
        self.mem_type = mem_type
        self._descs = dlist
        self.report = None

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

    def __reduce__(self):
        return (_xfer_dlist_from, (self.mem_type, self.descs()))

    def __repr__(self):
        return f"<nixl_xfer_dlist {self.mem_type}: {len(self)} descs>"


def _xfer_dlist_from(mem_type, descs):
    dl = DList(mem_type, len(descs))
    dl.add_descs(descs, -1 if mem_type == "DRAM" else None)
    return nixl_xfer_dlist(mem_type, dl)


nixlRegDList = nixl_reg_dlist
nixlXferDList = nixl_xfer_dlist


class nixl_prepped_dlist_handle:
    """What prep_xfer_dlist returns; truthy until released."""

    __slots__ = ("prep", "agent_name", "__weakref__")

    def __init__(self, prep, agent_name):
        self.prep = prep
        self.agent_name = agent_name

    def __bool__(self):
        return bool(self.prep)

    def __len__(self):
        return len(self.prep)

    def __repr__(self):
        return f"<nixl_prepped_dlist_handle {self.agent_name or 'local'}: {len(self)} descs>"


class nixl_xfer_telemetry:
    """Telemetry of a transfer's last posting, with NIXL's field names:
    startTime (µs since the epoch), postDuration and xferDuration (µs),
    totalBytes, descCount; kvlane adds backend, path and segments."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount",
                 "backend", "path", "segments")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k, 0))

    def __repr__(self):
        return ("nixl_xfer_telemetry(" +
                ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")")


class nixl_xfer_handle:
    """What make_prepped_xfer and initialize_xfer return; truthy until
    released. ``error`` holds the kvlane exception when a state was "ERR"."""

    __slots__ = ("xfer", "_make", "notif", "start_us", "error", "__weakref__")

    def __init__(self, xfer, make, notif):
        self.xfer = xfer
        self._make = make
        self.notif = notif
        self.start_us = 0
        self.error = None

    def __bool__(self):
        return bool(self.xfer)

    def __repr__(self):
        return f"<nixl_xfer_handle {self.xfer!r}>"


class nixl_agent:
    """NIXL's Python agent on kvlane (see the module docstring)."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if nixl_conf is not None and instantiate_all:
            instantiate_all = False
        if nixl_conf is None:
            nixl_conf = nixl_agent_config()
        self.name = agent_name
        self.conf = nixl_conf
        self.notifs = {}
        self.backends = {}
        self.backend_options = {}
        self.backend_mems = {}
        self.plugin_list = [n.upper() for n in _kvlane.backend_names()
                            if _kvlane.backend_available(n)[0]]
        self.plugin_b_options = {}
        self.plugin_mem_types = {}
        for p in self.plugin_list:
            try:
                self.plugin_b_options[p] = _kvlane.backend_params(p.lower())
            except Error:
                self.plugin_b_options[p] = {}
            self.plugin_mem_types[p] = list(_BACKEND_MEMS.get(p.lower(), ["DRAM"]))
        self.agent = Agent(agent_name, backends=(), timeout_ms=nixl_conf.timeout_ms,
                           secret=nixl_conf.secret)
        self.listen_address = None
        try:
            wanted = self.plugin_list if instantiate_all else self._wanted(nixl_conf.backends)
            for b in wanted:
                try:
                    self.create_backend(b)
                except Error as e:
                    log.warning("kvlane.nixl: backend %s not created:\n%s", b, e)
            if not self.backends:
                raise UnsupportedError(
                    "no backend could be created for agent " + agent_name,
                    hint="run `kvlane doctor` to see why each backend is unavailable")
            if nixl_conf.enable_listen:
                self.listen_address = self.agent.listen(nixl_conf.listen_host,
                                                        int(nixl_conf.port))
        except BaseException:
            self.agent.close()
            raise

    def _wanted(self, requested):
        """kvlane backends for NIXL's backend list: each known one, plus shm
        (same host) always and tcp (any host) when a requested one is missing."""
        out = ["SHM"]
        missing = False
        for b in requested:
            u = str(b).upper()
            if u in self.plugin_list:
                if u not in out:
                    out.append(u)
            else:
                missing = True
                log.info("kvlane.nixl: backend %s is not available in kvlane; using "
                         "kvlane's own backends instead", b)
        if missing and "TCP" in self.plugin_list and "TCP" not in out:
            out.append("TCP")
        return out

    def _bk(self, backends):
        """kvlane backend names for a NIXL backends argument (created ones only)."""
        if not backends:
            return None
        if isinstance(backends, str):
            backends = [backends]
        names = [str(b).lower() for b in backends if str(b).upper() in self.backends]
        return names or None

    # ---- plugins and backends ----
    def get_plugin_list(self):
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend):
        return list(self.plugin_mem_types.get(str(backend).upper(), []))

    def get_plugin_params(self, backend):
        return dict(self.plugin_b_options.get(str(backend).upper(), {}))

    def get_backend_mem_types(self, backend):
        return list(self.backend_mems.get(str(backend).upper(), []))

    def get_backend_params(self, backend):
        return dict(self.backend_options.get(str(backend).upper(), {}))

    def create_backend(self, backend, initParams=None):
        u = str(backend).upper()
        params = dict(initParams or {})
        self.agent.create_backend(u.lower(), params)
        self.backends[u] = u.lower()
        opts = dict(self.plugin_b_options.get(u, {}))
        opts.update({str(k): str(v) for k, v in params.items()})
        self.backend_options[u] = opts
        self.backend_mems[u] = list(self.plugin_mem_types.get(u, ["DRAM"]))

    # ---- descriptor lists ----
    def get_reg_descs(self, descs, mem_type=None, is_sorted=False):
        if isinstance(descs, nixl_reg_dlist):
            return descs
        if isinstance(descs, nixl_xfer_dlist):
            return nixl_reg_dlist(descs.mem_type, descs.descs())
        kind = _mem(mem_type)
        if _is_tensor(descs) or (not isinstance(descs, (list, tuple)) and
                                 not _is_ndarray2d(descs)):
            descs = [descs]
        if _is_ndarray2d(descs) or (len(descs) and isinstance(descs[0], tuple)):
            regions = descs        # parsed in C: (addr, len, dev[, meta]) or (N, 3)
        else:
            regions, kinds = [], set()
            for obj in descs:
                addr, n, dev, k = memory_of(obj)
                regions.append((addr, n, dev))
                kinds.add(k)
            if kind is None and len(kinds) == 1:
                kind = kinds.pop()
        return nixl_reg_dlist(kind or "DRAM", regions)

    def get_xfer_descs(self, descs, mem_type=None, is_sorted=False):
        if isinstance(descs, nixl_xfer_dlist):
            return descs
        if isinstance(descs, nixl_reg_dlist):
            descs, mem_type = descs._descs, descs.mem_type
        kind = _mem(mem_type)
        if _is_tensor(descs):
            descs = [descs]
        if _is_ndarray2d(descs) or (isinstance(descs, (list, tuple)) and len(descs) and
                                    isinstance(descs[0], (tuple, list))):
            kind = kind or "DRAM"
            dl = DList(kind, len(descs))
            dl.add_descs(descs, -1 if kind == "DRAM" else None)
            return nixl_xfer_dlist(kind, dl)
        regions, kinds = [], set()
        for obj in descs:
            addr, n, dev, k = memory_of(obj)
            regions.append((addr, n, dev))
            kinds.add(k)
        if kind is None:
            kind = kinds.pop() if len(kinds) == 1 else "DRAM"
        dl = DList(kind, len(regions))
        dl.add_descs(regions, -1 if kind == "DRAM" else None)
        return nixl_xfer_dlist(kind, dl)

    def get_serialized_descs(self, descs):
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs):
        return pickle.loads(serialized_descs)

    # ---- memory ----
    def register_memory(self, reg_list, mem_type=None, is_sorted=False, backends=None):
        descs = self.get_reg_descs(reg_list, mem_type, is_sorted)
        if descs.descCount() == 0:
            return descs
        rep = self.agent._register(descs._descs, descs.mem_type, self._bk(backends), False,
                                   _dram_dev(descs))
        descs.report = RegistrationReport._from_tuple(rep)
        return descs

    def deregister_memory(self, dereg_list, backends=None):
        descs = self.get_reg_descs(dereg_list)
        if descs.descCount() == 0:
            return
        self.agent._deregister(descs._descs, _dram_dev(descs))

    # ---- metadata ----
    def get_agent_metadata(self):
        return self.agent.get_metadata()

    def get_partial_agent_metadata(self, descs=None, inc_conn_info=False, backends=None):
        return self.agent.get_metadata()

    def add_remote_agent(self, metadata):
        return self.agent.load_metadata(metadata).encode()

    def remove_remote_agent(self, agent):
        self.agent.remove_remote(_name(agent))

    def check_remote_metadata(self, agent, descs=None):
        return self.agent.check_remote(_name(agent))

    def make_connection(self, remote_agent, backends=None):
        name = _name(remote_agent)
        if not self.agent.check_remote(name):
            raise _not_loaded(name)

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        if not ip_addr:
            raise _no_central_store()
        self.agent.push_metadata(f"{ip_addr}:{port}")

    def send_partial_agent_metadata(self, descs=None, inc_conn_info=False, backends=None,
                                    ip_addr="", port=DEFAULT_COMM_PORT):
        self.send_local_metadata(ip_addr, port)

    def fetch_remote_metadata(self, remote_agent, ip_addr="", port=DEFAULT_COMM_PORT):
        if not ip_addr:
            raise _no_central_store()
        got = self.agent.fetch_metadata(f"{ip_addr}:{port}")
        want = _name(remote_agent)
        if want and got != want:
            warnings.warn(f"kvlane.nixl: {ip_addr}:{port} serves agent {got!r}, not {want!r}; "
                          f"loaded {got!r}", stacklevel=2)
        return got

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        self.agent.invalidate_metadata(f"{ip_addr}:{port}" if ip_addr else None)

    # ---- transfers ----
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, is_sorted=False,
                        backends=None):
        descs = self.get_xfer_descs(xfer_list, mem_type, is_sorted)
        name = _name(agent_name)
        if name in ("", NIXL_INIT_AGENT, None):
            return nixl_prepped_dlist_handle(self.agent.prep_local(descs.dlist), None)
        if name == self.name and not self.agent.check_remote(name):
            self.agent.load_metadata(self.agent.get_metadata())   # loopback
        return nixl_prepped_dlist_handle(self.agent.prep_remote(name, descs.dlist), name)

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side,
                          remote_indices, notif_msg=b"", backends=None, skip_desc_merge=False):
        op = _op(operation)
        lp, rp = _prep(local_xfer_side), _prep(remote_xfer_side)
        bk = self._bk(backends)
        backend = bk[0] if bk else None

        def make(notif):
            return self.agent.create_xfer_prepped(op, lp, local_indices, rp, remote_indices,
                                                  notif, backend)
        notif = _msg(notif_msg)
        return nixl_xfer_handle(make(notif), make, notif)

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent,
                        notif_msg=b"", backends=None):
        op = _op(operation)
        local = self.get_xfer_descs(local_descs)
        remote = self.get_xfer_descs(remote_descs)
        name = _name(remote_agent)
        if name == self.name and not self.agent.check_remote(name):
            self.agent.load_metadata(self.agent.get_metadata())   # loopback
        bk = self._bk(backends)
        backend = bk[0] if bk else None

        def make(notif):
            return self.agent.create_xfer(op, local.dlist, name, remote.dlist, notif, backend)
        notif = _msg(notif_msg)
        return nixl_xfer_handle(make(notif), make, notif)

    def transfer(self, handle, notif_msg=b""):
        h = _xh(handle)
        notif = _msg(notif_msg)
        try:
            if notif is not None and notif != h.notif:
                # NIXL lets a posting replace the message: rebuild with it.
                old = h.xfer
                h.xfer = h._make(notif)
                h.notif = notif
                old.release()
            h.start_us = time.time_ns() // 1000
            h.error = None
            return "DONE" if h.xfer.post() else "PROC"
        except UsageError:
            raise
        except Error as e:
            return _err(h, e)

    def check_xfer_state(self, handle):
        h = _xh(handle)
        try:
            return "DONE" if h.xfer.test() else "PROC"
        except UsageError as e:
            if e.code == -107 or not h.xfer:   # cancelled, or agent closed
                return _err(h, e)
            raise
        except Error as e:
            return _err(h, e)

    def query_xfer_backend(self, handle):
        return _xh(handle).xfer.stats()["backend"].upper()

    def get_xfer_telemetry(self, handle):
        h = _xh(handle)
        s = h.xfer.stats()
        return nixl_xfer_telemetry(
            startTime=h.start_us, postDuration=s["post_ns"] // 1000,
            xferDuration=s["duration_ns"] // 1000, totalBytes=s["bytes"],
            descCount=s["blocks"], backend=s["backend"].upper(), path=s["path"],
            segments=s["segments"])

    def release_xfer_handle(self, handle):
        h = _xh(handle)
        h.xfer.release()

    def release_dlist_handle(self, handle):
        _prep(handle).release()

    # ---- notifications ----
    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        msg = notif_msg.encode() if isinstance(notif_msg, str) else notif_msg
        self.agent.send_notif(_name(remote_agent_name), msg)

    def get_new_notifs(self, backends=None):
        out = {}
        for sender, msg in self.agent.poll_notifs():
            out.setdefault(sender, []).append(msg)
        return out

    def update_notifs(self, backends=None):
        for sender, msgs in self.get_new_notifs().items():
            self.notifs.setdefault(sender, []).extend(msgs)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag, backends=None,
                               tag_is_prefix=True):
        self.update_notifs()
        name = _name(remote_agent_name)
        tag = lookup_tag.encode() if isinstance(lookup_tag, str) else lookup_tag
        msgs = self.notifs.get(name, [])
        for i, m in enumerate(msgs):
            if (tag_is_prefix and m.startswith(tag)) or (not tag_is_prefix and tag in m):
                del msgs[i]
                return True
        return False

    # ---- kvlane additions ----
    def close(self):
        """Destroy the agent now (also done at interpreter exit)."""
        self.agent.close()


def _dram_dev(descs):
    """DRAM device ids in NIXL descriptors are arbitrary (vLLM passes its TP
    rank); kvlane checks a DRAM device as a NUMA node, so they are replaced
    by "any"."""
    return -1 if descs.mem_type == "DRAM" else None


def _op(operation):
    if operation not in ("READ", "WRITE"):
        raise InvalidArgument(f"operation must be \"READ\" or \"WRITE\", got {operation!r}")
    return operation


def _prep(h):
    if isinstance(h, nixl_prepped_dlist_handle):
        return h.prep
    if isinstance(h, _kvlane.Prep):
        return h
    raise InvalidArgument(f"a handle from prep_xfer_dlist is needed, got {h!r}")


def _xh(h):
    if isinstance(h, nixl_xfer_handle):
        return h
    raise InvalidArgument(f"a handle from make_prepped_xfer or initialize_xfer is needed, "
                          f"got {h!r}")


def _err(h, e):
    h.error = e
    log.warning("kvlane.nixl: transfer failed:\n%s", e)
    return "ERR"


def _not_loaded(name):
    from .errors import NotFound
    return NotFound(f"remote agent {name!r} is not loaded",
                    hint="add_remote_agent(metadata) or fetch_remote_metadata(name, ip, port) "
                         "first")


def _no_central_store():
    return UnsupportedError(
        "kvlane.nixl has no central metadata server: ip_addr is required",
        hint="pass the peer listener's ip_addr and port, or exchange get_agent_metadata() "
             "bytes yourself")


if sys.version_info < (3, 8):   # pragma: no cover
    raise ImportError("kvlane.nixl needs Python 3.8 or newer")
