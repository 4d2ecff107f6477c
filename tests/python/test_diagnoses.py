"""Diagnoses that must not mislead (issue 17): what a dead peer looks like,
errno formatted once."""

import numpy as np
import pytest

import kvlane
from conftest import Peer


def test_dead_shm_peer_is_described_as_disconnected(uniq):
    peer = Peer(uniq + "-dead")
    a = kvlane.Agent(uniq)
    try:
        buf = np.zeros(1 << 20, np.uint8)
        a.register_memory(buf)
        name = a.load_metadata(peer.call("md"))
        assert "cma" in a.describe_remote(name) or "socket" in a.describe_remote(name)
        peer.proc.kill()
        peer.proc.wait()
        # A notification finds the connection gone.
        with pytest.raises(kvlane.Error) as ei:
            for _ in range(50):
                a.send_notif(name, b"x")
        text = str(ei.value)
        # No contradiction (a close is not ECONNRESET), no errno twice.
        assert "(connection closed by the peer) (errno" not in text, text
        assert text.count("Connection reset by peer") <= 1, text
        desc = a.describe_remote(name)
        assert desc.startswith("shm: disconnected (") and "cma" not in desc, desc
        assert "load its metadata again" in desc
    finally:
        a.close()
        for f in (peer.proc.stdin, peer.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
