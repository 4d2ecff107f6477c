"""kvlane's Python module: registration, descriptor lists, transfers between
two processes, notifications, metadata and errors."""

import numpy as np
import pytest

import kvlane

from kvlpattern import pattern

SIZE = 1 << 20


def test_import_and_backends():
    assert "shm" in kvlane.backend_names()
    ok, reason = kvlane.backend_available("shm")
    assert ok, reason
    assert isinstance(kvlane.backend_params("shm"), dict)
    assert kvlane.__version__


def test_register_forms_and_report(uniq):
    with kvlane.Agent(uniq) as a:
        arr = np.zeros(SIZE, dtype=np.uint8)
        rep = a.register_memory(arr)
        assert rep.ok and len(rep) == 1
        e = rep.entries[0]
        assert e.addr == arr.ctypes.data and e.len == SIZE and e.kind == "DRAM"
        assert e.backends == ["shm"] and e.outcomes[0].ok and not e.reused
        assert "registered" in str(rep) and "shm" in str(rep)
        # Again: reference counted.
        assert a.register_memory(arr).entries[0].reused
        a.deregister_memory(arr)
        a.deregister_memory(arr)
        # Tuples, lists of tuples (one all-or-nothing call), buffers.
        ba = bytearray(8192)
        addr, n, ro = kvlane._kvlane.buffer_info(ba)
        assert n == 8192 and not ro
        rep = a.register_memory([(addr, 4096, -1), (addr + 4096, 4096, -1)])
        assert len(rep) == 2 and rep.ok
        a.deregister_memory([(addr, 4096, -1), (addr + 4096, 4096, -1)])
        assert a.register_memory(ba).ok
        a.deregister_memory(ba)
        assert a.register_memory((arr.ctypes.data, 4096)).ok
        # A list of objects.
        two = [np.ones(4096, np.uint8), np.ones(8192, np.uint8)]
        assert len(a.register_memory(two, kind="DRAM")) == 2
        a.deregister_memory(two)


def test_register_again_names_backends(uniq):
    """A range registered again is the same registration (counted), not a
    new one: backends named the second time must exist and already hold it.
    One it does not reach yet is refused (it was once counted as done and
    only the transfer said "not registered on it"), and so is a name that is
    no backend; the refusal undoes the rest of its list."""
    with kvlane.Agent(uniq, backends=("shm", "tcp")) as a:
        arr = np.zeros(SIZE, dtype=np.uint8)
        other = np.zeros(4096, dtype=np.uint8)
        assert a.register_memory(arr, backends=["shm"]).entries[0].backends == ["shm"]
        with pytest.raises(kvlane.errors.StateError,
                           match=r"already registered \(1 time\(s\)\) on shm; registering "
                                 r"it again does not add tcp"):
            a.register_memory(arr, backends=["tcp"])
        with pytest.raises(kvlane.errors.StateError, match="does not add tcp"):
            a.register_memory(arr, backends=["shm", "tcp"], strict=True)
        with pytest.raises(kvlane.errors.NotFound, match="'bogus'"):
            a.register_memory(arr, backends=["bogus"])
        with pytest.raises(kvlane.errors.StateError):
            a.register_memory([other, arr], backends=["tcp"])   # all or nothing
        assert a.register_memory(other, backends=["tcp"]).entries[0].reused is False
        a.deregister_memory(other)
        e = a.register_memory(arr, backends=["shm"]).entries[0]
        assert e.reused and e.backends == ["shm"]
        assert a.register_memory(arr).entries[0].reused       # no names: the same one
        for _ in range(3):
            a.deregister_memory(arr)
        # once gone, it registers anew on what is named
        assert a.register_memory(arr, backends=["shm", "tcp"]).entries[0].backends == \
            ["shm", "tcp"]
        a.deregister_memory(arr)


class FakeDevice:
    def __init__(self, type_, index=None):
        self.type, self.index = type_, index


class FakeTensor:
    """Duck-typed like a torch tensor (torch is never imported)."""

    def __init__(self, arr, device):
        self.arr, self.device = arr, device

    def data_ptr(self):
        return self.arr.ctypes.data

    def numel(self):
        return self.arr.size

    def element_size(self):
        return self.arr.itemsize

    def is_contiguous(self):
        return True


class FakeCuda:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (n,), "typestr": "<f2",
                                         "strides": None, "version": 3}


def test_memory_of_duck_types():
    arr = np.zeros(1024, np.float32)
    assert kvlane.memory_of(FakeTensor(arr, FakeDevice("cpu"))) == (
        arr.ctypes.data, 4096, -1, "DRAM")
    assert kvlane.memory_of(FakeTensor(arr, FakeDevice("cuda", 3))) == (
        arr.ctypes.data, 4096, 3, "VRAM")
    assert kvlane.memory_of(FakeCuda(0x1000, 10)) == (0x1000, 20, -1, "VRAM")
    assert kvlane.memory_of(arr) == (arr.ctypes.data, 4096, -1, "DRAM")
    with pytest.raises(kvlane.InvalidArgument) as ei:
        kvlane.memory_of(np.zeros((4, 4))[:, ::2])
    assert "contiguous" in str(ei.value)
    with pytest.raises(kvlane.UsageError):
        kvlane.memory_of(object())


def test_register_tensor_cpu(uniq):
    arr = np.zeros(4096, np.float16)
    t = FakeTensor(arr, FakeDevice("cpu"))
    with kvlane.Agent(uniq) as a:
        rep = a.register_memory(t)
        assert rep.entries[0].kind == "DRAM" and rep.entries[0].len == arr.nbytes
        a.deregister_memory(t)


def test_error_classes_and_attributes(uniq):
    with kvlane.Agent(uniq) as a:
        with pytest.raises(kvlane.DeviceMismatch) as ei:
            a.register_memory((np.zeros(4096, np.uint8).ctypes.data, 4096, 12345), kind="DRAM")
        e = ei.value
        assert isinstance(e, kvlane.UsageError) and isinstance(e, kvlane.Error)
        assert e.code == -105 and e.name == "KVL_ERR_DEVICE_MISMATCH"
        assert e.device == 12345 and e.hint and e.what
        assert str(e).startswith("KVL_ERR_DEVICE_MISMATCH")
        assert isinstance(e.causes, list)
        assert e.report is not None and not e.report.ok
        assert "12345" in str(e.report)
        with pytest.raises(kvlane.InvalidArgument):
            a.register_memory((0x1000, 0))
        with pytest.raises(kvlane.UsageError) as ei:
            a.deregister_memory((0x1000, 4096))
        assert ei.value.code in (-100, -101)
        with pytest.raises(kvlane.BadMetadata) as ei:
            a.load_metadata(b"garbage" * 10)
        assert isinstance(ei.value, kvlane.RemoteError)
        with pytest.raises(kvlane.NotFound) as ei:
            a.prep_remote("nobody", kvlane.DList())
        assert ei.value.agent == "nobody" or "nobody" in str(ei.value)
        assert a.check_remote("nobody") is False
        with pytest.raises(kvlane.NotFound):
            a.send_notif("nobody", b"x")
    with pytest.raises(kvlane.StateError):
        a.get_metadata()
    with pytest.raises(kvlane.UsageError):
        kvlane.Agent("bad name with spaces")
    assert issubclass(kvlane.Timeout, kvlane.OSFailure)
    assert kvlane.error_class(-303) is kvlane.Stale
    assert kvlane.error_class(-499) is kvlane.UnsupportedError


def test_error_pickles():
    import pickle
    e = kvlane.OutOfBounds("x", hint="y", device=3)
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is kvlane.OutOfBounds and e2.hint == "y" and e2.device == 3
    assert str(e2) == str(e)


def test_dlist_from_arrays():
    n = 1000
    addrs64 = np.arange(n, dtype=np.uint64) * 4096 + 0x10000
    for addrs in (addrs64, addrs64.astype(np.int64), addrs64.astype(np.int32),
                  addrs64.tolist()):
        dl = kvlane.DList.from_arrays(addrs, len=4096)
        assert len(dl) == n and dl.blocks == n and dl.bytes == n * 4096
        assert dl.get(5) == (0x10000 + 5 * 4096, 0, 1, 4096, -1)
    lens = np.full(n, 512, dtype=np.uint64)
    dl = kvlane.DList.from_arrays(addrs64, lens)
    assert dl.bytes == n * 512
    dl = kvlane.DList.from_strided(np.array([0x10000, 0x90000]), 0x1000, 8, 256)
    assert len(dl) == 2 and dl.blocks == 16 and dl.bytes == 16 * 256
    assert dl.get(1) == (0x90000, 0x1000, 8, 256, -1)
    d3 = np.array([[0x1000, 64, 0], [0x2000, 64, 0]], dtype=np.int64)
    dl = kvlane.DList.from_descs(d3)
    assert len(dl) == 2 and dl.get(1)[0] == 0x2000
    dl = kvlane.DList.from_descs([(0x1000, 64, 0), (0x3000, 32, 0)])
    assert dl.bytes == 96 and bool(dl) and not kvlane.DList()
    assert dl.entries() == [(0x1000, 0, 1, 64, 0), (0x3000, 0, 1, 32, 0)]
    with pytest.raises(ValueError):
        kvlane.DList.from_arrays(np.array([-1], dtype=np.int64), len=1)
    with pytest.raises(TypeError):
        kvlane.DList.from_arrays(np.zeros(3, dtype=np.float64), len=1)
    with pytest.raises(kvlane.UsageError):
        kvlane.DList.from_arrays([1, 2], [1])
    with pytest.raises(ValueError):
        kvlane.DList("HBM")


def _dlist_state(dl):
    return len(dl), dl.blocks, dl.bytes, dl.entries()


def _refused(dl, call, index, why):
    """call() is refused naming entry `index` of its input, and dl is left as it was."""
    before = _dlist_state(dl)
    with pytest.raises(kvlane.InvalidArgument) as ei:
        call()
    msg = str(ei.value)
    assert "entry %d: " % index in msg and why in msg and "nothing was added" in msg, msg
    assert _dlist_state(dl) == before


def test_dlist_refused_add_keeps_the_list():
    # add_descs with a table, add_descs with tuples and add_strided_array add
    # in several core calls; a refused one takes back what the earlier ones
    # added and names the entry by its index in the whole input.
    base = 0x100000
    dl = kvlane.DList()
    dl.add(0x1000, 64, 0)
    # (N, 3) table, three device runs, zero length in the second run (not its first entry)
    t = np.array([[base, 4096, 0], [base + 4096, 4096, 1], [base + 8192, 0, 1],
                  [base + 12288, 4096, 2]], dtype=np.int64)
    _refused(dl, lambda: dl.add_descs(t), 2, "zero length")
    t2 = t.copy()
    t2[3, 1] = 0  # in the last run
    t2[2, 1] = 4096
    _refused(dl, lambda: dl.add_descs(t2), 3, "zero length")
    t3 = t2.astype(np.uint64)
    t3[3] = [2**64 - 16, 4096, 2]  # addr + len wraps (-16 in an int64 table is refused)
    _refused(dl, lambda: dl.add_descs(t3), 3, "runs past the end of the address space")
    # (N, 2) table and a dev= override: one run
    t4 = np.array([[base, 4096], [base + 4096, 4096], [base + 8192, 0]], dtype=np.uint64)
    _refused(dl, lambda: dl.add_descs(t4, 0), 2, "zero length")
    _refused(dl, lambda: dl.add_descs(t, dev=3), 2, "zero length")
    # a list of tuples
    _refused(dl, lambda: dl.add_descs([(base, 4096, 0), (base + 4096, 4096, 1),
                                       (base + 8192, 0, 1)]), 2, "zero length")
    # one strided entry per base
    _refused(dl, lambda: dl.add_strided_array([base, base + 0x10000, 2**64 - 10], 64, 4, 32),
             2, "runs past the end of the address space")
    _refused(dl, lambda: dl.add_strided_array(np.array([base, base + 0x10000]), 16, 4, 32),
             0, "stride 16 < len 32")
    # FILE ranges: (offset, len, fd), the range checked by the core
    fl = kvlane.DList("FILE")
    fl.add(0, 4096, 3)
    _refused(fl, lambda: fl.add_descs(np.array([[0, 4096, 3], [4096, 4096, 4],
                                                [1 << 41, 4096, 4]], dtype=np.int64)),
             2, "ends past 1 TiB")
    _refused(fl, lambda: fl.add_descs([(0, 4096, 3), (1 << 41, 4096, 3)]), 1, "ends past 1 TiB")
    _refused(fl, lambda: fl.add_strided_array([0, 1 << 41], 4096, 2, 4096, 3), 1,
             "ends past 1 TiB")
    # what was accepted is all there, in order
    dl.add_descs(t2[:3])
    dl.add_descs([(base, 32, 5)])
    dl.add_strided_array([base, base + 0x10000], 64, 4, 32)
    assert len(dl) == 1 + 3 + 1 + 2 and dl.blocks == 1 + 3 + 1 + 8
    assert dl.entries()[1:4] == [(base, 0, 1, 4096, 0), (base + 4096, 0, 1, 4096, 1),
                                 (base + 8192, 0, 1, 4096, 1)]


def _connect(a, peer):
    name = a.load_metadata(peer.call("md"))
    assert name == peer.name and a.check_remote(name)
    regions = a.remote_regions(name)
    assert regions and regions[0][1] == SIZE and regions[0][3] == "DRAM"
    assert "shm" in a.describe_remote(name)
    return regions[0][0]


def test_two_process_read_write(uniq, peer_factory):
    peer = peer_factory(uniq + "-peer")
    with kvlane.Agent(uniq) as a:
        local = np.zeros(SIZE, np.uint8)
        a.register_memory(local)
        raddr = _connect(a, peer)
        # READ everything.
        x = a.xfer("READ", kvlane.DList.from_descs([(local.ctypes.data, SIZE, -1)]), peer.name,
                   kvlane.DList.from_descs([(raddr, SIZE, -1)]))
        assert bool(x) and x.state == "IDLE"
        x.post()
        assert x.wait(10000) is True and x.state == "DONE"
        assert np.array_equal(local, pattern(7))
        st = x.stats()
        assert st["bytes"] == SIZE and st["backend"] == "shm"
        x.release()
        assert not x
        # WRITE 64 blocks of 4 KiB in reverse order, from NumPy address arrays.
        local[:] = pattern(99)
        bs, nb = 4096, 64
        idx = np.arange(nb, dtype=np.uint64)
        src = kvlane.DList.from_arrays(local.ctypes.data + idx * bs, len=bs)
        dst = kvlane.DList.from_arrays(raddr + idx[::-1] * bs, len=bs)
        x = a.xfer(kvlane.WRITE, src, peer.name, dst, notif=b"w-done")
        x.post()
        assert x.wait(10000)
        got = np.frombuffer(peer.call("bytes", 0, nb * bs), np.uint8).reshape(nb, bs)
        assert np.array_equal(got[::-1], local[:nb * bs].reshape(nb, bs))
        assert peer.call("notifs", 1, 5000) == [(uniq, b"w-done")]
        # Re-post the same transfer.
        x.post()
        assert x.wait(10000)
        assert x.test() is True


def test_strided_and_prepped(uniq, peer_factory):
    peer = peer_factory(uniq + "-peer")
    with kvlane.Agent(uniq) as a:
        local = np.zeros(SIZE, np.uint8)
        a.register_memory(local)
        raddr = _connect(a, peer)
        # Layout [layer][block] with 8 layers of 32 blocks of 2 KiB: blocks 3 and 17 of
        # every layer are two strided entries.
        layers, blocks, bs = 8, 32, 2048
        lstride = blocks * bs
        rl = kvlane.DList.from_strided(np.array([raddr + 3 * bs, raddr + 17 * bs]), lstride,
                                       layers, bs)
        ll = kvlane.DList.from_strided(np.array([local.ctypes.data + 3 * bs,
                                                 local.ctypes.data + 17 * bs]), lstride,
                                       layers, bs)
        x = a.xfer("READ", ll, peer.name, rl)
        x.post()
        assert x.wait(10000)
        exp = pattern(7)[:layers * lstride].reshape(layers, blocks, bs)
        got = local[:layers * lstride].reshape(layers, blocks, bs)
        assert np.array_equal(got[:, [3, 17]], exp[:, [3, 17]])
        assert not got[:, 4].any()
        assert x.stats()["blocks"] == 2 * layers
        # Prepared lists and index arrays of every accepted form.
        local[:] = 0
        n = 64
        lp = a.prep(kvlane.DList.from_arrays(local.ctypes.data + np.arange(n) * 4096, len=4096))
        rp = a.prep(kvlane.DList.from_arrays(raddr + np.arange(n) * 4096, len=4096), peer.name)
        assert len(lp) == n and bool(rp) and rp.remote == peer.name
        exp = pattern(7).reshape(-1, 4096)
        got = local.reshape(-1, 4096)
        for li, ri in ((np.array([1, 2, 3], np.int32), np.array([5, 6, 7], np.int64)),
                       ([10, 11], [20, 21]), (np.array([30], np.uint64), (40,)),
                       (np.array([50, 51], np.uint16), np.array([52, 53], np.uint32)),
                       (np.array([60, 61, 62, 63], np.int8), np.array([0, 1, 2, 3], np.int16)),
                       (None, None)):
            local[:] = 0
            x = a.xfer_prepped("READ", lp, li, rp, ri)
            x.post()
            assert x.wait(10000)
            x.release()
            if li is None:
                li = ri = list(range(n))
            assert np.array_equal(got[list(li)], exp[list(ri)])
            assert not np.delete(got, list(li), axis=0).any()
        with pytest.raises(kvlane.UsageError) as ei:
            a.xfer_prepped("READ", lp, [0], rp, [n])
        assert str(n) in str(ei.value)
        with pytest.raises(kvlane.UsageError):
            a.xfer_prepped("READ", lp, [0, 1], rp, [0])
        # A negative entry of a narrow array is named, as of an int64 one.
        with pytest.raises(kvlane.UsageError, match="index 1 is -2"):
            a.xfer_prepped("READ", lp, np.array([1, -2, 3], np.int32), rp, [0, 1, 2])
        lp.release()
        assert not lp
        with pytest.raises(kvlane.StateError):
            a.xfer_prepped("READ", lp, [0], rp, [0])


def test_out_of_bounds_names_region(uniq, peer_factory):
    peer = peer_factory(uniq + "-peer")
    with kvlane.Agent(uniq) as a:
        local = np.zeros(SIZE, np.uint8)
        a.register_memory(local)
        raddr = _connect(a, peer)
        with pytest.raises(kvlane.OutOfBounds) as ei:
            a.xfer("READ", kvlane.DList.from_descs([(local.ctypes.data, 8192, -1)]), peer.name,
                   kvlane.DList.from_descs([(raddr + SIZE - 4096, 8192, -1)]))
        assert ei.value.hint and "0x" in str(ei.value)


def test_notifications_both_ways(uniq, peer_factory):
    peer = peer_factory(uniq + "-peer")
    with kvlane.Agent(uniq) as a:
        _connect(a, peer)
        peer.call("load", a.get_metadata())
        a.send(peer.name, b"ping")
        assert peer.call("notifs", 1, 5000) == [(uniq, b"ping")]
        peer.call("send", uniq, b"pong")
        assert a.wait_notif(5000)
        assert a.poll() == [(peer.name, b"pong")]
        assert a.wait_notif(10) is False
        assert a.poll() == []
        a.remove_remote(peer.name)
        assert not a.check_remote(peer.name)


def test_cancel_and_wait_timeout(uniq, peer_factory):
    peer = peer_factory(uniq + "-peer")
    with kvlane.Agent(uniq) as a:
        local = np.zeros(SIZE, np.uint8)
        a.register_memory(local)
        raddr = _connect(a, peer)
        x = a.xfer("READ", kvlane.DList.from_descs([(local.ctypes.data, SIZE, -1)]), peer.name,
                   kvlane.DList.from_descs([(raddr, SIZE, -1)]))
        x.post()
        state = x.cancel()
        assert state in ("CANCELED", "DONE")
        assert x.state == state
        x.release()
        with pytest.raises(kvlane.StateError):
            x.post()


def test_listener(uniq, peer_factory):
    if not kvlane.listener_built():
        pytest.skip("libkvlane was built without the agent listener (kvlane/listener.h)")
    peer = peer_factory(uniq + "-peer")
    hp = peer.call("listen")
    with kvlane.Agent(uniq) as a:
        assert a.fetch(hp) == peer.name
        assert a.check_remote(peer.name)
        a.push(hp)
        a.send(peer.name, b"via-listener")
        assert peer.call("notifs", 1, 5000) == [(uniq, b"via-listener")]
        a.invalidate(hp)
        mine = a.listen("127.0.0.1", 0)
        host, port = mine.rsplit(":", 1)
        assert int(port) > 0


def test_closed_agent_objects(uniq):
    a = kvlane.Agent(uniq)
    arr = np.zeros(4096, np.uint8)
    a.register_memory(arr)
    lp = a.prep(kvlane.DList.from_descs([(arr.ctypes.data, 4096, -1)]))
    assert lp
    a.close()
    assert a.closed and not lp
    lp.release()          # harmless after close
    a.close()             # idempotent
    with pytest.raises(kvlane.StateError):
        a.register_memory(arr)
    assert "closed" in repr(a)


def test_agent_used_after_fork_is_refused(uniq):
    """An agent belongs to the process that made it: a forked child using it
    gets a StateError naming the fork (the module notices the fork without
    a getpid per call, through an atfork handler), the parent goes on."""
    import os
    with kvlane.Agent(uniq) as a:
        arr = np.zeros(4096, dtype=np.uint8)
        a.register_memory(arr)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                a.get_metadata()
                code = 1
            except kvlane.StateError as e:
                code = 0 if "another process (fork)" in str(e) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert a.get_metadata()
        a.deregister_memory(arr)
