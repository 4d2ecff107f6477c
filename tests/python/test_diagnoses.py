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


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def test_host_memory_declared_vram_is_a_kind_mismatch(uniq):
    """Issue 17 item 5: with a driver present, host memory declared VRAM is
    named as host memory (a kind mismatch), not "no backend recognises it";
    a freed GPU pointer is not called host memory."""
    torch = _torch_cuda()
    if torch is None:
        pytest.skip("needs torch with a CUDA GPU (runs on the GPU machine)")
    a = kvlane.Agent(uniq, backends=("shm", "cuda"))
    try:
        host = np.zeros(1 << 20, np.uint8)
        addr = host.ctypes.data
        with pytest.raises(kvlane.Error) as ei:
            a.register_memory((addr, host.nbytes), kind="VRAM")
        text = str(ei.value)
        assert "KVL_ERR_DEVICE_MISMATCH" in text and "declared VRAM" in text, text
        assert "host memory mapped in this process" in text, text
        assert "register it as DRAM" in text, text
        pinned = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        with pytest.raises(kvlane.Error) as ei:
            a.register_memory((pinned.data_ptr(), pinned.numel()), kind="VRAM")
        assert "page-locked host memory" in str(ei.value), str(ei.value)
        t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        ptr = t.data_ptr()
        # GPU memory declared DRAM: named as VRAM on its GPU (a kind mismatch)
        with pytest.raises(kvlane.Error) as ei:
            a.register_memory((ptr, t.numel(), -1), kind="DRAM")
        text = str(ei.value)
        assert "KVL_ERR_DEVICE_MISMATCH" in text, text
        assert "declared DRAM, but the cuda backend says this memory is VRAM" in text, text
        del t
        torch.cuda.empty_cache()
        with pytest.raises(kvlane.Error) as ei:
            a.register_memory((ptr, 1 << 20, 0), kind="VRAM")
        text = str(ei.value)
        assert "host memory mapped in this process" not in text, text
        assert "page-locked host memory" not in text and "not GPU memory, or freed" in text, text
        # issue 17 item 10: with kind AUTO a freed GPU pointer is not DRAM
        with pytest.raises(kvlane.Error) as ei:
            a.register_memory((ptr, 1 << 20))
        text = str(ei.value)
        assert "cannot be read" in text or "not (fully) mapped" in text, text
    finally:
        a.close()


def test_vram_freed_while_registered_is_named(uniq):
    """Issue 17 item 10: GPU memory registered (as engines do, by address,
    so kvlane keeps no reference) and then freed: the next transfer from it
    fails naming that region, its device and that it was freed, not a kind
    mismatch and not a generic CUDA error."""
    torch = _torch_cuda()
    if torch is None:
        pytest.skip("needs torch with a CUDA GPU (runs on the GPU machine)")
    n = 64 << 20
    a = kvlane.Agent(uniq + "-a", backends=("cuda",))
    b = kvlane.Agent(uniq + "-b", backends=("cuda",))
    try:
        src = torch.ones(n, dtype=torch.uint8, device="cuda")
        dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
        ptr = src.data_ptr()
        a.register_memory((ptr, n, 0), kind="VRAM")
        b.register_memory(dst)
        name = a.load_metadata(b.get_metadata())
        x = a.xfer("WRITE", kvlane.DList.from_descs([(ptr, n, 0)], kind="VRAM"), name,
                   kvlane.DList.from_descs([(dst.data_ptr(), n, 0)], kind="VRAM"))
        x.post()
        x.wait(10000)
        torch.cuda.synchronize()
        assert bool(dst[-1] == 1)
        del src
        torch.cuda.synchronize()
        torch.cuda.empty_cache()    # the allocation goes back to the driver
        with pytest.raises(kvlane.Error) as ei:
            x.post()
            x.wait(10000)
        text = str(ei.value)
        assert "was freed" in text and f"0x{ptr:x}+{n}" in text, text
        assert "device 0" in text and "deregister GPU memory before freeing it" in text, text
        assert "list is VRAM but" not in text, text
        x.release()
        a.deregister_memory((ptr, n, 0))
    finally:
        a.close()
        b.close()
