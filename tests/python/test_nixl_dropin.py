"""kvlane.nixl as a drop-in for NIXL 1.4: the nixl package, NIXL's backend
names and parameters, signatures, exceptions, and refusals of what NIXL
would turn into garbage."""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import kvlane
import kvlane.nixl as kn
from kvlane.errors import (nixlBackendError, nixlInvalidParamError, nixlNotFoundError,
                           nixlNotPostedError, nixlNoTelemetryError, nixlNotSupportedError)
from kvlane.nixl import nixl_agent, nixl_agent_config

NIXL_PATH = os.environ.get("KVL_NIXL_PATH") or os.path.join(
    os.environ.get("KVL_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build")),
    "python-nixl")


@pytest.fixture
def agent(uniq):
    a = nixl_agent(uniq, nixl_agent_config(capture_telemetry=True))
    yield a
    a.close()


@pytest.fixture
def fresh_set(monkeypatch):
    """transport_set() computed again (it is cached per process)."""
    monkeypatch.setattr(kn, "_SET", None)
    yield
    kn._SET = None


class FakeDevice:
    def __init__(self, type_, index=None):
        self.type, self.index = type_, index

    def __eq__(self, other):
        return (self.type, self.index) == (other.type, other.index)

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


class FakeTensor:
    """Duck-typed like a torch tensor (torch is not needed in CI)."""

    def __init__(self, arr, device):
        self.arr, self.device = arr, device
        self.nbytes = arr.nbytes

    def data_ptr(self):
        return self.arr.ctypes.data

    def is_contiguous(self):
        return True


# ---- 1. the nixl package ---------------------------------------------------------------

def _py(code, pythonpath):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)


def test_nixl_package_names():
    code = (
        "import nixl, nixl._api as api, nixl._bindings as b, kvlane\n"
        "from nixl._bindings import nixlXferTelemetry, nixlBackendError, nixlCancelledError, "
        "nixlRemoteDisconnectError, nixl_thread_sync_t\n"
        "from nixl._api import nixl_agent, nixl_agent_config, nixlBind, nixl_xfer_handle, "
        "nixl_prepped_dlist_handle, nixl_thread_sync_t as ts\n"
        "from nixl._utils import malloc_passthru, free_passthru, ba_buf, verify_transfer\n"
        "from nixl.logging import get_logger\n"
        "assert nixl.__kvlane__ == kvlane.__version__\n"
        "assert nixlBind is b and api.DEFAULT_COMM_PORT == 8888\n"
        "assert issubclass(kvlane.Disconnected, nixlRemoteDisconnectError)\n"
        "assert issubclass(kvlane.Cancelled, nixlCancelledError)\n"
        "assert nixl.nixl_agent is nixl_agent and nixl.DRAM_SEG == 0 and nixl.NIXL_WRITE == 1\n"
        "assert ts.NIXL_THREAD_SYNC_STRICT.value == b.NIXL_THREAD_SYNC_STRICT\n"
        "p = malloc_passthru(8192); q = malloc_passthru(8192); ba_buf(p, 8192); ba_buf(q, 8192)\n"
        "verify_transfer(p, q, 8192); free_passthru(p); free_passthru(q)\n"
        "assert get_logger('_api').name == 'nixl.api'\n"
        "print('ok')\n")
    r = _py(code, NIXL_PATH)          # the nixl folder alone on the path
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_nixl_package_not_on_default_path():
    r = _py("import nixl; print(getattr(nixl, '__kvlane__', 'real NIXL'))", "")
    assert r.returncode != 0 or "real NIXL" in r.stdout, (r.stdout, r.stderr)


# ---- 2. NIXL names create kvlane's transport set --------------------------------------

def test_ucx_creates_the_transport_set(agent):
    members = kn.transport_set()
    assert members[0] == "shm" and "tcp" in members
    assert agent.agent.backends() == members
    assert agent.backends == {"UCX": tuple(members)}
    assert agent.get_backend_mem_types("UCX") == ["DRAM", "VRAM"]
    names = agent.get_plugin_list()
    for n in ("UCX", "UCCL", "LIBFABRIC", "MOONCAKE", "GPUNETIO", "SHM", "TCP"):
        assert n in names
    assert "POSIX" in names                # files: kvlane's posix backend
    assert "OBJ" not in names and "HF3FS" not in names    # not served


def test_same_host_transfer_takes_shm_and_explicit_name_forces(uniq):
    a = nixl_agent(uniq + "-a", nixl_agent_config(capture_telemetry=True))
    b = nixl_agent(uniq + "-b", nixl_agent_config())
    try:
        src = np.arange(1 << 20, dtype=np.uint8)
        dst = np.zeros(1 << 20, np.uint8)
        ra = a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM", ["UCX"])
        b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
        ok = {o.backend for o in ra.report.entries[0].outcomes if o.ok}
        assert ok >= {"shm", "tcp"}, str(ra.report)
        name = a.add_remote_agent(b.get_agent_metadata())
        for backends, want in (([], "SHM"), (["UCX"], "SHM"), (["TCP"], "TCP")):
            dst[:] = 0
            h = a.initialize_xfer("WRITE", a.get_xfer_descs([(src.ctypes.data, 65536, 0)], "DRAM"),
                                  a.get_xfer_descs([(dst.ctypes.data, 65536, 0)], "DRAM"), name,
                                  b"", backends)
            st = a.transfer(h)
            while st != "DONE":
                st = a.check_xfer_state(h)
            assert a.query_xfer_backend(h) == want
            assert a.get_xfer_telemetry(h).backend == want
            assert np.array_equal(dst[:65536], src[:65536])
            a.release_xfer_handle(h)
    finally:
        a.close()
        b.close()


def test_transport_set_env(fresh_set, monkeypatch):
    monkeypatch.setenv("KVLANE_NIXL_TRANSPORTS", "shm,tcp")
    assert kn.transport_set() == ["shm", "tcp"]
    kn._SET = None
    monkeypatch.setenv("KVLANE_NIXL_TRANSPORTS", "shm,rdma")
    with pytest.raises(kvlane.InvalidArgument, match="rdma"):
        kn.transport_set()


# ---- 3. NIXL's UCX parameters ------------------------------------------------------------

def test_ucx_params_accepted(uniq, caplog):
    a = nixl_agent(uniq, nixl_agent_config(backends=[]))
    try:
        assert a.get_plugin_params("UCX") == {"ucx_devices": "", "num_workers": "1",
                                              "ucx_error_handling_mode": "peer"}
        assert a.get_plugin_mem_types("UCX") == ["DRAM", "VRAM"]
        with caplog.at_level(logging.INFO, logger="kvlane.nixl"):
            a.create_backend("UCX", {"num_threads": "8", "num_workers": "2", "device_list": "",
                                     "ucx_devices": "", "ucx_error_handling_mode": "none",
                                     "split_batch_size": "1024", "engine_config": "RNDV_THRESH=8192",
                                     "ucx_num_device_channels": "4"})
        assert "split_batch_size" in caplog.text and "no effect" in caplog.text
        assert a.get_backend_params("UCX")["num_threads"] == "8"
        a.create_backend("LIBFABRIC", a.get_plugin_params("LIBFABRIC"))   # same set, aliased
        assert a.backends["LIBFABRIC"] == a.backends["UCX"]
    finally:
        a.close()
    # NIXL's documented pattern: read the defaults, pass them back.
    a = nixl_agent(uniq, nixl_agent_config(backends=[]))
    try:
        a.create_backend("UCX", a.get_plugin_params("UCX"))
        assert a.agent.backends() == kn.transport_set()
    finally:
        a.close()


def test_ucx_params_refused(uniq):
    a = nixl_agent(uniq, nixl_agent_config(backends=[]))
    try:
        with pytest.raises(kvlane.InvalidArgument, match="num_thread"):
            a.create_backend("UCX", {"num_thread": "8"})
        with pytest.raises(kvlane.InvalidArgument, match="ucx_error_handling_mode"):
            a.create_backend("UCX", {"ucx_error_handling_mode": "maybe"})
        with pytest.raises(kvlane.InvalidArgument, match="not an integer"):
            a.create_backend("UCX", {"num_threads": "many"})
        with pytest.raises(nixlInvalidParamError):
            a.create_backend("UXC")
        with pytest.raises(nixlNotSupportedError, match="OBJ"):
            a.create_backend("OBJ")
        if "ucx" not in kn.transport_set():
            with pytest.raises(kvlane.InvalidArgument, match="not in this host's set"):
                a.create_backend("UCX", {"ucx.tls": "tcp"})
        assert a.agent.backends() == []
    finally:
        a.close()


def test_kvlane_params_through_the_set(uniq):
    a = nixl_agent(uniq, nixl_agent_config(backends=[]))
    try:
        a.create_backend("UCX", {"tcp.chunk_kib": "1024"})
        assert "tcp" in a.agent.backends()
        with pytest.raises(kvlane.InvalidArgument):
            b = nixl_agent(uniq + "-b", nixl_agent_config(backends=[]))
            try:
                b.create_backend("UCX", {"tcp.chunk_kib": "lots"})
            finally:
                b.close()
    finally:
        a.close()


@pytest.mark.skipif(not kvlane.backend_available("ucx")[0], reason="ucx module not built")
def test_ucx_params_reach_kvlane_ucx(uniq, fresh_set, monkeypatch):
    monkeypatch.setenv("KVLANE_NIXL_TRANSPORTS", "shm,ucx,tcp")
    a = nixl_agent(uniq, nixl_agent_config(backends=[]))
    try:
        a.create_backend("UCX", {"ucx_error_handling_mode": "peer", "engine_config": "TLS=tcp"})
        assert a.agent.backends() == ["shm", "ucx", "tcp"]
    finally:
        a.close()
    a = nixl_agent(uniq, nixl_agent_config(backends=[]))
    try:
        # A device the user names goes to kvlane's ucx: its diagnosis comes
        # back when memory is registered on it.
        a.create_backend("UCX", {"ucx_devices": "nosuchdev9:1"})
        buf = np.zeros(4096, np.uint8)
        with pytest.raises(nixlBackendError, match="nosuchdev9"):
            a.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM", ["ucx"])
    finally:
        a.close()


# ---- 4. signatures ------------------------------------------------------------------------

def test_positional_signatures(agent, uniq):
    buf = np.zeros(1 << 16, np.uint8)
    reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM", ["UCX"])
    lh = agent.prep_xfer_dlist("", [(buf.ctypes.data, 4096, 0)], "DRAM", ["UCX"])
    assert lh and len(lh) == 1
    agent.release_dlist_handle(lh)
    # NIXL < 1.0 had is_sorted before backends: a bool there is refused, not lost.
    with pytest.raises(kvlane.InvalidArgument, match="is_sorted"):
        agent.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM", True)
    with pytest.raises(kvlane.InvalidArgument, match="is_sorted"):
        agent.prep_xfer_dlist("", [(buf.ctypes.data, 4096, 0)], "DRAM", False)
    agent.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM", is_sorted=True)
    with pytest.raises(TypeError):
        agent.register_memory([(buf.ctypes.data, 4096, 0, "")], mem_typ="DRAM")
    with pytest.raises(TypeError):
        nixl_agent_config(backend=["UCX"])
    with pytest.raises(TypeError):
        nixl_agent_config(sync_mode="strict")
    c = nixl_agent_config(True, True, 1234, True, 2, ["UCX"], kn.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW)
    assert (c.port, c.capture_telemetry, c.num_threads, c.backends) == (1234, True, 2, ["UCX"])
    assert nixl_agent_config().port == kn.DEFAULT_COMM_PORT
    with pytest.raises(kvlane.UnsupportedError):
        agent.fetch_remote_metadata("peer", label="kv")       # no store without ip_addr
    agent.deregister_memory(reg, ["UCX"])


def test_unknown_backend_names(uniq, agent):
    with pytest.raises(kvlane.InvalidArgument, match="UXC"):
        nixl_agent(uniq + "-x", nixl_agent_config(backends=["UXC"]))
    buf = np.zeros(4096, np.uint8)
    with pytest.raises(KeyError):
        agent.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM", ["SHMM"])
    with pytest.raises(kvlane.InvalidArgument, match="not created"):
        agent.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM", ["GDS"])


# ---- 5. exceptions ------------------------------------------------------------------------

def test_exceptions_are_nixl_classes(agent):
    buf = np.zeros(1 << 16, np.uint8)
    # A registration failure is a nixlBackendError, whatever kvlane's class.
    with pytest.raises(nixlBackendError) as ei:
        agent.register_memory([(0, 4096, 0, "")], "DRAM")
    assert isinstance(ei.value, kvlane.Error) and "0x0" in str(ei.value)
    import pickle
    e2 = pickle.loads(pickle.dumps(ei.value))
    assert isinstance(e2, nixlBackendError) and type(e2).__name__ == type(ei.value).__name__
    with pytest.raises(nixlNotFoundError):
        agent.prep_xfer_dlist("nobody", [(buf.ctypes.data, 4096, 0)], "DRAM")
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    lh = agent.prep_xfer_dlist("", [(buf.ctypes.data, 4096, 0)], "DRAM")
    rh = agent.prep_xfer_dlist(agent.name, [(buf.ctypes.data + 8192, 4096, 0)], "DRAM")
    h = agent.make_prepped_xfer("WRITE", lh, [0], rh, [0])
    with pytest.raises(nixlNotPostedError):
        agent.check_xfer_state(h)
    st = agent.transfer(h)
    while st != "DONE":
        st = agent.check_xfer_state(h)
    quiet = nixl_agent(agent.name + "-q", nixl_agent_config())
    try:
        quiet.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
        ql = quiet.prep_xfer_dlist("", [(buf.ctypes.data, 4096, 0)], "DRAM")
        qr = quiet.prep_xfer_dlist(quiet.name, [(buf.ctypes.data + 8192, 4096, 0)], "DRAM")
        qh = quiet.make_prepped_xfer("READ", ql, [0], qr, [0])
        with pytest.raises(nixlNoTelemetryError):
            quiet.get_xfer_telemetry(qh)
    finally:
        quiet.close()
    with pytest.raises(nixlNotSupportedError):
        agent.estimate_xfer_cost(h)


def test_register_paths_agree(agent):
    """register_memory / deregister_memory take engines' shapes in C
    (NixlAgentBase) and hand every other call to the Python methods: both
    give the same lists, reports and exceptions."""
    buf = np.zeros(1 << 16, np.uint8)
    base = buf.ctypes.data
    calls = []

    def spy(name):
        real = getattr(type(agent), name)
        agent.__dict__[name] = lambda *a, **k: (calls.append(name), real(agent, *a, **k))[1]
    spy("_register_memory_py")
    spy("_deregister_memory_py")

    def c_path(fn, *args, **kw):
        del calls[:]
        r = fn(*args, **kw)
        assert calls == [], f"{fn.__name__}{args, kw} left the C path"
        return r

    def py_path(fn, *args, **kw):
        del calls[:]
        r = fn(*args, **kw)
        assert len(calls) == 1, f"{fn.__name__}{args, kw} did not reach Python"
        return r

    rows = [(base, 4096, 0, "a"), (base + 8192, 4096, 0, "")]
    shapes = [((rows, "DRAM"), {}), ((rows,), {"mem_type": "cpu"}),
              ((rows, "DRAM"), {"is_sorted": True}), ((rows, "DRAM", None), {}),
              ((rows,), {"mem_type": "DRAM", "backends": None})]
    for args, kw in shapes:
        reg = c_path(agent.register_memory, *args, **kw)
        assert type(reg) is kn.nixlRegDList and reg.mem_type == "DRAM" and reg.descs() == \
            [(base, 4096, 0), (base + 8192, 4096, 0)] and reg[0][3] == b"a"
        assert reg._descs is not rows and reg.report.ok and len(reg.report.entries) == 2
        assert agent.agent.query_range(base + 8192, 4096)[0] == "DRAM"
        assert c_path(agent.deregister_memory, reg) is None
        assert agent.agent.query_range(base + 8192, 4096) is None
    # a list made by get_reg_descs, and the same list again
    descs = agent.get_reg_descs(rows, "DRAM")
    assert c_path(agent.register_memory, descs) is descs and descs.report.ok
    c_path(agent.deregister_memory, descs, backends=None)
    # the Python path: named backends, keywords for the list, FILE, tensors
    reg = py_path(agent.register_memory, rows, "DRAM", ["UCX"])
    py_path(agent.deregister_memory, reg, ["UCX"])
    reg = py_path(agent.register_memory, reg_list=rows, mem_type="DRAM")
    py_path(agent.deregister_memory, dereg_list=reg)
    reg = py_path(agent.register_memory, [FakeTensor(buf, FakeDevice("cpu"))])
    c_path(agent.deregister_memory, reg)              # what it returned: a nixlRegDList
    del calls[:]
    with pytest.raises(kvlane.InvalidArgument, match="mem_type is needed"):
        agent.deregister_memory(rows)                 # tuples: the memory type is unknown
    assert calls == ["_deregister_memory_py"]
    assert py_path(agent.register_memory, [], "DRAM").descCount() == 0
    for bad in [(rows, "GPU"), (rows, "DRAM", True), (rows, "DRAM", ["NOPE"])]:
        with pytest.raises(Exception) as e_c:
            agent.register_memory(*bad)
        with pytest.raises(type(e_c.value)) as e_py:
            agent._register_memory_py(*bad)
        assert str(e_c.value) == str(e_py.value)
    with pytest.raises(TypeError):
        agent.register_memory(rows, "DRAM", mem_typ="DRAM")
    with pytest.raises(TypeError):
        agent.deregister_memory()
    with pytest.raises(TypeError):
        agent.deregister_memory(descs, is_sorted=True)    # register_memory's keyword only
    # failures on the C path: as the Python one raises them
    unmapped = [(0, 4096, 0, ""), (base, 4096, 0, "")]
    with pytest.raises(nixlBackendError) as e_c:
        c_path(agent.register_memory, unmapped, "DRAM")
    with pytest.raises(nixlBackendError) as e_py:
        agent._register_memory_py(unmapped, "DRAM")
    for e in (e_c.value, e_py.value):
        assert isinstance(e, kvlane.Error) and e.__cause__ is None and e.__suppress_context__
        assert "0x0" in str(e) and e.report is not None and not e.report.ok
    assert type(e_c.value) is type(e_py.value) and str(e_c.value) == str(e_py.value)
    assert agent.agent.query_range(base, 4096) is None      # nothing of the list stayed
    never = agent.get_reg_descs([(base, 4096, 0, "")], "DRAM")
    with pytest.raises(nixlBackendError) as e_c:
        c_path(agent.deregister_memory, never)
    with pytest.raises(nixlBackendError) as e_py:
        agent._deregister_memory_py(never)
    assert type(e_c.value) is type(e_py.value) and isinstance(e_c.value, kvlane.NotFound)
    # an agent that is not kvlane's (replaced by the engine): the Python path
    inner = agent.agent

    class Wrapped:
        def __getattr__(self, name):
            return getattr(inner, name)
    agent.agent = Wrapped()
    try:
        reg = py_path(agent.register_memory, rows, "DRAM")
        py_path(agent.deregister_memory, reg)
    finally:
        agent.agent = inner
    # nor is a kvlane agent whose _register / _deregister are overridden
    seen = []

    class Tracking(kvlane.Agent):
        def _register(self, *a, **k):
            seen.append("reg")
            return super()._register(*a, **k)

        def _deregister(self, *a, **k):
            seen.append("dereg")
            return super()._deregister(*a, **k)
    agent.agent = Tracking(agent.name + "-tracking")
    try:
        reg = py_path(agent.register_memory, rows, "DRAM")
        py_path(agent.deregister_memory, reg)
        assert seen == ["reg", "dereg"]
    finally:
        agent.agent.close()
        agent.agent = inner


def _wait_stopped(pid, bound_s=30):
    """Until every thread of pid is in the stopped state (T)."""
    import time
    end = time.monotonic() + bound_s
    while True:
        states = []
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass
        if states and all(s == "T" for s in states):
            return
        assert time.monotonic() < end, f"process {pid} did not stop: {states}"
        time.sleep(0.001)


def test_transfer_paths_agree(uniq, peer_factory):
    """transfer / check_xfer_state take a handle without a message in C and
    raise through kvlane.nixl's conversions: a re-post of an active handle is
    a nixlRepostActiveError, a failed transfer's error stays on the handle.
    The peer is stopped (SIGSTOP) while a READ over tcp waits for it, so the
    handle is active for as long as the test needs, whatever the load."""
    import signal
    from kvlane.errors import nixlRepostActiveError
    from kvlpattern import pattern, SIZE
    peer = peer_factory(uniq + "-t", "nixl")
    a = nixl_agent(uniq, nixl_agent_config(backends=["TCP"]))
    calls = []
    for name in ("_transfer_py", "_check_xfer_state_py"):
        real = getattr(type(a), name)
        a.__dict__[name] = (lambda real, name: lambda *x, **k: (calls.append(name),
                                                                real(a, *x, **k))[1])(real, name)
    try:
        local = np.zeros(SIZE, np.uint8)
        a.register_memory([(local.ctypes.data, SIZE, 0, "")], "DRAM")
        remote = a.add_remote_agent(peer.call("md"))
        raddr = peer.call("addr")
        lh = a.prep_xfer_dlist("", [(local.ctypes.data, SIZE, 0)], "DRAM")
        rh = a.prep_xfer_dlist(remote, [(raddr, SIZE, 0)], "DRAM")
        h = a.make_prepped_xfer("READ", lh, [0], rh, [0])
        with pytest.raises(nixlNotPostedError):
            a.check_xfer_state(h)
        assert calls == []
        for args, kw in [((h,), {}), ((h, b""), {}), ((h, None), {}), ((h,), {"notif_msg": b""})]:
            local[:] = 0
            st = a.transfer(*args, **kw)
            while st != "DONE":
                st = a.check_xfer_state(h)
            assert calls == [] and h.error is None and h.start_us > 0
            assert np.array_equal(local, pattern(7))
        os.kill(peer.proc.pid, signal.SIGSTOP)
        try:
            _wait_stopped(peer.proc.pid)
            assert a.transfer(h) == "PROC"       # the peer cannot answer while stopped
            with pytest.raises(nixlRepostActiveError) as e_c:
                a.transfer(h)
            assert isinstance(e_c.value, kvlane.StateError) and e_c.value.__suppress_context__
            assert a.check_xfer_state(h) == "PROC" and calls == [] and h.error is None
            with pytest.raises(nixlRepostActiveError) as e_py:
                a._transfer_py(h)                  # the Python path says the same
            assert type(e_py.value) is type(e_c.value) and str(e_py.value) == str(e_c.value)
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)
        st = "PROC"
        while st != "DONE":
            st = a.check_xfer_state(h)
        # the Python path: a message, a handle by keyword, not a handle
        del calls[:]
        st = a.transfer(h, b"with a message")
        while st != "DONE":
            st = a.check_xfer_state(h)
        assert calls == ["_transfer_py"]             # checks of it stay in C
        del calls[:]
        with pytest.raises(kvlane.InvalidArgument, match="handle from make_prepped_xfer"):
            a.check_xfer_state(lh)
        with pytest.raises(kvlane.InvalidArgument, match="handle from make_prepped_xfer"):
            a.transfer("h")
        with pytest.raises(TypeError):
            a.transfer(h, notif=b"")
        assert calls == ["_check_xfer_state_py", "_transfer_py", "_transfer_py"]
        # a failed transfer: the error raised and kept on the handle, both paths
        a.remove_remote_agent(remote)
        for post in (a.transfer, a._transfer_py):
            h.error = None
            with pytest.raises(kvlane.Stale, match="was removed or replaced") as ei:
                post(h)
            assert h.error is ei.value
        a.release_xfer_handle(h)
    finally:
        a.close()


# ---- 6. refusals ----------------------------------------------------------------------------

def test_garbage_refused(agent):
    a1 = np.arange(12, dtype=np.int64)
    with pytest.raises(kvlane.InvalidArgument, match="1-D|shape"):
        agent.get_xfer_descs(a1, "DRAM")
    with pytest.raises(kvlane.InvalidArgument, match="shape"):
        agent.get_reg_descs(a1.astype(np.uint8), "DRAM")
    with pytest.raises(kvlane.InvalidArgument, match="int32"):
        agent.get_xfer_descs(np.zeros((4, 3), np.int32), "DRAM")
    with pytest.raises(kvlane.InvalidArgument, match="mem_type is needed"):
        agent.get_xfer_descs([(1, 2, 0)])
    with pytest.raises(kvlane.InvalidArgument, match="3-tuples"):
        agent.get_xfer_descs([(1, 2, 0, "")], "DRAM")
    with pytest.raises(kvlane.InvalidArgument, match="3-tuples"):
        agent.get_xfer_descs([(1, 2, 0), (3, 4)], "DRAM")
    with pytest.raises(TypeError):
        agent.get_xfer_descs([[1, 2, 0]], "DRAM")
    with pytest.raises(kvlane.InvalidArgument, match="memory type"):
        agent.get_xfer_descs([(1, 2, 0)], "GPU")
    # NIXL's binding takes an int device and a str meta: an int meta once
    # became that many zero bytes, a str device was ignored for DRAM
    with pytest.raises(TypeError, match="meta 5 is not a str or bytes"):
        agent.get_reg_descs([(4096, 4096, 0, 5)], "DRAM")
    with pytest.raises(TypeError, match="device '0' is not an integer"):
        agent.register_memory([(4096, 4096, "0", "")], "DRAM")
    assert agent.get_reg_descs([(4096, 4096, np.int64(0), b"m")], "DRAM")[0][3] == b"m"
    # engines' (int, int, int, str) rows are recognised in C and skip the
    # per-row checks: the list registered is a copy, and a bad row after
    # good ones is still refused by them
    buf = np.zeros(8192, np.uint8)
    rows = [(buf.ctypes.data, 4096, 0, "")]
    reg = agent.register_memory(rows, "DRAM")
    rows.append((buf.ctypes.data + 4096, 4096, 0, ""))
    assert len(reg) == 1 and reg.report.ok and reg.report.entries[0].len == 4096
    agent.deregister_memory(reg)
    with pytest.raises(TypeError, match="descriptor 1: device '0' is not an integer"):
        agent.register_memory([(buf.ctypes.data, 4096, 0, ""),
                               (buf.ctypes.data + 4096, 4096, "0", "")], "DRAM")
    a, b = np.zeros(4096, np.uint8), np.zeros(4096, np.uint8)
    mixed = [FakeTensor(a, FakeDevice("cpu")), FakeTensor(b, FakeDevice("cuda", 0))]
    with pytest.raises(kvlane.InvalidArgument, match="two devices"):
        agent.get_xfer_descs(mixed)
    with pytest.raises(kvlane.InvalidArgument, match="two devices"):
        agent.register_memory(mixed)
    with pytest.raises(kvlane.InvalidArgument, match="mem_type 'VRAM'"):
        agent.get_xfer_descs([FakeTensor(a, FakeDevice("cpu"))], "VRAM")
    t = agent.get_xfer_descs([FakeTensor(a, FakeDevice("cpu")), FakeTensor(b, FakeDevice("cpu"))])
    assert t.mem_type == "DRAM" and t[1] == (b.ctypes.data, 4096, -1)


def test_unsigned_arguments_not_wrapped():
    """Unsigned arguments of the C module were parsed with 'K' / 'I', which
    take -1 as 2**64 - 1 and 2**64 as 0 without a word."""
    d = kvlane.DList("DRAM")
    with pytest.raises(OverflowError, match="-1 is not an integer in 0..2"):
        d.add(-1, 4096)
    with pytest.raises(OverflowError, match="18446744073709551616 is not an integer"):
        d.add(2**64, 4096)
    with pytest.raises(OverflowError):
        d.add_strided(4096, 4096, -2, 64)
    with pytest.raises(TypeError, match="an integer is needed, got float"):
        d.add(4096, 1.5)
    assert len(d) == 0
    d.add(2**64 - 8192, 4096)                     # the top of the range is still taken
    for kw in ({"timeout_ms": -1}, {"workers": -1}, {"notif_peer_percent": 2**32}):
        with pytest.raises(OverflowError):
            kvlane.Agent("unsigned-args", **kw)
    # a NaN timeout compared false with everything and waited forever
    with kvlane.Agent("nan-wait") as a:
        with pytest.raises(ValueError, match="timeout_ms is NaN"):
            a.wait_notif(float("nan"))


def test_device_ids_not_wrapped():
    """Device ids were cut to 32 bits: (addr, len, 2**32) registered on
    device 0 without a word, 2**31 was reported as device -2147483648. Every
    way a device id enters the C module now refuses one past int32 by name
    and adds or registers nothing."""
    buf = np.zeros(4 * 4096, np.uint8)
    base = buf.ctypes.data
    with kvlane.Agent("dev-wrap") as a:
        for dev in (2**31, 2**32, -2**31 - 1, 2**70):
            with pytest.raises(OverflowError, match=f"device id {dev} is not a 32-bit device"):
                a.register_memory((base, 4096, dev), kind="DRAM")
        with pytest.raises(OverflowError, match="descriptor 1: device id 4294967296"):
            a.register_memory([(base, 4096, 0), (base + 4096, 4096, 2**32)], kind="DRAM")
        with pytest.raises(OverflowError, match="^device id 4294967296"):
            a.register_memory((base, 4096, 0), kind="DRAM", dev=2**32)
        with pytest.raises(TypeError, match="descriptor 0: a device id must be an integer"):
            a.register_memory((base, 4096, "cuda:0"), kind="DRAM")
        with pytest.raises(kvlane.NotFound):  # the refused lists registered nothing
            a.deregister_memory((base, 4096, 0))
        assert a.register_memory((base, 4096, 0), kind="DRAM").ok
    d = kvlane.DList("VRAM")
    with pytest.raises(OverflowError, match="descriptor 0: device id 4294967296"):
        d.add_descs([(base, 4096, 2**32)])
    with pytest.raises(OverflowError, match="descriptor 1: device id 8589934592"):
        d.add_descs(np.array([[base, 4096, 0], [base + 4096, 4096, 2**33]], np.int64))
    with pytest.raises(OverflowError, match="^device id 4294967296"):
        d.add_descs([(base, 4096, 0)], dev=2**32)
    assert len(d) == 0
    d.add_descs(np.array([[base, 4096, 2**31 - 1]], np.int64))  # the top of the range is taken
    assert d.get(0)[4] == 2**31 - 1
    # through nixl._api: a VRAM descriptor's device is kept, so it is checked
    na = nixl_agent("dev-wrap-nixl")
    try:
        with pytest.raises(OverflowError, match="device id 4294967296"):
            na.get_xfer_descs([(base, 4096, 2**32)], "VRAM")
    finally:
        na.close()


def test_region_tuples_take_numpy_ints_only_as_ints():
    """One region tuple with a NumPy integer address (engines compute them
    with NumPy) was refused as "cannot register a tuple"; a float length
    would have been cut to an int. Both now go by the integer rules."""
    buf = np.zeros(2 * 4096, np.uint8)
    base = buf.ctypes.data
    with kvlane.Agent("np-ints") as a:
        assert a.register_memory((np.int64(base), np.uint64(4096), np.int32(0)), kind="DRAM").ok
        a.deregister_memory((np.int64(base), 4096, 0))
        for bad in ((1.5, 4096, 0), ("0x1000", 4096, 0)):
            with pytest.raises(kvlane.InvalidArgument, match="of integers, got"):
                kvlane._agent.memory_of(bad)
        with pytest.raises(ValueError, match="addr and len must be non-negative 64-bit"):
            a.register_memory((base, 16.5, 0), kind="DRAM")


def test_index_garbage_refused(agent):
    """make_prepped_xfer's indices: what NIXL's binding refuses is refused
    here too, by name, rather than read some other way: a 2-D array (once
    flattened), None (kvlane's own xfer_prepped reads it as 0..n-1), uint64
    values past int64 (once read as negative numbers), floats, strings."""
    buf = np.zeros(16 * 4096, np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    rows = [(buf.ctypes.data + i * 4096, 4096, 0) for i in range(16)]
    lp = agent.prep_xfer_dlist("", rows, "DRAM")
    rp = agent.prep_xfer_dlist(agent.name, rows, "DRAM")
    ok = [0, 1]
    for bad, exc, text in ((np.array([[0, 1]]), TypeError, "1-D array is needed"),
                           (None, TypeError, "local_indices is None"),
                           (np.array([0, 2**63 + 5], np.uint64), ValueError,
                            "past the largest index"),
                           (np.array([0.0, 1.0]), TypeError, "integer array needed"),
                           ([0.0, 1.0], ValueError, "64-bit integer needed"),
                           ("01", ValueError, "64-bit integer needed"),
                           (np.array([0, 9, 99])[::2], nixlInvalidParamError,
                            "local index 1 is 99"),
                           (b"\x00\x01", TypeError, "got bytes"),
                           (bytearray(b"\x00\x01"), TypeError, "got bytearray"),
                           ([True, False], ValueError, "a bool: indices are needed")):
        with pytest.raises(exc, match=text):
            agent.make_prepped_xfer("WRITE", lp, bad, rp, ok)
    with pytest.raises(TypeError, match="remote_indices is None"):
        agent.make_prepped_xfer("WRITE", lp, ok, rp, None)
    with pytest.raises(TypeError, match="notif_msg must be bytes or str, got int"):
        agent.make_prepped_xfer("WRITE", lp, ok, rp, ok, 5)
    h = agent.make_prepped_xfer("WRITE", lp, ok, rp, ok, bytearray(b"tag"))
    with pytest.raises(TypeError, match="notif_msg must be bytes or str"):
        agent.transfer(h, 5.0)
    agent.release_xfer_handle(h)
    with pytest.raises(TypeError, match="lookup_tag must be bytes or str"):
        agent.check_remote_xfer_done(agent.name, 5)
    with pytest.raises(TypeError, match="listen_port must be an int"):
        nixl_agent_config(True, True, "8888")
    with pytest.raises(TypeError, match="listen_port must be an int"):
        nixl_agent_config(listen_port=70000)
    for good in ([0, 1], np.array([0, 1], np.int32), np.array([0, 1], np.uint64),
                 np.array([0, 1], np.int8)):
        agent.release_xfer_handle(agent.make_prepped_xfer("WRITE", lp, good, rp, ok))
    # arrays whose elements are not next to each other (NIXL's binding takes
    # them as a copy): a slice with a step, a reversed one, a table's column,
    # in every width; they must select exactly the entries they show
    buf[:] = np.repeat(np.arange(16, dtype=np.uint8), 4096)
    table = np.array([[3, 9], [1, 8], [2, 7]], np.int64)
    for src in (np.arange(8)[::3], np.array([5, 4, 3, 2], np.int32)[::-1], table[:, 0],
                np.array([6, 0, 4, 0, 2], np.uint16)[::2], np.array([1, 2, 3, 4], np.int8)[1::2]):
        dst = np.arange(8, 8 + len(src))
        h = agent.make_prepped_xfer("WRITE", lp, src, rp, dst)
        assert agent.transfer(h) in ("DONE", "PROC")
        while agent.check_xfer_state(h) != "DONE":
            pass
        agent.release_xfer_handle(h)
        for s, d in zip(src.tolist(), dst.tolist()):
            assert (buf[d * 4096:(d + 1) * 4096] == s).all(), (src, s, d)
        buf[8 * 4096:] = np.repeat(np.arange(8, 16, dtype=np.uint8), 4096)


# ---- 7. query_memory, lists, pickling -----------------------------------------------------

def test_query_memory_and_dlists(agent):
    buf = np.zeros(1 << 16, np.uint8)
    other = np.zeros(4096, np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    got = agent.query_memory([(buf.ctypes.data + 4096, 4096, 0, ""),
                              (other.ctypes.data, 4096, 0, "")], "UCX", "DRAM")
    assert got[1] is None and got[0]["kind"] == "DRAM"
    assert "shm" in got[0]["backends"].split(",")
    assert got[0]["region_len"] == str(buf.nbytes)
    with pytest.raises(ValueError, match="not found"):
        agent.query_memory([(buf.ctypes.data, 4096, 0, "")], "POSIX", "DRAM")
    rows = [(buf.ctypes.data + i * 4096, 4096, 0) for i in range(4)]
    x = agent.get_xfer_descs(rows, "DRAM")
    assert len(x) == 4 and x.descCount() == 4 and x[2] == (rows[2][0], 4096, -1)
    assert [d[0] for d in x] == [r[0] for r in rows]
    assert x.getType() == kn.nixl_mem_t.DRAM_SEG and not x.isEmpty() and x
    assert agent.deserialize_descs(agent.get_serialized_descs(x)) == x
    with pytest.raises(IndexError):
        x[4]
    r = agent.get_reg_descs([r + ("meta",) for r in rows], "DRAM")
    assert r[0][3] == b"meta" and len(r.trim()) == 4
    empty = agent.get_xfer_descs([], "DRAM")
    assert empty and len(empty) == 0 and empty.isEmpty()     # truthy, as NIXL's lists
    built = kn.nixlXferDList(kn.nixl_mem_t.DRAM_SEG, np.array(rows, np.uint64))
    built.append((buf.ctypes.data, 8, 0))
    assert len(built) == 5


class _Evil:
    """A pickle that runs a command when loaded (what a hostile peer sends)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_deserialize_descs_takes_descriptors_not_code(agent, tmp_path):
    """Engines send get_serialized_descs's bytes to the peer, which passes
    what arrives to deserialize_descs: NIXL unpickles it as it is, so a
    hostile peer runs code in the engine. kvlane rebuilds descriptor lists,
    plain rows and NumPy arrays, and refuses anything that names other code,
    saying what it named."""
    import pickle
    x = agent.get_xfer_descs([(4096 * i, 4096, 0) for i in range(1, 5)], "VRAM")
    r = agent.get_reg_descs([(8192, 4096, 1, "meta")], "DRAM")
    rows = np.array([[4096, 4096, 0], [8192, 4096, 0]], dtype=np.uint64)
    for obj in (x, r, [(1, 2, 0)], rows, [x, r]):
        back = agent.deserialize_descs(agent.get_serialized_descs(obj))
        if isinstance(obj, np.ndarray):
            assert (back == obj).all() and back.dtype == obj.dtype
        else:
            assert back == obj
    assert agent.deserialize_descs(pickle.dumps(r, protocol=2)) == r      # bytes via _codecs
    assert agent.deserialize_descs(bytearray(agent.get_serialized_descs(x))) == x
    marker = tmp_path / "ran"
    for evil in (_Evil(marker), [x, _Evil(marker)], {"descs": _Evil(marker)}):
        with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
            agent.deserialize_descs(pickle.dumps(evil))
    with pytest.raises(pickle.UnpicklingError, match="collections.OrderedDict"):
        import collections
        agent.deserialize_descs(pickle.dumps(collections.OrderedDict(a=1)))
    assert not marker.exists()
    with pytest.raises(TypeError, match="bytes get_serialized_descs returned"):
        agent.deserialize_descs("not bytes")
    with pytest.raises(pickle.UnpicklingError):
        agent.deserialize_descs(b"garbage")


def test_hicache_replaces_the_inner_agent(uniq):
    sys.path.insert(0, NIXL_PATH)
    try:
        from nixl._api import nixl_agent as na, nixl_agent_config as nc, nixlBind
    finally:
        sys.path.remove(NIXL_PATH)
    sync_mode = getattr(nixlBind, "NIXL_THREAD_SYNC_RW", nixlBind.NIXL_THREAD_SYNC_STRICT)
    conf = nc(backends=[])
    a = na(uniq, conf)
    old = a.agent
    try:
        cfg = nixlBind.nixlAgentConfig()
        cfg.useProgThread = conf.enable_pthread
        cfg.syncMode = sync_mode
        a.agent = nixlBind.nixlAgent(uniq, cfg)
        a.plugin_list = a.agent.getAvailPlugins()
        assert "UCX" in a.plugin_list
        a.create_backend("UCX")
        assert a.agent.backends() == kn.transport_set()
    finally:
        a.close()
        old.close()


def test_rdma_usable_from_the_device_scan(tmp_path, monkeypatch):
    """The transport set takes kvlane's ucx only when an RDMA device opens and
    has an ACTIVE port, read by the scan kvlane doctor uses."""
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    monkeypatch.setenv("KVL_SYSFS_ROOT", str(sysfs))
    monkeypatch.setenv("KVL_DEV_ROOT", str(dev))
    assert kvlane._kvlane.rdma_usable() is False          # no device at all
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("1: DOWN\n")
    verbs = sysfs / "class/infiniband_verbs/uverbs0"
    verbs.mkdir(parents=True)
    (verbs / "ibdev").write_text("mlx5_0\n")
    (dev / "infiniband").mkdir(parents=True)
    (dev / "infiniband/uverbs0").write_text("")
    assert kvlane._kvlane.rdma_usable() is False          # port down
    (port / "state").write_text("4: ACTIVE\n")
    assert kvlane._kvlane.rdma_usable() is True
    (dev / "infiniband/uverbs0").unlink()
    assert kvlane._kvlane.rdma_usable() is False          # listed, no node
