"""FILE memory through kvlane.nixl, in the shapes LMCache's NIXL storage
backend and SGLang's HiCache NIXL storage call it: files opened by the
engine (fd mode) or by the library (HiCache's path mode, probed first),
DRAM <-> file transfers whose remote side is the agent's own name,
query_memory for files. On a real file system (pytest's tmp_path); the
O_DIRECT cases skip, saying why, where the file system refuses it."""

import os
import sys
import uuid

import numpy as np
import pytest

import kvlane
import kvlane.nixl as kn
from kvlane.errors import nixlBackendError

HERE = os.path.dirname(os.path.abspath(__file__))
NIXL_PATH = os.environ.get("KVL_NIXL_PATH") or os.path.join(
    os.environ.get("KVL_BUILD", os.path.join(HERE, "..", "..", "build")), "python-nixl")


def _nixl_api():
    """nixl._api as engines import it (the drop-in package)."""
    sys.path.insert(0, NIXL_PATH)
    try:
        import nixl._api as api
    finally:
        sys.path.remove(NIXL_PATH)
    return api


def _wait(agent, h):
    state = agent.transfer(h)
    while state not in ("DONE", "ERR"):
        state = agent.check_xfer_state(h)
    return state


def _direct_ok(d):
    try:
        fd = os.open(os.path.join(d, ".probe"), os.O_CREAT | os.O_RDWR | os.O_DIRECT)
    except OSError as e:
        return str(e)
    os.close(fd)
    return None


# ---- LMCache: a pool of files opened at start, prepped lists, indices ----------------------

@pytest.mark.parametrize("direct", [False, True])
def test_lmcache_storage_shape(tmp_path, direct):
    if direct and _direct_ok(str(tmp_path)):
        pytest.skip(f"{tmp_path} refuses O_DIRECT: {_direct_ok(str(tmp_path))}")
    api = _nixl_api()
    name = "NixlAgent_" + uuid.uuid4().hex
    agent = api.nixl_agent(name, api.nixl_agent_config(backends=["POSIX"]))
    try:
        page, pool = 64 * 1024, 8
        # the allocator's buffer: page-aligned (LMCache allocates it aligned)
        raw = np.zeros(page * (pool + 1), np.uint8)
        off = (-raw.ctypes.data) % 4096
        buf = raw[off:off + page * pool]
        flags = os.O_CREAT | os.O_RDWR | (os.O_DIRECT if direct else 0)
        fds = [os.open(str(tmp_path / f"obj_{i}_{uuid.uuid4().hex[:4]}.bin"), flags)
               for i in range(pool)]
        reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], mem_type="DRAM")
        xfer = [(a, page, 0) for a in range(buf.ctypes.data, buf.ctypes.data + buf.nbytes, page)]
        mem_h = agent.prep_xfer_dlist("", agent.get_xfer_descs(xfer, mem_type="DRAM"),
                                      mem_type="DRAM")
        freg = agent.register_memory([(0, page, fd, "") for fd in fds], mem_type="FILE")
        file_h = agent.prep_xfer_dlist(name, [(0, page, fd) for fd in fds], mem_type="FILE")
        for i in range(pool):
            buf[i * page:(i + 1) * page] = (np.arange(page) * (i + 3)) % 251
        want = buf.copy()
        mem_idx, file_idx = [0, 3, 5, 7], [6, 1, 2, 0]
        h = agent.make_prepped_xfer("WRITE", mem_h, mem_idx, file_h, file_idx)
        assert _wait(agent, h) == "DONE"
        assert agent.query_xfer_backend(h) == "POSIX"
        agent.release_xfer_handle(h)
        for m, f in zip(mem_idx, file_idx):
            assert os.pread(fds[f], page, 0) == want[m * page:(m + 1) * page].tobytes() \
                if not direct else os.fstat(fds[f]).st_size == page
        buf[:] = 0
        h = agent.make_prepped_xfer("READ", mem_h, [1, 2, 4, 6], file_h, file_idx)
        assert _wait(agent, h) == "DONE"
        agent.release_xfer_handle(h)
        for got, m in zip([1, 2, 4, 6], mem_idx):
            assert np.array_equal(buf[got * page:(got + 1) * page], want[m * page:(m + 1) * page])
        # reading a pool file that was never written: the short file is named
        h = agent.make_prepped_xfer("READ", mem_h, [0], file_h, [4])
        with pytest.raises(kvlane.Error, match="short file"):
            _wait(agent, h)
        agent.release_xfer_handle(h)
        agent.release_dlist_handle(file_h)
        agent.release_dlist_handle(mem_h)
        agent.deregister_memory(freg)
        agent.deregister_memory(reg)
        for fd in fds:
            os.close(fd)
    finally:
        agent.close()


# ---- SGLang HiCache: per-transfer registration, fd mode and path mode --------------------

def _hicache_agent(api, plugin="POSIX"):
    name = f"hicache_nixl_{uuid.uuid4()}"
    agent = api.nixl_agent(name, api.nixl_agent_config(backends=[]))
    plugins = agent.get_plugin_list()
    # HiCache's auto selection: the first file plugin the agent lists
    chosen = next(p for p in ["3FS", "POSIX", "GDS_MT", "GDS"] if p in plugins) \
        if plugin == "auto" else plugin
    agent.create_backend(chosen, {})
    return agent, name, chosen


def _probe_path_mode(agent):
    """HiCache's probe: an error from this registration means path mode."""
    reg_descs = agent.get_reg_descs([(0, 4096, 1, "rw:/nonexistent-nixl-probe")], "FILE")
    try:
        reg = agent.register_memory(reg_descs)
        agent.deregister_memory(reg)
        return False
    except Exception:
        return True


def test_hicache_fd_mode_and_query(tmp_path):
    api = _nixl_api()
    agent, name, chosen = _hicache_agent(api, "auto")
    try:
        assert chosen == "POSIX"
        page, n = 16 * 1024, 6
        host = np.zeros(page * n, np.uint8)
        host[:] = np.random.default_rng(5).integers(0, 255, host.size, dtype=np.uint8)
        want = host.copy()
        agent.register_memory([(host.ctypes.data, host.nbytes, 0, "")], "DRAM")
        keys = [str(tmp_path / f"key{i}_model_0_1") for i in range(n)]
        host_descs = agent.get_xfer_descs(
            [(host.ctypes.data + i * page, page, 0) for i in range(n)], "DRAM")
        # exists? none yet
        assert agent.query_memory([(0, 0, 0, k) for k in keys], chosen, mem_type="FILE") == \
            [None] * n

        def storage(direction):
            flags = os.O_RDWR | (os.O_CREAT if direction == "WRITE" else 0)
            fds = [os.open(k, flags, 0o644) for k in keys]
            reg = agent.register_memory(
                agent.get_reg_descs([(0, page, fds[i], keys[i]) for i in range(n)], "FILE"))
            return fds, reg, agent.get_xfer_descs([(0, page, fd) for fd in fds], "FILE")

        for direction in ("WRITE", "READ"):
            fds, reg, file_descs = storage(direction)
            h = agent.initialize_xfer(direction, host_descs, file_descs, name)
            assert _wait(agent, h) == "DONE"
            agent.release_xfer_handle(h)
            agent.deregister_memory(reg)
            for fd in fds:
                os.close(fd)
            if direction == "WRITE":
                host[:] = 0
        assert np.array_equal(host, want)
        got = agent.query_memory([(0, 0, 0, k) for k in keys] +
                                 [(0, 0, 0, str(tmp_path / "missing"))], chosen, mem_type="FILE")
        assert [g is not None for g in got] == [True] * n + [False]
        assert got[0]["size"] == str(page)
        # the agent never loaded itself as a remote: files need no loopback
        assert not agent.check_remote_metadata(name)
    finally:
        agent.close()


@pytest.mark.parametrize("direct", [False, True])
def test_hicache_path_mode(tmp_path, direct):
    if direct and _direct_ok(str(tmp_path)):
        pytest.skip(f"{tmp_path} refuses O_DIRECT: {_direct_ok(str(tmp_path))}")
    api = _nixl_api()
    agent, name, chosen = _hicache_agent(api, "POSIX")
    try:
        assert _probe_path_mode(agent)          # kvlane opens files for path-mode entries
        page, n = 8192, 4
        raw = np.zeros(page * (n + 1), np.uint8)
        off = (-raw.ctypes.data) % 4096
        host = raw[off:off + page * n]
        host[:] = np.arange(host.size) % 253
        want = host.copy()
        agent.register_memory([(host.ctypes.data, host.nbytes, 0, "")], "DRAM")
        host_descs = agent.get_xfer_descs(
            [(host.ctypes.data + i * page, page, 0) for i in range(n)], "DRAM")
        keys = [str(tmp_path / "bucket" / f"k{i}") for i in range(n)]
        before = len(os.listdir("/proc/self/fd"))
        for direction, dev0 in (("WRITE", 1), ("READ", 1 + n)):
            parts = ["rw", "create"] if direction == "WRITE" else ["ro"]
            if direct:
                parts.append("direct")
            spec = ",".join(parts)
            reg = agent.register_memory(agent.get_reg_descs(
                [(0, page, dev0 + i, f"{spec}:{keys[i]}") for i in range(n)], "FILE"))
            h = agent.initialize_xfer(direction, host_descs, reg.trim(), name)
            assert _wait(agent, h) == "DONE"
            agent.release_xfer_handle(h)
            agent.deregister_memory(reg)
            if direction == "WRITE":
                host[:] = 0
        assert np.array_equal(host, want)
        assert len(os.listdir("/proc/self/fd")) == before      # kvlane closed what it opened
        # an id already used by a live path-mode registration is refused
        reg = agent.register_memory(agent.get_reg_descs([(0, page, 77, f"ro:{keys[0]}")], "FILE"))
        with pytest.raises(kvlane.InvalidArgument, match="already uses"):
            agent.register_memory(agent.get_reg_descs([(0, page, 77, f"ro:{keys[1]}")], "FILE"))
        agent.deregister_memory(reg)
        # a missing file without create: NIXL's backend error, with the fix
        with pytest.raises(nixlBackendError, match="cannot open"):
            agent.register_memory(agent.get_reg_descs(
                [(0, page, 90, f"ro:{tmp_path / 'absent'}")], "FILE"))
    finally:
        agent.close()


# ---- names, parameters, errors -----------------------------------------------------------

def test_file_backend_names_and_params(tmp_path, caplog):
    for nm in ("POSIX", "GDS", "GDS_MT"):
        a = kn.nixl_agent(f"files-{nm}-{uuid.uuid4().hex[:6]}", kn.nixl_agent_config(backends=[]))
        try:
            a.create_backend(nm, {"use_uring": "false", "batch_pool_size": "32"} if nm != "POSIX"
                             else {"use_uring": "false"})
            assert a.agent.backends() == ["posix"]
            assert a.get_backend_mem_types(nm) == ["DRAM", "VRAM", "FILE"]
            assert a.get_backend_params(nm)["engine"] == "threads"
            fd = os.open(str(tmp_path / f"{nm}.bin"), os.O_CREAT | os.O_RDWR)
            buf = np.arange(4096, dtype=np.uint8)
            a.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM")
            reg = a.register_memory([(0, 4096, fd, "")], "FILE")
            h = a.initialize_xfer("WRITE", a.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM"),
                                  a.get_xfer_descs([(0, 4096, fd)], "FILE"), a.name)
            assert _wait(a, h) == "DONE"
            assert a.get_xfer_telemetry  # exists; telemetry is off by default
            assert a.query_xfer_backend(h) == "POSIX"
            a.release_xfer_handle(h)
            assert os.pread(fd, 4096, 0) == buf.tobytes()
            a.deregister_memory(reg)
            os.close(fd)
        finally:
            a.close()


def test_file_errors(tmp_path):
    a = kn.nixl_agent("files-err-" + uuid.uuid4().hex[:6], kn.nixl_agent_config(backends=["POSIX"]))
    try:
        buf = np.zeros(8192, np.uint8)
        a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
        # a descriptor that is not open
        with pytest.raises(nixlBackendError, match="not an open file descriptor"):
            a.register_memory([(0, 4096, 99999, "")], "FILE")
        # a pipe is no file
        r, w = os.pipe()
        with pytest.raises(nixlBackendError, match="not a regular file"):
            a.register_memory([(0, 4096, r, "")], "FILE")
        os.close(r), os.close(w)
        # writing through a read-only descriptor is said before anything moves
        path = str(tmp_path / "ro.bin")
        with open(path, "wb") as f:
            f.write(b"x" * 8192)
        ro = os.open(path, os.O_RDONLY)
        a.register_memory([(0, 8192, ro, "")], "FILE")
        with pytest.raises(kvlane.Error, match="read-only"):
            h = a.initialize_xfer("WRITE", a.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM"),
                                  a.get_xfer_descs([(0, 4096, ro)], "FILE"), a.name)
            _wait(a, h)
        # a FILE descriptor outside the registration names fd and offset
        with pytest.raises(kvlane.Error, match=f"fd {ro}, offset 65536"):
            a.initialize_xfer("READ", a.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM"),
                              a.get_xfer_descs([(65536, 4096, ro)], "FILE"), a.name)
        # files of another agent cannot be reached
        with pytest.raises(kvlane.Error):
            a.initialize_xfer("READ", a.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM"),
                              a.get_xfer_descs([(0, 4096, ro)], "FILE"), "someone-else")
        # closing a registered fd and reopening another file under the same
        # number: registering the same range again is refused as stale
        os.close(ro)
        other = os.open(str(tmp_path / "other.bin"), os.O_CREAT | os.O_RDWR)
        if other == ro:
            with pytest.raises(nixlBackendError, match="now names another file"):
                a.register_memory([(0, 8192, other, "")], "FILE")
        a.deregister_memory(a.get_reg_descs([(0, 8192, ro, "")], "FILE"))
        os.close(other)
        if not _direct_ok(str(tmp_path)):
            d = os.open(str(tmp_path / "d.bin"), os.O_CREAT | os.O_RDWR | os.O_DIRECT)
            a.register_memory([(0, 8192, d, "")], "FILE")
            with pytest.raises(kvlane.Error, match="not aligned for O_DIRECT"):
                h = a.initialize_xfer("WRITE", a.get_xfer_descs([(buf.ctypes.data + 1, 4096, 0)], "DRAM"),
                                      a.get_xfer_descs([(0, 4096, d)], "FILE"), a.name)
                _wait(a, h)
            os.close(d)
    finally:
        a.close()


# ---- the kvlane API -------------------------------------------------------------------------

def test_kvlane_api_files(tmp_path):
    a = kvlane.Agent("files-core-" + uuid.uuid4().hex[:6], backends=("posix",))
    try:
        n = 1 << 20
        src = np.arange(n, dtype=np.uint8) * 7
        dst = np.zeros(n, np.uint8)
        fd = os.open(str(tmp_path / "core.bin"), os.O_CREAT | os.O_RDWR)
        a.register_memory(src)
        a.register_memory(dst)
        rep = a.register_memory([(0, n, fd)], kind="FILE")
        assert "page cache" in str(rep) and "core.bin" in str(rep)
        f = kvlane.DList("FILE")
        f.add(0, n, fd)
        x = a.xfer("WRITE", kvlane.DList.from_descs([(src.ctypes.data, n, -1)]), a.name, f)
        x.post()
        assert x.wait(30000) is True and x.state == "DONE"
        assert x.stats()["backend"] == "posix"
        y = a.xfer("READ", kvlane.DList.from_descs([(dst.ctypes.data, n, -1)]), a.name, f)
        y.post()
        assert y.wait(30000) is True
        assert np.array_equal(src, dst)
        x.release(), y.release()
        a.deregister_memory([(0, n, fd)])
        os.close(fd)
    finally:
        a.close()
