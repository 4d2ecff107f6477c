"""Partial agent metadata in NIXL's call shapes (get_partial_agent_metadata,
add_remote_agent, send_partial_agent_metadata to a listener): connection
info first, then regions one partial blob at a time, merged by the loader;
a transfer into a region not yet sent is refused; descriptors outside
registered memory are refused, never dropped."""

import time

import numpy as np
import pytest

import kvlane
from kvlane.nixl import nixl_agent, nixl_agent_config

N = 1 << 16


def _until(cond, seconds=30):
    """Poll cond (bounded: never hangs)."""
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def ab(uniq):
    conf = nixl_agent_config(backends=["UCX"])
    a = nixl_agent(uniq + "-a", conf)
    b = nixl_agent(uniq + "-b", conf)
    yield a, b
    b.close()
    a.close()


def _x(agent, buf):
    return agent.get_xfer_descs([(buf.ctypes.data, buf.nbytes, 0)], "DRAM")


def _write(b, src, dst_addr, target):
    h = b.initialize_xfer("WRITE", b.get_xfer_descs([(src.ctypes.data, src.nbytes, 0)], "DRAM"),
                          b.get_xfer_descs([(dst_addr, src.nbytes, 0)], "DRAM"), target)
    assert b.transfer(h) in ("DONE", "PROC")
    assert _until(lambda: b.check_xfer_state(h) == "DONE")
    b.release_xfer_handle(h)


def test_partial_merge_then_write(ab):
    a, b = ab
    r1, r2 = np.zeros(N, np.uint8), np.zeros(N, np.uint8)
    src = (np.arange(N) % 251).astype(np.uint8)
    reg = a.register_memory([(r1.ctypes.data, N, 0, ""), (r2.ctypes.data, N, 0, "")], "DRAM")
    b.register_memory([(src.ctypes.data, N, 0, "")], "DRAM")
    one = a.get_reg_descs([(r1.ctypes.data, N, 0, "")], "DRAM")
    two = [(r2.ctypes.data, N, 0)]                       # tuples work too

    # regions before connection info: refused, naming what to do
    with pytest.raises(kvlane.NotFound, match="carries no connection info") as ei:
        b.add_remote_agent(a.get_partial_agent_metadata(one))
    assert "inc_conn_info=True" in ei.value.hint
    assert not b.check_remote_metadata(a.name)

    # connection info only (empty descs), then region 1
    assert b.add_remote_agent(a.get_partial_agent_metadata([], True)) == a.name.encode()
    assert b.check_remote_metadata(a.name)
    assert not b.check_remote_metadata(a.name, _x(b, r1))
    b.add_remote_agent(a.get_partial_agent_metadata(one, False))
    assert b.check_remote_metadata(a.name, b.get_xfer_descs([(r1.ctypes.data, N, 0)], "DRAM"))
    assert not b.check_remote_metadata(a.name, b.get_xfer_descs(two, "DRAM"))
    _write(b, src, r1.ctypes.data, a.name)
    assert np.array_equal(r1, src)

    # region 2 is refused until its partial blob is loaded
    with pytest.raises(kvlane.Error, match="outside memory remote agent"):
        b.initialize_xfer("WRITE", b.get_xfer_descs([(src.ctypes.data, N, 0)], "DRAM"),
                          b.get_xfer_descs(two, "DRAM"), a.name)
    b.add_remote_agent(a.get_partial_agent_metadata(two, False, ["UCX"]))
    _write(b, src, r2.ctypes.data, a.name)
    assert np.array_equal(r2, src)
    # region 1 is still there, and the whole registration list works as descs
    assert b.check_remote_metadata(a.name, reg.trim())
    b.add_remote_agent(a.get_partial_agent_metadata(reg, True))


def test_partial_refusals(ab):
    a, b = ab
    r1 = np.zeros(N, np.uint8)
    a.register_memory([(r1.ctypes.data, N, 0, "")], "DRAM")
    stray = np.zeros(4096, np.uint8)
    with pytest.raises(kvlane.Error, match=r"descriptor 1 \(0x[0-9a-f]+\+4096, device -?\d+\) is "
                                           r"not inside a region registered on agent") as ei:
        a.get_partial_agent_metadata([(r1.ctypes.data, 8, 0), (stray.ctypes.data, 4096, 0)],
                                     True)
    assert isinstance(ei.value, kvlane.nixl.nixlNotFoundError)
    with pytest.raises(KeyError, match="not created"):
        a.get_partial_agent_metadata([], True, ["GDS"])
    # a blob of another agent is not ours to push
    with pytest.raises(kvlane.Error):
        a.agent.push_partial_metadata("127.0.0.1:1", b.get_partial_agent_metadata())


def test_partial_stale_and_deregistered(ab):
    a, b = ab
    r1, r2 = np.zeros(N, np.uint8), np.zeros(N, np.uint8)
    a.register_memory([(r1.ctypes.data, N, 0, "")], "DRAM")
    old = a.get_partial_agent_metadata([(r1.ctypes.data, N, 0)], True)
    reg2 = a.register_memory([(r2.ctypes.data, N, 0, "")], "DRAM")
    b.add_remote_agent(a.get_partial_agent_metadata([(r2.ctypes.data, N, 0)], True))
    with pytest.raises(kvlane.Stale, match="is older than the loaded generation"):
        b.add_remote_agent(old)
    assert not b.check_remote_metadata(a.name, _x(b, r1))
    # after a deregistration and a full load, an old partial blob cannot bring it back
    a.deregister_memory(reg2)
    b.add_remote_agent(a.get_agent_metadata())
    assert not b.check_remote_metadata(a.name, _x(b, r2))
    with pytest.raises(kvlane.Stale):
        b.add_remote_agent(old)
    assert b.check_remote_metadata(a.name, _x(b, r1))


def test_partial_to_listener(uniq):
    if not kvlane.listener_built():
        pytest.skip("libkvlane was built without the agent listener (kvlane/listener.h)")
    a = nixl_agent(uniq + "-a", nixl_agent_config(backends=["UCX"]))
    b = nixl_agent(uniq + "-b", nixl_agent_config(backends=["UCX"], enable_listen_thread=True,
                                                  listen_port=0))
    try:
        port = int(b.listen_address.rsplit(":", 1)[1])
        r1, r2 = np.zeros(N, np.uint8), np.zeros(N, np.uint8)
        a.register_memory([(r1.ctypes.data, N, 0, ""), (r2.ctypes.data, N, 0, "")], "DRAM")
        a.send_partial_agent_metadata([], True, ip_addr="127.0.0.1", port=port)
        assert b.check_remote_metadata(a.name)
        a.send_partial_agent_metadata([(r1.ctypes.data, N, 0)], ip_addr="127.0.0.1", port=port)
        assert b.check_remote_metadata(a.name, _x(b, r1))
        assert not b.check_remote_metadata(a.name, _x(b, r2))
    finally:
        b.close()
        a.close()
