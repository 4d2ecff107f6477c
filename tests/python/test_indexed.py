"""Indexed transfers: made from two prepared lists of equal-sized blocks and
index arrays (as engines make one per request), paired by the backend (the
GPU on cuda, pair by pair as shm cuts its copy batches, tcp its requests
and ucx its puts and gets) instead of at creation."""

import numpy as np
import pytest

import kvlane

LAYERS, BLOCKS, BS = 4, 512, 4096


@pytest.fixture(params=["shm", "tcp", "ucx"])
def pair(uniq, request):
    if request.param == "ucx" and not kvlane.backend_available("ucx")[0]:
        pytest.skip("ucx backend not available here: " + kvlane.backend_available("ucx")[1])
    a = kvlane.Agent(uniq + "-a", backends=(request.param,))
    b = kvlane.Agent(uniq + "-b", backends=(request.param,))
    a.test_backend = request.param
    yield a, b
    a.close()
    b.close()


def _caches(a, b):
    src = [np.random.default_rng(i).integers(0, 255, BLOCKS * BS, dtype=np.uint8)
           for i in range(LAYERS)]
    dst = [np.zeros(BLOCKS * BS, np.uint8) for _ in range(LAYERS)]
    a.register_memory(src)
    b.register_memory(dst)
    name = a.load_metadata(b.get_metadata())
    b.load_metadata(a.get_metadata())

    def table(arrs):
        return kvlane.DList.from_arrays(
            np.concatenate([x.ctypes.data + np.arange(BLOCKS, dtype=np.int64) * BS
                            for x in arrs]), len=BS)
    lp = a.prep(table(src))
    rp = a.prep(table(dst), name)
    return src, dst, lp, rp, name


def _blocks(arrs, idx):
    flat = [x.reshape(BLOCKS, BS) for x in arrs]
    return np.stack([flat[i // BLOCKS][i % BLOCKS] for i in idx])


def test_indexed_shuffled_write_and_repost(pair):
    a, b = pair
    src, dst, lp, rp, name = _caches(a, b)
    rng = np.random.default_rng(3)
    n = 1000
    li = rng.choice(LAYERS * BLOCKS, n, replace=False)
    ri = rng.choice(LAYERS * BLOCKS, n, replace=False)
    x = a.xfer_prepped("WRITE", lp, li.astype(np.int32), rp, ri, notif=b"req-1")
    assert x.stats()["segments"] == 0      # not paired at creation
    assert x.post() in (True, False)
    x.wait(10000)
    st = x.stats()
    assert st["bytes"] == n * BS and st["blocks"] == n and st["backend"] == a.test_backend
    # shm, tcp and ucx (put/get) walk the index arrays themselves: never
    # paired into segments
    assert st["segments"] == 0
    assert np.array_equal(_blocks(dst, ri), _blocks(src, li))
    untouched = np.setdiff1d(np.arange(LAYERS * BLOCKS), ri)
    assert not _blocks(dst, untouched).any()
    assert b.wait_notif(10000) and b.poll_notifs() == [(a.name, b"req-1")]
    # Re-post after the source changed: the same pairs move again.
    for s in src:
        s[:] = 7
    x.post()
    x.wait(10000)
    assert (_blocks(dst, ri) == 7).all()
    x.release()


def test_indexed_read_and_prep_released_first(pair):
    a, b = pair
    src, dst, lp, rp, name = _caches(a, b)
    for i, d in enumerate(dst):
        d[:] = np.arange(d.size, dtype=np.uint64).astype(np.uint8) + i
    n = 300
    li = np.arange(n)
    ri = np.arange(LAYERS * BLOCKS - 1, LAYERS * BLOCKS - 1 - n, -1)
    x = a.xfer_prepped("READ", lp, li, rp, ri)
    lp.release()          # the transfer keeps what it needs
    rp.release()
    x.post()
    x.wait(10000)
    assert np.array_equal(_blocks(src, li), _blocks(dst, ri))
    x.release()


def test_indexed_errors(pair):
    a, b = pair
    src, dst, lp, rp, name = _caches(a, b)
    n = LAYERS * BLOCKS
    ri = np.arange(n)
    ri[700] = n + 5
    with pytest.raises(kvlane.InvalidArgument, match=f"remote index 700 is {n + 5}"):
        a.xfer_prepped("WRITE", lp, np.arange(n), rp, ri)
    li = np.arange(n)
    li[3] = -1
    with pytest.raises(kvlane.InvalidArgument, match="local index 3 is -1"):
        a.xfer_prepped("WRITE", lp, li, rp, np.arange(n))
    # Lists of other block sizes pair as before: the mismatch is named.
    half = a.prep(kvlane.DList.from_arrays(
        dst[0].ctypes.data + np.arange(BLOCKS, dtype=np.int64) * (BS // 2), len=BS // 2), name)
    with pytest.raises(kvlane.InvalidArgument, match="same length|blocks"):
        a.xfer_prepped("WRITE", lp, np.arange(BLOCKS), half, np.arange(BLOCKS))


def test_indexed_tcp_blocks_split_across_requests(uniq):
    """tcp cuts requests of chunk_kib: 96 KiB blocks over 64 KiB requests
    split pairs into pieces and requests span pairs, in both directions."""
    a = kvlane.Agent(uniq + "-a", backends=())
    b = kvlane.Agent(uniq + "-b", backends=())
    try:
        a.create_backend("tcp", {"chunk_kib": "64"})
        b.create_backend("tcp", {"chunk_kib": "64"})
        bs, nb = 96 << 10, 300
        src = np.random.default_rng(5).integers(0, 255, nb * bs, dtype=np.uint8)
        dst = np.zeros(nb * bs, np.uint8)
        a.register_memory([src])
        b.register_memory([dst])
        name = a.load_metadata(b.get_metadata())
        lp = a.prep(kvlane.DList.from_arrays(src.ctypes.data + np.arange(nb) * bs, len=bs))
        rp = a.prep(kvlane.DList.from_arrays(dst.ctypes.data + np.arange(nb) * bs, len=bs), name)
        li = np.random.default_rng(6).permutation(nb)[:260]
        ri = np.random.default_rng(7).permutation(nb)[:260]
        x = a.xfer_prepped("WRITE", lp, li, rp, ri)
        x.post()
        x.wait(10000)
        assert x.stats()["backend"] == "tcp" and x.stats()["segments"] == 0  # indexed
        s2, d2 = src.reshape(nb, bs), dst.reshape(nb, bs)
        assert np.array_equal(d2[ri], s2[li])
        assert not d2[np.setdiff1d(np.arange(nb), ri)].any()
        x.release()
        back = np.zeros_like(src)
        a.register_memory([back])
        bp = a.prep(kvlane.DList.from_arrays(back.ctypes.data + np.arange(nb) * bs, len=bs))
        y = a.xfer_prepped("READ", bp, li[::-1].copy(), rp, ri[::-1].copy())
        y.post()
        y.wait(10000)
        assert np.array_equal(back.reshape(nb, bs)[li], s2[li])
        y.release()
    finally:
        a.close()
        b.close()


def test_mixed_lengths_still_pair(pair):
    a, b = pair
    src, dst, lp, rp, name = _caches(a, b)
    # A list whose entries differ in length is not uniform: segments as before.
    lens = np.full(BLOCKS, BS, np.int64)
    lens[0] = BS // 2
    addrs = src[0].ctypes.data + np.arange(BLOCKS, dtype=np.int64) * BS
    raddrs = dst[0].ctypes.data + np.arange(BLOCKS, dtype=np.int64) * BS
    l2 = a.prep(kvlane.DList.from_arrays(addrs, lens))
    r2 = a.prep(kvlane.DList.from_arrays(raddrs, lens), name)
    x = a.xfer_prepped("WRITE", l2, np.arange(1, BLOCKS), r2, np.arange(1, BLOCKS))
    assert x.stats()["segments"] > 0       # paired at creation
    x.post()
    x.wait(10000)
    assert np.array_equal(dst[0][BS:], src[0][BS:]) and not dst[0][:BS].any()
    x.release()


def _need(bk, vram):
    """Skip unless bk can run here (and, for VRAM, torch sees a GPU); torch
    or None."""
    torch = _torch_cuda() if vram else None
    if vram and torch is None:
        pytest.skip("needs torch with a CUDA GPU (runs on the GPU machine)")
    ok, why = kvlane.backend_available(bk)
    if not ok:
        pytest.skip(bk + " backend not available here: " + why)
    return torch


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@pytest.mark.parametrize("op", ["WRITE", "READ"])
@pytest.mark.parametrize("bk", ["cuda", "tcp", "ucx"])
def test_indexed_vram(uniq, op, bk):
    """On the GPU machine: the cuda backend gathers from the index arrays;
    tcp and ucx stage VRAM through host buffers (ucx where its UCX cannot
    map GPU memory itself) and must move the same pairs."""
    torch = _need(bk, True)
    a = kvlane.Agent(uniq + "-a", backends=(bk,))
    b = kvlane.Agent(uniq + "-b", backends=(bk,))
    try:
        n_blk = LAYERS * BLOCKS
        src = torch.randint(0, 255, (n_blk * BS,), dtype=torch.uint8, device="cuda")
        dst = torch.zeros(n_blk * BS, dtype=torch.uint8, device="cuda")
        local, remote = (src, dst) if op == "WRITE" else (dst, src)
        a.register_memory(local)
        b.register_memory(remote)
        name = a.load_metadata(b.get_metadata())

        def table(t):
            return kvlane.DList.from_arrays(
                t.data_ptr() + np.arange(n_blk, dtype=np.int64) * BS, len=BS, kind="VRAM")
        lp = a.prep(table(local))
        rp = a.prep(table(remote), name)
        rng = np.random.default_rng(5)
        # a new table per request, as engines do; the first right after the
        # lists were prepared; 256 and 384 pairs travel in the launch, 385
        # and more are uploaded from the pinned memory they were written to
        for n in (1000, 256, 384, 385, 1001, 2048):
            li = rng.choice(n_blk, n, replace=False)
            ri = rng.choice(n_blk, n, replace=False)
            x = a.xfer_prepped(op, lp, li, rp, ri)
            x.post()
            x.wait(10000)
            st = x.stats()
            assert st["backend"] == bk, st
            if bk == "cuda":
                assert "indexed" in st["path"], st
            x.release()
            torch.cuda.synchronize()
            s2 = src.view(n_blk, BS)
            d2 = dst.view(n_blk, BS)
            si, di = (li, ri) if op == "WRITE" else (ri, li)
            assert torch.equal(d2[torch.as_tensor(di, device="cuda")],
                               s2[torch.as_tensor(si, device="cuda")])
            dst.zero_()
            torch.cuda.synchronize()   # before the next request writes on kvlane's streams
        lp.release()
        rp.release()
    finally:
        a.close()
        b.close()


NEIGHBOUR_PATHS = [("shm", {"cma": "auto"}, "cma", "DRAM"),
                   ("shm", {"cma": "off"}, "socket", "DRAM"),
                   ("ucx", {"data_path": "am"}, "data_path=am", "DRAM"),
                   ("cuda", {}, "cuda", "VRAM"), ("tcp", {}, "", "VRAM"), ("ucx", {}, "", "VRAM")]


class _HostBufs:
    """The test's two buffers in host memory (NumPy)."""

    def __init__(self, nb, bs):
        self.src = np.random.default_rng(8).integers(0, 255, nb * bs, dtype=np.uint8)
        self.dst = np.zeros(nb * bs, np.uint8)
        self.nb, self.bs = nb, bs

    def ptr(self, t):
        return t.ctypes.data

    def blocks(self, t, idx):
        return t.reshape(self.nb, self.bs)[np.asarray(idx)]

    def zero(self, t):
        t[:] = 0

    def sync(self):
        pass


class _GpuBufs(_HostBufs):
    """The same on the GPU (torch tensors); views of one allocation, so a
    peer maps both of its regions through one handle."""

    def __init__(self, nb, bs, torch):
        self.torch = torch
        self.src = torch.randint(0, 255, (nb * bs,), dtype=torch.uint8, device="cuda")
        self.dst = torch.zeros(nb * bs, dtype=torch.uint8, device="cuda")
        self.nb, self.bs = nb, bs
        torch.cuda.synchronize()

    def ptr(self, t):
        return t.data_ptr()

    def blocks(self, t, idx):
        return t.view(self.nb, self.bs)[self.torch.as_tensor(np.asarray(idx), device="cuda")].cpu().numpy()

    def zero(self, t):
        t.zero_()
        self.torch.cuda.synchronize()   # before kvlane's streams write it

    def sync(self):
        self.torch.cuda.synchronize()


@pytest.mark.parametrize("form", ["indexed", "plain"])
@pytest.mark.parametrize("bk,params,path,mem", NEIGHBOUR_PATHS,
                         ids=["shm-cma", "shm-socket", "ucx-am", "cuda-vram", "tcp-vram",
                              "ucx-vram"])
def test_neighbours_across_regions(uniq, bk, params, path, mem, form):
    """Backends that merge neighbouring blocks into one copy or request (shm
    as it walks an indexed transfer pair by pair, or a transfer's segments;
    ucx's staged requests: data_path=am, VRAM its UCX cannot map) never
    merge across two regions, even adjacent ones: the target checks each
    range of a socket or staged request against one region. Runs cross the
    boundary on either side; the transfer is indexed (from prepared lists)
    or plain (from two lists of the same blocks). VRAM (on the GPU machine):
    the regions are views of one allocation."""
    torch = _need(bk, mem == "VRAM")
    a = kvlane.Agent(uniq + "-a", backends=())
    b = kvlane.Agent(uniq + "-b", backends=())
    try:
        a.create_backend(bk, params)
        b.create_backend(bk, params)
        bs, nb = 4096, 512
        m = _GpuBufs(nb, bs, torch) if mem == "VRAM" else _HostBufs(nb, bs)
        src, dst = m.src, m.dst
        # each buffer as two regions that touch: the local one at block 200,
        # the remote one at block 300
        for buf, ag, cut in ((src, a, 200), (dst, b, 300)):
            ag.register_memory([buf[:cut * bs]], kind=mem)
            ag.register_memory([buf[cut * bs:]], kind=mem)
        name = a.load_metadata(b.get_metadata())
        b.load_metadata(a.get_metadata())
        # runs of neighbours on both sides: one crosses the local boundary,
        # one the remote one, one stays inside both, one goes down locally
        li = np.concatenate([np.arange(150, 250), np.arange(0, 100), np.arange(300, 360),
                             np.arange(511, 419, -1)])
        ri = np.concatenate([np.arange(0, 100), np.arange(250, 350), np.arange(100, 160),
                             np.arange(400, 492)])
        assert len(li) == len(ri) >= 256 and len(set(ri)) == len(ri)

        def dlist(t, idx):
            return kvlane.DList.from_arrays(m.ptr(t) + np.asarray(idx, dtype=np.int64) * bs,
                                            len=bs, kind=mem)
        lp = rp = None
        if form == "indexed":
            lp = a.prep(dlist(src, np.arange(nb)))
            rp = a.prep(dlist(dst, np.arange(nb)), name)

        def make(op):
            if form == "indexed":
                return a.xfer_prepped(op, lp, li, rp, ri)
            return a.xfer(op, dlist(src, li), name, dlist(dst, ri))
        x = make("WRITE")
        x.post()
        x.wait(10000)
        st = x.stats()
        assert st["backend"] == bk and st["blocks"] == len(li), st
        assert path in st["path"], st["path"]
        if form == "indexed" and bk == "shm":
            assert st["segments"] == 0, st
        x.release()
        m.sync()
        assert np.array_equal(m.blocks(dst, ri), m.blocks(src, li))
        assert not m.blocks(dst, np.setdiff1d(np.arange(nb), ri)).any()
        # and back: READ the same pairs into a cleared source
        m.zero(src)
        y = make("READ")
        y.post()
        y.wait(10000)
        y.release()
        m.sync()
        assert np.array_equal(m.blocks(src, li), m.blocks(dst, ri))
        if lp is not None:
            lp.release()
            rp.release()
    finally:
        a.close()
        b.close()
