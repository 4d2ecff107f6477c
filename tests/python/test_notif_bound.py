"""The notification queue is bounded (issue 16): a sender past the target's
bound gets kvlane.RemoteFull, which NIXL code catches as nixlBackendError,
naming the target and saying what to do; once the target took its
notifications, sending works again."""

import pytest

import kvlane
from kvlane.nixl import nixl_agent, nixl_agent_config
from kvlane.errors import nixlBackendError


def test_nixl_send_notif_to_a_full_queue(uniq):
    t = nixl_agent(uniq + "-t", nixl_agent_config(backends=["SHM"], notif_max_msgs=2,
                                                 notif_peer_percent=100))
    s = nixl_agent(uniq + "-s", nixl_agent_config(backends=["SHM"]))
    try:
        name = s.add_remote_agent(t.get_agent_metadata())
        s.send_notif(name, b"one")
        s.send_notif(name, "two")
        with pytest.raises(nixlBackendError) as ei:
            s.send_notif(name, b"three")
        e = ei.value
        assert isinstance(e, kvlane.RemoteFull) and e.code == -305
        assert e.name == "KVL_ERR_REMOTE_FULL"
        assert e.agent == uniq + "-t"
        assert "its bound is 2 notifications" in str(e) and "get_new_notifs" in str(e)
        q = t.agent.notif_queue_info()
        assert q["msgs"] == 2 and q["bytes"] == 6 and q["max_msgs"] == 2 and q["refused"] == 1
        assert q["max_bytes"] == 64 << 20
        assert t.get_new_notifs() == {s.name: [b"one", b"two"]}
        s.send_notif(name, b"three")
        assert t.get_new_notifs() == {s.name: [b"three"]}
    finally:
        s.close()
        t.close()


def test_agent_byte_bound(uniq):
    with kvlane.Agent(uniq + "-t", notif_max_bytes=100, notif_peer_percent=100) as t, \
            kvlane.Agent(uniq + "-s") as s:
        s.load_metadata(t.get_metadata())
        s.send_notif(t.name, b"x" * 100)
        with pytest.raises(kvlane.RemoteFull) as ei:
            s.send_notif(t.name, b"y")
        assert "or 100 bytes" in str(ei.value)
        assert t.notif_queue_info()["bytes"] == 100
        assert t.poll_notifs() == [(s.name, b"x" * 100)]
        s.send_notif(t.name, b"y")
        assert kvlane.error_class(-305) is kvlane.RemoteFull


def test_peer_share(uniq):
    with kvlane.Agent(uniq + "-t", notif_max_msgs=4) as t, kvlane.Agent(uniq + "-a") as a, \
            kvlane.Agent(uniq + "-b") as b:
        a.load_metadata(t.get_metadata())
        b.load_metadata(t.get_metadata())
        a.send_notif(t.name, b"1")
        a.send_notif(t.name, b"2")
        with pytest.raises(kvlane.RemoteFull) as ei:
            a.send_notif(t.name, b"3")
        assert "one peer's share is 2 notifications" in str(ei.value)
        b.send_notif(t.name, b"x")
        q = t.notif_queue_info()
        assert q["max_peer_msgs"] == 2 and q["msgs"] == 3
        with pytest.raises(kvlane.InvalidArgument):
            kvlane.Agent(uniq + "-bad", notif_peer_percent=101)
