"""kvlane.nixl: NIXL's Python agent API end to end between two processes."""

import pickle
import time

import numpy as np
import pytest

import kvlane
from kvlane.nixl import nixl_agent, nixl_agent_config, nixl_xfer_telemetry
from kvlpattern import pattern, SIZE


def _wait(agent, handle, timeout=10):
    t0 = time.time()
    while True:
        s = agent.check_xfer_state(handle)
        if s != "PROC" or time.time() - t0 > timeout:
            return s
        time.sleep(0.0005)


@pytest.fixture
def pair(uniq, peer_factory):
    peer = peer_factory(uniq + "-decode", "nixl")
    agent = nixl_agent(uniq, nixl_agent_config(backends=["UCX"], capture_telemetry=True))
    yield agent, peer
    agent.close()


def test_plugins_and_config(uniq):
    a = nixl_agent(uniq)          # default config: UCX, kvlane's transport set
    try:
        assert "SHM" in a.get_plugin_list() and "UCX" in a.get_plugin_list()
        assert list(a.backends) == ["UCX"]
        assert "shm" in a.agent.backends()
        assert isinstance(a.get_plugin_params("SHM"), dict)
        assert a.get_backend_params("UCX") == a.get_plugin_params("UCX")
        assert a.get_plugin_mem_types("SHM") == ["DRAM"]
        assert a.get_plugin_params("NOPE") == {}
    finally:
        a.close()
    a = nixl_agent(uniq, nixl_agent_config(backends=["SHM"]))   # a kvlane name forces one
    try:
        assert a.agent.backends() == ["shm"]
        assert a.get_backend_params("SHM") == a.get_plugin_params("SHM")
    finally:
        a.close()
    c = nixl_agent_config(True, False, 0, ["SHM"])   # older positional order
    assert c.backends == ["SHM"]
    c = nixl_agent_config(backends=["UCX"], num_threads=4, capture_telemetry=True)
    assert c.num_threads == 4 and c.capture_telemetry


def test_end_to_end_prepped(pair):
    a, peer = pair
    local = np.zeros(SIZE, np.uint8)
    reg = a.register_memory([(local.ctypes.data, SIZE, 3, "")], "DRAM")   # dev = TP rank
    assert reg and len(reg) == 1 and reg.report.ok
    name = a.add_remote_agent(peer.call("md"))
    assert name == peer.name.encode() and isinstance(name, bytes)
    assert a.check_remote_metadata(name) and a.check_remote_metadata(peer.name)
    a.make_connection(name)
    raddr = peer.call("addr")
    bs, nb = 4096, 128
    ldescs = np.stack([local.ctypes.data + np.arange(nb) * bs, np.full(nb, bs),
                       np.zeros(nb)], axis=1).astype(np.int64)
    rdescs = [(raddr + i * bs, bs, 0) for i in range(nb)]
    lh = a.prep_xfer_dlist("NIXL_INIT_AGENT", ldescs, "DRAM")
    rh = a.prep_xfer_dlist(name, a.get_xfer_descs(rdescs, "DRAM"), "DRAM")
    assert lh and rh and len(lh) == nb
    exp = pattern(7).reshape(-1, bs)
    got = local.reshape(-1, bs)
    for li, ri in ((np.array([0, 1, 2], np.int32), np.array([7, 8, 9], np.int32)),
                   (np.array([5, 6], np.int64), np.array([100, 101], np.int64)),
                   ([10, 11, 12], [1, 2, 3])):
        local[:] = 0
        h = a.make_prepped_xfer("READ", lh, li, rh, ri, notif_msg=b"")
        assert h
        assert a.transfer(h) in ("PROC", "DONE")
        assert _wait(a, h) == "DONE"
        assert np.array_equal(got[list(li)], exp[list(ri)])
        tel = a.get_xfer_telemetry(h)
        assert isinstance(tel, nixl_xfer_telemetry)
        assert tel.totalBytes == len(li) * bs and tel.descCount == len(li)
        assert tel.startTime > 0 and tel.xferDuration >= 0 and tel.postDuration >= 0
        assert a.query_xfer_backend(h) == "SHM"
        a.release_xfer_handle(h)
        assert not h
    # WRITE with a notification; the decode side sees it keyed by our name.
    local[:] = pattern(3)
    h = a.make_prepped_xfer("WRITE", lh, [0, 1], rh, [4, 5], notif_msg=b"req-1")
    a.transfer(h)
    assert _wait(a, h) == "DONE"
    notifs = peer.call("nixl_notifs", 1, 10)
    assert notifs == {a.name: [b"req-1"]}
    # transfer() may replace the message (NIXL allows it per posting).
    assert a.transfer(h, b"req-2") in ("PROC", "DONE")
    assert _wait(a, h) == "DONE"
    assert peer.call("nixl_notifs", 1, 10) == {a.name: [b"req-2"]}
    wrote = np.frombuffer(peer.call("bytes", 4 * bs, 2 * bs), np.uint8)
    assert np.array_equal(wrote, local[:2 * bs])
    a.release_xfer_handle(h)
    a.release_dlist_handle(lh)
    a.release_dlist_handle(rh)
    assert not lh and not rh
    a.remove_remote_agent(name)
    assert not a.check_remote_metadata(name)
    a.deregister_memory(reg)


def test_initialize_xfer_and_notifs(pair):
    a, peer = pair
    t = np.zeros(SIZE // 4, np.float32)
    reg = a.register_memory([(t.ctypes.data, t.nbytes, 0, "")], "DRAM")
    assert reg.mem_type == "DRAM"
    name = a.add_remote_agent(peer.call("md"))
    peer.call("load", a.get_agent_metadata())
    raddr = peer.call("addr")
    src = a.get_xfer_descs([(t.ctypes.data, 65536, 0)], "DRAM")
    dst = a.get_xfer_descs([(raddr, 65536, 0)], "DRAM")
    assert src and len(dst) == 1 and len(a.get_xfer_descs([], "DRAM")) == 0
    h = a.initialize_xfer("READ", src, dst, name, b"read-done")
    assert h and a.transfer(h) in ("PROC", "DONE")
    assert _wait(a, h) == "DONE"
    assert np.array_equal(t.view(np.uint8)[:65536], pattern(7)[:65536])
    assert peer.call("nixl_notifs", 1, 10) == {a.name: [b"read-done"]}
    a.release_xfer_handle(h)
    # Standalone notifications, both directions, bytes names accepted.
    a.send_notif(name, b"hello")
    a.send_notif(peer.name, "as-str")
    assert peer.call("nixl_notifs", 2, 10) == {a.name: [b"hello", b"as-str"]}
    peer.call("send", a.name, b"from-decode")
    t0 = time.time()
    while not a.check_remote_xfer_done(peer.name, b"from-") and time.time() - t0 < 10:
        time.sleep(0.001)
    assert a.get_new_notifs() == {}
    # Descriptor lists pickle.
    d2 = a.deserialize_descs(a.get_serialized_descs(src))
    assert d2.descs() == src.descs()
    assert pickle.loads(pickle.dumps(reg)).descs() == reg.descs()


def test_errors_and_err_state(pair):
    a, peer = pair
    local = np.zeros(SIZE, np.uint8)
    a.register_memory([(local.ctypes.data, SIZE, 0, "")], "DRAM")
    name = a.add_remote_agent(peer.call("md"))
    raddr = peer.call("addr")
    with pytest.raises(kvlane.OutOfBounds):
        a.initialize_xfer("READ", a.get_xfer_descs([(local.ctypes.data, 8192, 0)], "DRAM"),
                          a.get_xfer_descs([(raddr + SIZE - 4096, 8192, 0)], "DRAM"), name)
    with pytest.raises(kvlane.NotFound):
        a.prep_xfer_dlist(b"nobody", [(raddr, 4096, 0)], "DRAM")
    with pytest.raises(kvlane.UsageError):
        a.make_prepped_xfer("MOVE", None, [], None, [])
    with pytest.raises(kvlane.UnsupportedError):
        a.get_xfer_descs([(raddr, 4096, 0)], "OBJ")
    with pytest.raises(kvlane.UnsupportedError):
        a.send_local_metadata()           # no central store
    # A transfer cancelled by removing the peer raises, as NIXL does, with the
    # error also kept on the handle.
    h = a.initialize_xfer("READ", a.get_xfer_descs([(local.ctypes.data, SIZE, 0)], "DRAM"),
                          a.get_xfer_descs([(raddr, SIZE, 0)], "DRAM"), name)
    a.transfer(h)
    a.remove_remote_agent(name)
    try:
        state = _wait(a, h)
        assert state == "DONE"
    except kvlane.Error as e:
        assert h.error is e
    a.release_xfer_handle(h)


def test_loopback(uniq):
    a = nixl_agent(uniq, nixl_agent_config(backends=["UCX"]))
    try:
        src = pattern(5)
        dst = np.zeros(SIZE, np.uint8)
        a.register_memory([(src.ctypes.data, SIZE, 0), (dst.ctypes.data, SIZE, 0)], "DRAM")
        lh = a.prep_xfer_dlist("", [(src.ctypes.data, SIZE, 0)], "DRAM")
        rh = a.prep_xfer_dlist(a.name, [(dst.ctypes.data, SIZE, 0)], "DRAM")
        h = a.make_prepped_xfer("WRITE", lh, [0], rh, [0])
        a.transfer(h)
        assert _wait(a, h) == "DONE"
        assert np.array_equal(src, dst)
    finally:
        a.close()


def test_listener_metadata(uniq, peer_factory):
    if not kvlane.listener_built():
        pytest.skip("libkvlane was built without the agent listener (kvlane/listener.h)")
    peer = peer_factory(uniq + "-lst", "nixl", ("listen",))
    host, port = peer.call("listen_address").rsplit(":", 1)
    a = nixl_agent(uniq, nixl_agent_config(enable_listen_thread=True, listen_port=0))
    try:
        a.fetch_remote_metadata(peer.name, "127.0.0.1", int(port))
        assert a.check_remote_metadata(peer.name)
        a.send_local_metadata("127.0.0.1", int(port))
        a.send_notif(peer.name, b"x")
        assert peer.call("nixl_notifs", 1, 10) == {a.name: [b"x"]}
        a.invalidate_local_metadata("127.0.0.1", int(port))
    finally:
        a.close()
