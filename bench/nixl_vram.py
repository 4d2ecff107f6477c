#!/usr/bin/env python3
"""VRAM -> VRAM between two processes through the `nixl` package with NIXL's
default configuration (backends=["UCX"]), as an engine would run it, next to
a device-to-device copy of the same bytes measured in the same run.

    PYTHONPATH=build/python-nixl python3 bench/nixl_vram.py [--reps N]

Rows (GB/s of payload, median of the repetitions, and the ratio to the copy):
  bulk      one 1 GiB descriptor, a new make_prepped_xfer per request
  scattered 65536 blocks of 32 KiB (2 GiB), each request a new
            make_prepped_xfer with a new shuffled block table, as engines do
  first     the first scattered request after registration (no warm-up)
  pipelined the scattered requests as a busy decode receives them: the next
            request is made and posted while the one before still moves
            (two in flight, each a new transfer with a new table); GB/s of
            the whole run, start of the first make to the last DONE
Needs torch with CUDA. The decode process is started by this script.
"""

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import time

NBLK, BLK = 65536, 32 << 10
BULK = 1 << 30


def decode_main():
    import torch
    from nixl._api import nixl_agent
    agent = nixl_agent("bench-decode")
    dst_bulk = torch.zeros(BULK, dtype=torch.uint8, device="cuda:0")
    dst_blk = torch.zeros(NBLK * BLK, dtype=torch.uint8, device="cuda:0")
    agent.register_memory([(dst_bulk.data_ptr(), BULK, 0, ""),
                           (dst_blk.data_ptr(), NBLK * BLK, 0, "")], "VRAM")
    print(json.dumps({"md": base64.b64encode(agent.get_agent_metadata()).decode(),
                      "bulk": dst_bulk.data_ptr(), "blk": dst_blk.data_ptr()}), flush=True)
    sys.stdin.readline()          # until the prefill side is done
    torch.cuda.synchronize()
    # Spot check: the last bulk request wrote the prefill's pattern.
    ok = bool((dst_bulk[:4096] == (torch.arange(4096, device="cuda:0") % 251).to(torch.uint8)).all())
    print(json.dumps({"verified": ok}), flush=True)
    agent.close()


def d2d_copy_gbs(torch, nbytes, reps):
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    times = []
    for _ in range(reps + 1):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return nbytes / statistics.median(times[1:]) / 1e9


PHASES = {}


def run_requests(agent, lp, rp, nreq, make_idx, nbytes, tag=None):
    times = []
    for _ in range(nreq):
        li, ri = make_idx()
        t0 = time.perf_counter()
        h = agent.make_prepped_xfer("WRITE", lp, li, rp, ri)
        t1 = time.perf_counter()
        st = agent.transfer(h)
        t2 = time.perf_counter()
        while st != "DONE":
            st = agent.check_xfer_state(h)
        t3 = time.perf_counter()
        times.append(t3 - t0)
        if tag:
            PHASES.setdefault(tag, []).append((t1 - t0, t2 - t1, t3 - t2))
        agent.release_xfer_handle(h)
    return [nbytes / t / 1e9 for t in times], times


def pipelined(agent, lp, rp, tables, nbytes, depth=2):
    """Each table a new transfer; up to depth in flight: the host's make and
    post of one request overlap the GPU's copy of the one before."""
    inflight = []
    t0 = time.perf_counter()
    for li, ri in tables:
        h = agent.make_prepped_xfer("WRITE", lp, li, rp, ri)
        agent.transfer(h)
        inflight.append(h)
        if len(inflight) == depth:
            h0 = inflight.pop(0)
            while agent.check_xfer_state(h0) != "DONE":
                pass
            agent.release_xfer_handle(h0)
    for h0 in inflight:
        while agent.check_xfer_state(h0) != "DONE":
            pass
        agent.release_xfer_handle(h0)
    return len(tables) * nbytes / (time.perf_counter() - t0) / 1e9


def repost(agent, lp, rp, nreq, li, ri, nbytes):
    """One handle posted nreq times: no new table (the reference for 'a
    new transfer per request costs no more than a re-post')."""
    h = agent.make_prepped_xfer("WRITE", lp, li, rp, ri)
    times = []
    for _ in range(nreq + 1):
        t0 = time.perf_counter()
        st = agent.transfer(h)
        while st != "DONE":
            st = agent.check_xfer_state(h)
        times.append(time.perf_counter() - t0)
    agent.release_xfer_handle(h)
    return statistics.median(nbytes / t / 1e9 for t in times[1:]), statistics.median(times[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--identity", action="store_true",
                    help="block i to block i (default: a new shuffled table per request)")
    ap.add_argument("--decode", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.decode:
        return decode_main()
    import numpy as np
    import torch
    from nixl._api import nixl_agent
    dec = subprocess.Popen([sys.executable, __file__, "--decode"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    hello = json.loads(dec.stdout.readline())
    agent = nixl_agent("bench-prefill")
    src_bulk = (torch.arange(BULK, device="cuda:0") % 251).to(torch.uint8)
    src_blk = torch.ones(NBLK * BLK, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    agent.register_memory([(src_bulk.data_ptr(), BULK, 0, ""),
                           (src_blk.data_ptr(), NBLK * BLK, 0, "")], "VRAM")
    name = agent.add_remote_agent(base64.b64decode(hello["md"]))

    def table(base, n, size):
        t = np.empty((n, 3), np.uint64)
        t[:, 0] = base + np.arange(n, dtype=np.uint64) * np.uint64(size)
        t[:, 1] = size
        t[:, 2] = 0
        return t
    lb = agent.prep_xfer_dlist("", table(src_bulk.data_ptr(), 1, BULK), "VRAM")
    rb = agent.prep_xfer_dlist(name, table(hello["bulk"], 1, BULK), "VRAM")
    ls = agent.prep_xfer_dlist("", table(src_blk.data_ptr(), NBLK, BLK), "VRAM")
    rs = agent.prep_xfer_dlist(name, table(hello["blk"], NBLK, BLK), "VRAM")
    rng = np.random.default_rng(7)
    ident = np.arange(NBLK, dtype=np.int64)

    def shuffled():
        return ident, (ident if args.identity else rng.permutation(NBLK))

    first_gbs, first_t = run_requests(agent, ls, rs, 1, shuffled, NBLK * BLK)
    # Its physical reference: the GPU's first copy of the same bytes between
    # buffers written once, after a pause (clocks as cold as for the request).
    ca = torch.ones(NBLK * BLK, dtype=torch.uint8, device="cuda:0")
    cb = torch.zeros(NBLK * BLK, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    time.sleep(0.5)
    s0, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s0.record()
    cb.copy_(ca)
    e0.record()
    e0.synchronize()
    first_copy_gbs = NBLK * BLK / (s0.elapsed_time(e0) / 1e3) / 1e9
    del ca, cb
    bulk_gbs, _ = run_requests(agent, lb, rb, args.reps, lambda: ([0], [0]), BULK)
    scat_gbs, scat_t = run_requests(agent, ls, rs, args.reps, shuffled, NBLK * BLK, "scat")
    re_gbs, re_t = repost(agent, ls, rs, args.reps, *shuffled(), NBLK * BLK)
    # Tables drawn before the clock starts, as for the serial rows.
    pipe_gbs = statistics.median(
        pipelined(agent, ls, rs, [shuffled() for _ in range(args.reps)], NBLK * BLK)
        for _ in range(3))
    # Small requests, each a new transfer: 256 and 16 blocks of 32 KiB, and
    # of 16 KiB (issue 18's shape: lists of 16 KiB entries over the same memory).
    small = {}
    SB = 16 << 10
    ls16 = agent.prep_xfer_dlist("", table(src_blk.data_ptr(), NBLK * BLK // SB, SB), "VRAM")
    rs16 = agent.prep_xfer_dlist(name, table(hello["blk"], NBLK * BLK // SB, SB), "VRAM")
    for size, lp_, rp_, nent in ((BLK, ls, rs, NBLK), (SB, ls16, rs16, NBLK * BLK // SB)):
        for nb in (256, 16):
            def pick(nb=nb, nent=nent):
                return rng.choice(nent, nb, replace=False), rng.choice(nent, nb, replace=False)
            tag = f"small{size}-{nb}"
            _, t = run_requests(agent, lp_, rp_, max(args.reps, 50), pick, nb * size, tag)
            post_done = [p[1] + p[2] for p in PHASES[tag]]
            small[(size, nb)] = (statistics.median(t) * 1e6, statistics.median(post_done) * 1e6)
    h = agent.make_prepped_xfer("WRITE", ls, [0], rs, [0])
    agent.transfer(h)
    while agent.check_xfer_state(h) != "DONE":
        pass
    path = agent.get_xfer_telemetry(h).path if agent._telemetry else ""
    backend = agent.query_xfer_backend(h)
    agent.release_xfer_handle(h)
    ref_bulk = d2d_copy_gbs(torch, BULK, args.reps)
    ref_scat = d2d_copy_gbs(torch, NBLK * BLK, args.reps)
    dec.stdin.write("done\n")
    dec.stdin.flush()
    verified = json.loads(dec.stdout.readline())["verified"]
    dec.wait(60)
    agent.close()
    mb, ms = statistics.median(bulk_gbs), statistics.median(scat_gbs)
    print(f"nixl_vram: backend {backend} {path}; decode verified: {verified}")
    print(f"{'row':<34}{'kvlane GB/s':>12}{'d2d copy GB/s':>15}{'ratio':>8}")
    print(f"{'bulk 1 GiB, new xfer each':<34}{mb:>12.1f}{ref_bulk:>15.1f}{mb / ref_bulk:>8.3f}")
    print(f"{'65536 x 32 KiB, new table each':<34}{ms:>12.1f}{ref_scat:>15.1f}"
          f"{ms / ref_scat:>8.3f}")
    print(f"{'  first request after reg.':<34}{first_gbs[0]:>12.1f}{ref_scat:>15.1f}"
          f"{first_gbs[0] / ref_scat:>8.3f}   ({first_t[0] * 1e3:.2f} ms)")
    print(f"{'  first copy after a 0.5 s pause':<34}{'':>12}{first_copy_gbs:>15.1f}"
          f"{first_copy_gbs / ref_scat:>8.3f}   (the GPU's own first-use cost)")
    print(f"{'  p50 request time (ms)':<34}{statistics.median(scat_t) * 1e3:>12.3f}")
    ph = PHASES["scat"]
    print(f"{'  make / transfer() / to DONE (ms)':<34}" +
          " / ".join(f"{statistics.median(p[i] for p in ph) * 1e3:.3f}" for i in range(3)))
    print(f"{'  pipelined, 2 requests in flight':<34}{pipe_gbs:>12.1f}{ref_scat:>15.1f}"
          f"{pipe_gbs / ref_scat:>8.3f}")
    print(f"{'  re-post of one handle':<34}{re_gbs:>12.1f}{ref_scat:>15.1f}"
          f"{re_gbs / ref_scat:>8.3f}   ({re_t * 1e3:.3f} ms)")
    for (size, nb), (us, pd) in small.items():
        print(f"{f'{nb} x {size >> 10} KiB request p50 (us)':<34}{us:>12.1f}   "
              f"(post -> complete {pd:.1f})")
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(main())
