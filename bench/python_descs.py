#!/usr/bin/env python3
"""kvlane from Python: descriptor-heavy transfers and registration calls.

1. Build and post a transfer of N descriptors (default 1,000,000) from NumPy
   address arrays: DList.add_array on int64 arrays, prep, create, post; the
   time per descriptor is measured in Python around the whole sequence
   (target < 50 ns). The transfer is also waited on, and reported apart.
2. Register R regions (default 1,000) with one call each vs one list call.
3. Requests through nixl._api as engines make them: make_prepped_xfer of n
   random pairs (1 and 1,024) from two prepared lists of 4,096 blocks, p50
   of many; alone, and with each request posted and completed before the
   next is made (a request stream). Targets: <= 10 us + <= 15 ns per pair.

    PYTHONPATH=build/python python3 bench/python_descs.py [--descs N] [--regions R]
"""

import argparse
import statistics
import time

import numpy as np

import kvlane


def best(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return min(times), statistics.median(times)


def bench_descs(n, block, reps):
    src = kvlane.Agent("bench-src")
    dst = kvlane.Agent("bench-dst")
    try:
        size = n * block
        a = np.zeros(size, np.uint8)
        b = np.zeros(size, np.uint8)
        src.register_memory(a)
        dst.register_memory(b)
        remote = src.load_metadata(dst.get_metadata())
        # Scattered pairing: local block i goes to remote block perm[i].
        idx = np.arange(n, dtype=np.int64)
        laddrs = a.ctypes.data + idx * block
        raddrs = b.ctypes.data + np.random.default_rng(1).permutation(n).astype(np.int64) * block
        phases = {}

        # Engines keep their lists: clear() keeps the capacity, so after the
        # first round no page is faulted in again. The first round is shown apart.
        ll = kvlane.DList("DRAM", n)
        rl = kvlane.DList("DRAM", n)

        def build_and_post():
            t0 = time.perf_counter_ns()
            ll.clear()
            ll.add_array(laddrs, None, block)
            rl.clear()
            rl.add_array(raddrs, None, block)
            t1 = time.perf_counter_ns()
            lp = src.prep_local(ll)
            rp = src.prep_remote(remote, rl)
            t2 = time.perf_counter_ns()
            x = src.create_xfer_prepped("WRITE", lp, None, rp, None)
            t3 = time.perf_counter_ns()
            x.post()
            t4 = time.perf_counter_ns()
            phases.setdefault("dlists", []).append(t1 - t0)
            phases.setdefault("prep", []).append(t2 - t1)
            phases.setdefault("create", []).append(t3 - t2)
            phases.setdefault("post", []).append(t4 - t3)
            phases["x"] = (x, lp, rp)
            return x

        total = []
        moved = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            x = build_and_post()
            total.append(time.perf_counter_ns() - t0)
            t1 = time.perf_counter_ns()
            x.wait()
            moved.append(time.perf_counter_ns() - t1)
            x.release()
        print(f"transfer of {n:,} descriptors of {block} B (scattered), best of {reps}:")
        print(f"  first round (fresh pages everywhere): {total[0] / n:.1f} ns/desc")
        for k in ("dlists", "prep", "create", "post"):
            print(f"  {k:<8} {min(phases[k]) / 1e6:8.2f} ms  {min(phases[k]) / n:6.1f} ns/desc")
        t = min(total)
        print(f"  build+post {t / 1e6:8.2f} ms  {t / n:6.1f} ns/desc  (median "
              f"{statistics.median(total) / n:.1f} ns/desc; target < 50)")
        print(f"  then moving the data: {min(moved) / 1e6:.2f} ms "
              f"({size / min(moved):.2f} GB/s)")
        # The same through the nixl package (vLLM's path: (N, 3) arrays, int64
        # index arrays), with NIXL's default configuration.
        nixl_api = _nixl_api()
        na = nixl_api.nixl_agent("bench-nixl")
        try:
            na.register_memory([(a.ctypes.data, size, 0, "")], "DRAM")
            rname = na.add_remote_agent(dst.get_metadata())
            ld = np.stack([laddrs, np.full(n, block, np.int64), np.zeros(n, np.int64)], axis=1)
            rd = np.stack([raddrs, np.full(n, block, np.int64), np.zeros(n, np.int64)], axis=1)
            ids = np.arange(n, dtype=np.int64)
            rows = []
            for _ in range(reps + 1):     # the first round faults pages in
                t0 = time.perf_counter_ns()
                lx = na.get_xfer_descs(ld, "DRAM")
                rx = na.get_xfer_descs(rd, "DRAM")
                t1 = time.perf_counter_ns()
                lh = na.prep_xfer_dlist("", lx)
                rh = na.prep_xfer_dlist(rname, rx)
                t2 = time.perf_counter_ns()
                h = na.make_prepped_xfer("WRITE", lh, ids, rh, ids)
                na.transfer(h)
                t3 = time.perf_counter_ns()
                rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
                while na.check_xfer_state(h) == "PROC":
                    time.sleep(0.001)
                na.release_xfer_handle(h)
                na.release_dlist_handle(lh)
                na.release_dlist_handle(rh)
            best_row = min(rows[1:], key=lambda r: r[3])
            print(f"  through nixl._api ({nixl_api.__name__}), best of {reps}: get_xfer_descs x2 "
                  f"{best_row[0] / n:.1f}, prep_xfer_dlist x2 {best_row[1] / n:.1f}, "
                  f"make_prepped_xfer + transfer {best_row[2] / n:.1f}; all "
                  f"{best_row[3] / n:.1f} ns/desc (median "
                  f"{statistics.median(r[3] for r in rows[1:]) / n:.1f}; target <= 50)")
        finally:
            na.close()
    finally:
        src.close()
        dst.close()


def _nixl_api():
    """nixl._api from the nixl package (build/python-nixl beside the module,
    or KVL_NIXL_PATH), else kvlane.nixl."""
    import os
    import sys
    here = os.path.dirname(os.path.abspath(kvlane.__file__))
    for path in (os.environ.get("KVL_NIXL_PATH"), os.path.join(here, "..", "..", "python-nixl")):
        if path and os.path.isdir(os.path.join(path, "nixl")):
            sys.path.insert(0, path)
            import nixl._api
            return nixl._api
    from kvlane import nixl as kvlane_nixl
    return kvlane_nixl


def bench_regions(r, size, reps):
    with kvlane.Agent("bench-reg") as agent:
        mem = np.zeros(r * size, np.uint8)
        regions = [(mem.ctypes.data + i * size, size, -1) for i in range(r)]

        def one_by_one():
            for reg in regions:
                agent.register_memory(reg)
            for reg in regions:
                agent.deregister_memory(reg)

        def one_list():
            agent.register_memory(regions)
            agent.deregister_memory(regions)

        one_by_one()    # warm up (first touch of the pages)
        b1, m1 = best(one_by_one, reps)
        b2, m2 = best(one_list, reps)
        print(f"registering {r:,} regions of {size >> 10} KiB (register + deregister), "
              f"best of {reps}:")
        print(f"  one call each: {b1 / 1e6:8.2f} ms  ({b1 / r / 1e3:.2f} us/region)")
        print(f"  one list call: {b2 / 1e6:8.2f} ms  ({b2 / r / 1e3:.2f} us/region)  "
              f"{b1 / b2:.1f}x faster")


def bench_requests(reps):
    nixl_api = _nixl_api()
    nblk, blk = 4096, 4096
    src = np.ones(nblk * blk, np.uint8)
    dst = np.zeros(nblk * blk, np.uint8)
    a = nixl_api.nixl_agent("bench-req-a")
    b = nixl_api.nixl_agent("bench-req-b")
    try:
        a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
        b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
        name = a.add_remote_agent(b.get_agent_metadata())

        def table(base):
            t = np.empty((nblk, 3), np.int64)
            t[:, 0] = base + np.arange(nblk, dtype=np.int64) * blk
            t[:, 1] = blk
            t[:, 2] = 0
            return t
        lh = a.prep_xfer_dlist("", table(src.ctypes.data), "DRAM")
        rh = a.prep_xfer_dlist(name, table(dst.ctypes.data), "DRAM")
        rng = np.random.default_rng(3)
        print(f"requests through nixl._api ({nixl_api.__name__}): make_prepped_xfer from two "
              f"prepared lists of {nblk} x {blk} B, p50 of {reps}:")
        res = {}
        for posted in (False, True):
            for n in (1, 1024):
                times = []
                for _ in range(reps):
                    li = rng.choice(nblk, n, replace=False)
                    ri = rng.choice(nblk, n, replace=False)
                    t0 = time.perf_counter_ns()
                    h = a.make_prepped_xfer("WRITE", lh, li, rh, ri)
                    times.append(time.perf_counter_ns() - t0)
                    if posted:
                        st = a.transfer(h)
                        while st != "DONE":
                            st = a.check_xfer_state(h)
                    a.release_xfer_handle(h)
                res[posted, n] = statistics.median(times) / 1e3
            fixed, many = res[posted, 1], res[posted, 1024]
            print(f"  {'each request posted and completed' if posted else 'alone':<34} "
                  f"n=1 {fixed:6.2f} us, n=1024 {many:7.2f} us: fixed {fixed:.2f} us + "
                  f"{max(many - fixed, 0) * 1e3 / 1023:.1f} ns per pair")
    finally:
        a.close()
        b.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--descs", type=int, default=1_000_000)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--regions", type=int, default=1000)
    ap.add_argument("--region-size", type=int, default=64 << 10)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    bench_descs(args.descs, args.block, args.reps)
    bench_regions(args.regions, args.region_size, args.reps)
    bench_requests(max(args.reps, 300))


if __name__ == "__main__":
    main()
