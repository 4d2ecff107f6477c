#!/usr/bin/env python3
"""The rows of BASELINES.md's table "NIXL 1.4 (UCX 1.22) against kvlane 0.1,
side by side through the same Python calls", through NIXL's Python API
(``from nixl._api import nixl_agent, nixl_agent_config``) with whatever
``nixl`` comes first on sys.path: kvlane's package (build/python-nixl, which
maps onto kvlane.nixl) or a real NIXL. Each row is printed beside the NIXL
figure that BASELINES.md records: a constant, measured elsewhere (2-vCPU VM,
NIXL 1.4 with UCX 1.22), never in this run.

    PYTHONPATH=build/python-nixl:build/python python3 bench/nixl_rows.py \\
        [--rows 1,kv,lat] [--rounds N] [--big-gib G] [--json FILE] [--ucx-param K=V]

Two processes on one host, DRAM (NumPy buffers), NIXL's default
configuration (backends=["UCX"]). This script starts its peer (the target
of every WRITE) as a subprocess; the peer registers its buffer, prints its
metadata as base64 JSON on stdout, then serves commands on stdin (clear a
range; check that ranges hold the pattern this side's buffer was filled
with). Rows (--rows takes the numbers or the names):
  1 write4k, write64k, write16m ("write": all three)
             WRITE of 32 descriptors of 4 KiB, 64 KiB or 16 MiB per transfer,
             one prepared handle re-posted (BASELINES' "batch 32"): transfer()
             then check_xfer_state until DONE, one after the other; GB/s of
             the round. Local descriptor i goes to remote descriptor 31 - i,
             so that neither side can merge neighbours into one copy.
  2 kv       KV 16 KiB x 1024 scattered: a new make_prepped_xfer per request,
             from two prepared lists of 4096 blocks of 16 KiB, with new
             random local and remote block indices each time, then transfer()
             and check_xfer_state until DONE (release not timed; indices
             drawn before the clock starts); GB/s from make to DONE
  3 percall  transfer() call -> DONE of a 1024-descriptor request (1024
             scattered blocks of 4 KiB, a new handle per request, made before
             the clock starts), ns per descriptor (median of the round);
             the same with one handle re-posted is shown as information
  4 lat      4 KiB WRITE post -> DONE (one descriptor, a prepared handle
             re-posted: transfer() then check_xfer_state until DONE), p50 and
             p99 of 2000 samples per round, in us
  5 reg1     register_memory([(addr, 1 MiB, 0, "")], "DRAM") of a touched
             1 MiB buffer, then deregister_memory(the returned descriptors),
             us each (median of 500 pairs per round)
  6 reg1000  register 1000 regions of 4 KiB (8 KiB apart) in one call,
             deregister them in one call, ms each (median of 10 per round)
  7 make     make_prepped_xfer of 1024 descriptors (random indices into the
             16 KiB lists of row 2), alone (no transfer posted between),
             us, median of 300 per round (release not timed)
  8 descs    get_xfer_descs of 65536 descriptors from an (N, 3) int64 NumPy
             array, ns per descriptor (median of 20 per round)
  9 big      register --big-gib GiB (default 4) of np.empty memory whose
             pages were never touched, ms (a fresh allocation each round;
             skipped when MemAvailable is short); as information, its
             deregistration and a second registration of the same range
 10 burst    make_prepped_xfer of 1024 descriptors (as row 7), 256 times back
             to back with every handle kept, as engines hold one per request
             in flight, then all released: us per make, median of the burst;
             as information, minor page faults per make (getrusage). The
             first round's burst grows the heap; later ones reuse it
Every row runs in each of --rounds interleaved rounds (default 5, rows in
turn inside a round); "best" is the best round (highest GB/s, lowest time),
"median" the median of the rounds. The "speed vs NIXL" column is this run's
best against BASELINES' NIXL figure, > 1 faster. Every row that writes data
is checked in every round: the peer clears the destination before the row
and afterwards compares what the last request wrote with the source pattern
(a phase-shifted 251-byte cycle, each 4 KiB stamped with its index), so no
figure can come from transfers that did not land. Exit status 1 if a check
fails, 2 on an error.
"""

import argparse
import base64
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
BATCH = 32                       # descriptors per WRITE transfer (rows 1)
WRITE_SIZES = {"write4k": 4 * KiB, "write64k": 64 * KiB, "write16m": 16 * MiB}
KV_BLK, KV_N, KV_REQ = 16 * KiB, 4096, 1024   # rows 2 and 7: pool of 4096 blocks
PC_BLK, PC_REQ = 4 * KiB, 1024                # row 3: 1024 blocks of 4 KiB from the same pool
LAT_SAMPLES = 2000
PERIOD, STAMP = 251, 4 * KiB
CHUNK = 16 * MiB

# Row numbers (as in the brief of BASELINES' table) and names.
GROUPS = {"write4k": 1, "write64k": 1, "write16m": 1, "kv": 2, "percall": 3, "lat": 4,
          "reg1": 5, "reg1000": 6, "make": 7, "descs": 8, "big": 9, "burst": 10}
NEED_PEER = {"write4k", "write64k", "write16m", "kv", "percall", "lat", "make", "burst"}
BURST = 256                                   # row 10: live handles made back to back

# (result key, group, label, unit, BASELINES' NIXL 1.4 figure, higher is better)
SPEC = [
    ("write4k", "write4k", "WRITE 4 KiB x 32 per transfer (re-post)", "GB/s", 4.87, True),
    ("write64k", "write64k", "WRITE 64 KiB x 32 per transfer (re-post)", "GB/s", 6.6, True),
    ("write16m", "write16m", "WRITE 16 MiB x 32 per transfer (re-post)", "GB/s", 5.0, True),
    ("kv", "kv", "KV 16 KiB x 1024 scattered, new xfer/request", "GB/s", 1.42, True),
    ("percall", "percall", "transfer() -> DONE per desc (1024, new)", "ns/desc", 2696, False),
    ("percall_repost", "percall", "  the same, one handle re-posted (info)", "ns/desc", None,
     False),
    ("lat_p50", "lat", "4 KiB WRITE post -> DONE, p50", "us", 4.5, False),
    ("lat_p99", "lat", "4 KiB WRITE post -> DONE, p99", "us", 5.8, False),
    ("reg1", "reg1", "register 1 region of 1 MiB", "us", 3.3, False),
    ("dereg1", "reg1", "  deregister it", "us", 1.2, False),
    ("reg1000", "reg1000", "register 1000 regions in one call", "ms", 0.34, False),
    ("dereg1000", "reg1000", "  deregister them in one call", "ms", 0.16, False),
    ("make", "make", "make_prepped_xfer, 1024 descs (median)", "us", 71, False),
    ("burst", "burst", "  the same, 256 made back to back, kept live", "us", 71, False),
    ("burst_faults", "burst", "    page faults per make (info)", "faults", None, False),
    ("descs", "descs", "get_xfer_descs, 65536 descs from (N, 3)", "ns/desc", 3.3, False),
    ("big", "big", "register {gib} GiB, pages untouched", "ms", 0.85, False),
    ("bigdereg", "big", "  deregister it (info)", "ms", None, False),
    ("bigagain", "big", "  register the same range again (info)", "ms", None, False),
]


class CheckFailed(Exception):
    pass


# ---- the data pattern both processes know ---------------------------------------------------

_PAT = (np.arange(CHUNK + PERIOD) % PERIOD).astype(np.uint8)


def fill(view, off):
    """Write into view (uint8) the source pattern of the bytes at [off,
    off + len(view)) of the source buffer: a 251-byte cycle, and at every
    4 KiB boundary that 4 KiB's index as 8 little-endian bytes."""
    n = len(view)
    for s in range(0, n, CHUNK):
        m = min(CHUNK, n - s)
        ph = (off + s) % PERIOD
        view[s:s + m] = _PAT[ph:ph + m]
    g0 = -(-off // STAMP)
    g1 = (off + n - 8) // STAMP + 1 if n >= 8 else g0
    if g1 > g0:
        g = np.arange(g0, g1, dtype=np.int64)
        pos = g * STAMP - off
        view[pos[:, None] + np.arange(8)] = g.astype("<u8").view(np.uint8).reshape(-1, 8)


# ---- the peer -------------------------------------------------------------------------------

def peer_main(nbytes):
    import nixl
    from nixl._api import nixl_agent, nixl_agent_config
    agent = nixl_agent("rows-peer", nixl_agent_config(backends=["UCX"]))
    dst = np.empty(nbytes, np.uint8)
    dst.fill(0)                              # fault every page in before any row
    reg = agent.register_memory([(dst.ctypes.data, nbytes, 0, "")], "DRAM")
    print(json.dumps({"md": base64.b64encode(agent.get_agent_metadata()).decode(),
                      "addr": dst.ctypes.data, "nixl": nixl.__file__}), flush=True)
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "quit":
                break
            if cmd["cmd"] == "clear":
                for off, n in cmd["ranges"]:
                    dst[off:off + n] = 0
                print(json.dumps({"ok": True}), flush=True)
            elif cmd["cmd"] == "check":
                bad = None
                for ro, lo, n in cmd["pairs"]:
                    want = np.empty(n, np.uint8)
                    fill(want, lo)
                    got = dst[ro:ro + n]
                    if not np.array_equal(got, want):
                        i = int(np.flatnonzero(got != want)[0])
                        bad = (f"remote bytes [{ro}, +{n}) do not hold source bytes [{lo}, +{n}):"
                               f" first difference at +{i}: {int(got[i])} instead of "
                               f"{int(want[i])}")
                        break
                print(json.dumps({"ok": bad is None, "why": bad, "pairs": len(cmd["pairs"])}),
                      flush=True)
    finally:
        agent.deregister_memory(reg)
        close = getattr(agent, "close", None)
        if close:
            close()
    return 0


class Peer:
    def __init__(self, nbytes):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--peer",
                                   "--peer-bytes", str(nbytes)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()
        self.checks = 0

    def _read(self):
        line = self.p.stdout.readline()
        if not line:
            rc = self.p.wait(10)
            raise RuntimeError(f"the peer process exited (status {rc}) without answering")
        return json.loads(line)

    def ask(self, cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self._read()

    def clear(self, ranges):
        self.ask({"cmd": "clear", "ranges": [[int(o), int(n)] for o, n in ranges]})

    def check(self, what, pairs):
        r = self.ask({"cmd": "check", "pairs": [[int(a), int(b), int(c)] for a, b, c in pairs]})
        if not r["ok"]:
            raise CheckFailed(f"{what}: the peer found the data did not land: {r['why']}")
        self.checks += 1

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.p.stdin.close()
            except OSError:
                pass
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.terminate()
                try:
                    self.p.wait(5)
                except subprocess.TimeoutExpired:
                    self.p.kill()
                    self.p.wait()
        return self.p.returncode


# ---- the initiator --------------------------------------------------------------------------

def wait_done(agent, h, st):
    while st != "DONE":
        if st not in ("PROC", "DONE"):
            raise RuntimeError(f"transfer state {st!r}")
        st = agent.check_xfer_state(h)


def table(base, n, size):
    t = np.empty((n, 3), np.int64)
    t[:, 0] = base + np.arange(n, dtype=np.int64) * size
    t[:, 1] = size
    t[:, 2] = 0
    return t


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * KiB
    except OSError:
        pass
    return None


class Bench:
    def __init__(self, api, sel, args):
        self.api, self.sel, self.args = api, sel, args
        self.rng = np.random.default_rng(18)
        if args.ucx_param:
            # backends=[] then create_backend("UCX", params): how an engine passes them
            self.agent = api.nixl_agent("rows-init", api.nixl_agent_config(backends=[]))
            self.agent.create_backend("UCX", dict(args.ucx_param))
        else:
            self.agent = api.nixl_agent("rows-init", api.nixl_agent_config(backends=["UCX"]))
        self.peer = None
        self.backend = None
        self.lists = {}
        self.src_reg = None
        try:
            self._setup(sel)
        except BaseException:
            self.close()
            raise

    def _setup(self, sel):
        wsizes = [WRITE_SIZES[k] for k in WRITE_SIZES if k in sel] + \
                 ([4 * KiB] if "lat" in sel else [])
        self.bulk = BATCH * max(wsizes) if wsizes else 0
        self.pool_off = self.bulk
        self.nbytes = self.bulk + (KV_N * KV_BLK if sel & {"kv", "percall", "make", "burst"} else 0)
        if not sel & NEED_PEER:
            return
        self.src = np.empty(self.nbytes, np.uint8)
        fill(self.src, 0)
        self.peer = Peer(self.nbytes)
        self.raddr = self.peer.hello["addr"]
        self.peer_nixl = self.peer.hello["nixl"]
        a = self.agent
        self.src_reg = a.register_memory([(self.src.ctypes.data, self.nbytes, 0, "")], "DRAM")
        self.rname = a.add_remote_agent(base64.b64decode(self.peer.hello["md"]))
        for size in set(wsizes):
            self.lists[size] = (a.prep_xfer_dlist("", table(self.src.ctypes.data, BATCH, size),
                                                  "DRAM"),
                                a.prep_xfer_dlist(self.rname, table(self.raddr, BATCH, size),
                                                  "DRAM"))
        if self.nbytes > self.pool_off:
            for blk in (KV_BLK, PC_BLK):
                n = KV_N * KV_BLK // blk
                self.lists[("pool", blk)] = (
                    a.prep_xfer_dlist("", table(self.src.ctypes.data + self.pool_off, n, blk),
                                      "DRAM"),
                    a.prep_xfer_dlist(self.rname, table(self.raddr + self.pool_off, n, blk),
                                      "DRAM"))
        # One warm-up transfer (connection set-up), and which backend moved it.
        lp, rp = next(iter(self.lists.values()))
        h = a.make_prepped_xfer("WRITE", lp, [0], rp, [0])
        wait_done(a, h, a.transfer(h))
        try:
            self.backend = a.query_xfer_backend(h)
        except Exception as e:            # not every NIXL names it
            self.backend = f"? ({type(e).__name__})"
        a.release_xfer_handle(h)

    # -- rows 1: WRITE, 32 descriptors, one handle re-posted
    def write(self, key):
        a, size = self.agent, WRITE_SIZES[key]
        lp, rp = self.lists[size]
        nbytes = BATCH * size
        reps = max(4, min(1000, int(256 * MiB // nbytes)))
        li = np.arange(BATCH, dtype=np.int64)
        ri = li[::-1].copy()
        self.peer.clear([(0, nbytes)])
        h = a.make_prepped_xfer("WRITE", lp, li, rp, ri)
        try:
            wait_done(a, h, a.transfer(h))        # warm-up, not timed
            t0 = time.perf_counter_ns()
            for _ in range(reps):
                wait_done(a, h, a.transfer(h))
            t = time.perf_counter_ns() - t0
        finally:
            a.release_xfer_handle(h)
        self.peer.check(key, [((BATCH - 1 - i) * size, i * size, size) for i in range(BATCH)])
        return {key: reps * nbytes / t}

    def _pool_pairs(self, blk, li, ri):
        return [(self.pool_off + int(r) * blk, self.pool_off + int(l_) * blk, blk)
                for l_, r in zip(li, ri)]

    def _draw(self, n, k):
        return self.rng.choice(n, k, replace=False), self.rng.choice(n, k, replace=False)

    # -- row 2: KV requests, a new transfer each
    def kv(self):
        a = self.agent
        lp, rp = self.lists[("pool", KV_BLK)]
        nreq = 40
        tables = [self._draw(KV_N, KV_REQ) for _ in range(nreq + 1)]
        self.peer.clear([(self.pool_off, KV_N * KV_BLK)])
        total = 0
        for i, (li, ri) in enumerate(tables):
            t0 = time.perf_counter_ns()
            h = a.make_prepped_xfer("WRITE", lp, li, rp, ri)
            wait_done(a, h, a.transfer(h))
            t = time.perf_counter_ns() - t0
            a.release_xfer_handle(h)
            if i:                              # the first is a warm-up
                total += t
        self.peer.check("kv", self._pool_pairs(KV_BLK, *tables[-1]))
        return {"kv": nreq * KV_REQ * KV_BLK / total}

    # -- row 3: transfer() -> DONE of 1024 descriptors
    def percall(self):
        a = self.agent
        lp, rp = self.lists[("pool", PC_BLK)]
        n = KV_N * KV_BLK // PC_BLK
        nreq = 60
        self.peer.clear([(self.pool_off, KV_N * KV_BLK)])
        new, re = [], []
        tables = [self._draw(n, PC_REQ) for _ in range(nreq + 1)]
        for i, (li, ri) in enumerate(tables):
            h = a.make_prepped_xfer("WRITE", lp, li, rp, ri)
            t0 = time.perf_counter_ns()
            wait_done(a, h, a.transfer(h))
            t1 = time.perf_counter_ns()
            wait_done(a, h, a.transfer(h))
            t2 = time.perf_counter_ns()
            a.release_xfer_handle(h)
            if i:
                new.append(t1 - t0)
                re.append(t2 - t1)
        self.peer.check("percall", self._pool_pairs(PC_BLK, *tables[-1]))
        return {"percall": statistics.median(new) / PC_REQ,
                "percall_repost": statistics.median(re) / PC_REQ}

    # -- row 4: 4 KiB post -> DONE latency
    def lat(self):
        a = self.agent
        lp, rp = self.lists[4 * KiB]
        self.peer.clear([(0, 4 * KiB)])
        h = a.make_prepped_xfer("WRITE", lp, [0], rp, [0])
        ts = []
        try:
            for _ in range(50):
                wait_done(a, h, a.transfer(h))
            for _ in range(LAT_SAMPLES):
                t0 = time.perf_counter_ns()
                st = a.transfer(h)
                while st != "DONE":
                    if st != "PROC":
                        raise RuntimeError(f"transfer state {st!r}")
                    st = a.check_xfer_state(h)
                ts.append(time.perf_counter_ns() - t0)
        finally:
            a.release_xfer_handle(h)
        self.peer.check("lat", [(0, 0, 4 * KiB)])
        ts.sort()
        return {"lat_p50": ts[len(ts) // 2] / 1e3, "lat_p99": ts[len(ts) * 99 // 100] / 1e3}

    def _reg_dereg(self, descs, times, warm):
        """Median ns of register_memory(descs) and of deregistering what it
        returned, over `times` pairs after `warm` untimed ones."""
        a = self.agent
        r, d = [], []
        for i in range(warm + times):
            t0 = time.perf_counter_ns()
            reg = a.register_memory(descs, "DRAM")
            t1 = time.perf_counter_ns()
            a.deregister_memory(reg)
            t2 = time.perf_counter_ns()
            if i >= warm:
                r.append(t1 - t0)
                d.append(t2 - t1)
        return statistics.median(r), statistics.median(d)

    # -- row 5: one region of 1 MiB
    def reg1(self):
        if not hasattr(self, "mib"):
            self.mib = np.ones(MiB, np.uint8)
        r, d = self._reg_dereg([(self.mib.ctypes.data, MiB, 0, "")], 500, 20)
        return {"reg1": r / 1e3, "dereg1": d / 1e3}

    # -- row 6: 1000 regions in one call
    def reg1000(self):
        if not hasattr(self, "thousand"):
            self.thousand = np.ones(1000 * 8 * KiB, np.uint8)
        base = self.thousand.ctypes.data
        descs = [(base + i * 8 * KiB, 4 * KiB, 0, "") for i in range(1000)]
        r, d = self._reg_dereg(descs, 10, 1)
        return {"reg1000": r / 1e6, "dereg1000": d / 1e6}

    # -- row 7: make_prepped_xfer of 1024 descriptors, alone
    def make(self):
        a = self.agent
        lp, rp = self.lists[("pool", KV_BLK)]
        tables = [self._draw(KV_N, KV_REQ) for _ in range(310)]
        ts = []
        for i, (li, ri) in enumerate(tables):
            t0 = time.perf_counter_ns()
            h = a.make_prepped_xfer("WRITE", lp, li, rp, ri)
            t = time.perf_counter_ns() - t0
            a.release_xfer_handle(h)
            if i >= 10:
                ts.append(t)
        return {"make": statistics.median(ts) / 1e3}

    # -- row 10: a burst of makes, every handle live until the burst ends
    def burst(self):
        import resource
        a = self.agent
        lp, rp = self.lists[("pool", KV_BLK)]
        tables = [self._draw(KV_N, KV_REQ) for _ in range(BURST)]
        hs, ts = [], []
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        try:
            for li, ri in tables:
                t0 = time.perf_counter_ns()
                hs.append(a.make_prepped_xfer("WRITE", lp, li, rp, ri))
                ts.append(time.perf_counter_ns() - t0)
            f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        finally:
            for h in hs:
                a.release_xfer_handle(h)
        return {"burst": statistics.median(ts) / 1e3, "burst_faults": (f1 - f0) / BURST}

    # -- row 8: get_xfer_descs from an (N, 3) array
    def descs(self):
        a = self.agent
        n = 65536
        if not hasattr(self, "desc_arr"):
            self.desc_mem = np.ones(n * KiB, np.uint8)
            self.desc_arr = table(self.desc_mem.ctypes.data, n, KiB)
        ts = []
        for i in range(21):
            t0 = time.perf_counter_ns()
            x = a.get_xfer_descs(self.desc_arr, "DRAM")
            t = time.perf_counter_ns() - t0
            del x
            if i:
                ts.append(t)
        return {"descs": statistics.median(ts) / n}

    # -- row 9: a big untouched registration
    def big(self):
        a = self.agent
        size = int(self.args.big_gib * GiB)
        avail = mem_available()
        if avail is not None and avail < size + GiB:
            raise Skip(f"MemAvailable {avail / GiB:.1f} GiB < {self.args.big_gib:g} GiB + 1 GiB")
        try:
            mem = np.empty(size, np.uint8)
        except MemoryError:
            raise Skip(f"np.empty of {self.args.big_gib:g} GiB failed (MemoryError)") from None
        try:
            t0 = time.perf_counter_ns()
            reg = a.register_memory([(mem.ctypes.data, size, 0, "")], "DRAM")
            t1 = time.perf_counter_ns()
            a.deregister_memory(reg)
            t2 = time.perf_counter_ns()
            reg = a.register_memory([(mem.ctypes.data, size, 0, "")], "DRAM")
            t3 = time.perf_counter_ns()
            a.deregister_memory(reg)
        finally:
            del mem
        return {"big": (t1 - t0) / 1e6, "bigdereg": (t2 - t1) / 1e6, "bigagain": (t3 - t2) / 1e6}

    def close(self):
        rc = None
        try:
            for lp, rp in self.lists.values():
                self.agent.release_dlist_handle(lp)
                self.agent.release_dlist_handle(rp)
            self.lists = {}
            if self.src_reg is not None:
                self.agent.deregister_memory(self.src_reg)
                self.src_reg = None
        finally:
            close = getattr(self.agent, "close", None)
            if close:
                close()
            if self.peer is not None:
                rc = self.peer.close()
        return rc


class Skip(Exception):
    pass


def parse_rows(text, error):
    sel = set()
    for tok in filter(None, (t.strip() for t in text.split(","))):
        if tok == "all":
            sel |= set(GROUPS)
        elif tok == "write":
            sel |= set(WRITE_SIZES)
        elif tok.isdigit():
            hit = {k for k, g in GROUPS.items() if g == int(tok)}
            if not hit:
                error(f"--rows: no row {tok} (1-10)")
            sel |= hit
        elif tok in GROUPS:
            sel.add(tok)
        else:
            error(f"--rows: unknown row {tok!r}; rows are 1-10 or "
                  + ", ".join(["write"] + list(GROUPS)))
    return sel


def fmt(v):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="all", help="comma list: numbers 1-10 or names (write, "
                    + ", ".join(GROUPS) + "); default all")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--big-gib", type=float, default=4.0,
                    help="size of row 9's registration in GiB (default 4)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows to FILE as JSON")
    ap.add_argument("--ucx-param", metavar="KEY=VALUE", action="append", default=[],
                    help="this side's UCX backend parameter, repeatable (with kvlane's "
                    "package e.g. cuda.pin_host=sync); the agent then starts with "
                    "backends=[] and create_backend(\"UCX\", {...})")
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer-bytes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        return peer_main(args.peer_bytes)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    sel = parse_rows(args.rows, ap.error)
    for i, kv in enumerate(args.ucx_param):
        k, eq, v = kv.partition("=")
        if not k or not eq:
            ap.error(f"--ucx-param {kv!r}: expected KEY=VALUE")
        args.ucx_param[i] = (k, v)

    import nixl
    import nixl._api as api
    shim = getattr(nixl, "__kvlane__", None)
    print(f"nixl: {nixl.__file__}")
    print(f"      nixl._api {api.__file__}; nixl_agent from {api.nixl_agent.__module__}; "
          + (f"kvlane {shim} (kvlane's package, not NIXL)" if shim else
             f"version {getattr(nixl, '__version__', '?')}"))
    if args.ucx_param:
        print("UCX backend parameters (this side): "
              + ", ".join(f"{k}={v}" for k, v in args.ucx_param))
    print(f"host: {os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"python {sys.version.split()[0]}, numpy {np.__version__}")

    t_start = time.monotonic()
    results = {k: [] for k, *_ in SPEC}
    skipped = {}
    bench = None
    status = 0
    try:
        bench = Bench(api, sel, args)
        if bench.peer is not None:
            print(f"peer: nixl {bench.peer_nixl}; transfers moved by {bench.backend}")
            if bench.peer_nixl != nixl.__file__:
                print("      warning: the peer imported another nixl than this process")
        order = [k for k in GROUPS if k in sel]
        for rnd in range(args.rounds):
            for key in order:
                if key in skipped:
                    continue
                gc.collect()
                fn = bench.write if key in WRITE_SIZES else getattr(bench, key)
                try:
                    out = fn(key) if key in WRITE_SIZES else fn()
                except Skip as e:
                    skipped[key] = str(e)
                    continue
                for k, v in out.items():
                    results[k].append(v)
            print(f"round {rnd + 1}/{args.rounds} done ({time.monotonic() - t_start:.1f} s)",
                  file=sys.stderr, flush=True)
    except CheckFailed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        status = 1
    except Exception as e:
        print(f"ERROR: {type(e).__name__}: {e}", file=sys.stderr)
        import traceback
        traceback.print_exc()
        status = 2
    finally:
        if bench is not None:
            try:
                prc = bench.close()
                if prc and not status:
                    print(f"ERROR: the peer exited with status {prc}", file=sys.stderr)
                    status = 2
            except Exception as e:
                print(f"ERROR at teardown: {type(e).__name__}: {e}", file=sys.stderr)
                status = status or 2

    rows = []
    for key, group, label, unit, ref, higher in SPEC:
        if group not in sel:
            continue
        if group == "big":
            label = label.format(gib=f"{args.big_gib:g}")
        vals = results[key]
        row = {"key": key, "row": GROUPS[group], "label": label.strip(), "unit": unit,
               "rounds": vals, "best": None, "median": None, "baselines_nixl_1_4": ref,
               "speed_vs_nixl": None}
        if group in skipped:
            row["skipped"] = skipped[group]
        if vals:
            row["best"] = max(vals) if higher else min(vals)
            row["median"] = statistics.median(vals)
            if ref is not None and not (group == "big" and args.big_gib != 4):
                row["speed_vs_nixl"] = row["best"] / ref if higher else ref / row["best"]
        row["_label"] = label
        rows.append(row)

    nround = min((len(r["rounds"]) for r in rows if r["rounds"]), default=0)
    print()
    print(f"{'row':<46}{'best':>9}{'median':>9}  {'unit':<8}{'BASELINES NIXL 1.4*':>20}"
          f"{'speed vs NIXL':>15}")
    for r in rows:
        ref = fmt(r["baselines_nixl_1_4"])
        sp = "-" if r["speed_vs_nixl"] is None else f"{r['speed_vs_nixl']:.2f}x"
        extra = f"   skipped: {r['skipped']}" if "skipped" in r else ""
        print(f"{r['_label']:<46}{fmt(r['best']):>9}{fmt(r['median']):>9}  {r['unit']:<8}"
              f"{ref:>20}{sp:>15}{extra}")
    print(f"best and median of {nround} interleaved rounds; speed vs NIXL: this run's best "
          "against the constant, > 1 faster.")
    print("* BASELINES NIXL 1.4: figures measured elsewhere (/work/shared/BASELINES.md, "
          "2026-12-03: NIXL 1.4 with UCX 1.22, 2-vCPU VM), NOT in this run.")
    if "big" in sel and args.big_gib != 4:
        print(f"  (row 9 ran with {args.big_gib:g} GiB; NIXL's figure is for 4 GiB, so no ratio)")
    if bench is not None and bench.peer is not None:
        print(f"data checked by the peer {bench.peer.checks} times (every data row, every "
              "round)" + (": all landed" if not status else ""))
    print(f"total {time.monotonic() - t_start:.1f} s; load now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nixl": nixl.__file__, "kvlane": shim, "backend": bench and bench.backend,
                       "rounds": args.rounds, "cpus": os.cpu_count(), "status": status,
                       "rows": [{k: v for k, v in r.items() if k != "_label"} for r in rows]},
                      f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
