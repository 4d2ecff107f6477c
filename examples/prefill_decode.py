#!/usr/bin/env python3
"""Disaggregated prefill/decode in two processes with kvlane.

The decode process owns a KV cache laid out [layer][block][bytes], registers
it and hands its metadata to the prefill process. Prefill computes (here:
fills) the KV blocks of one request and writes them into the decode cache
blocks the scheduler picked, one strided descriptor per block (every layer
at once), with a notification that arrives only after the data is in place.
Decode then checks every byte.

    PYTHONPATH=build/python python3 examples/prefill_decode.py
"""

import multiprocessing as mp
import sys

import numpy as np

import kvlane

LAYERS, BLOCKS, BLOCK_BYTES = 16, 256, 16 << 10    # 64 MiB of cache per side


def fill(cache, blocks, seed):
    for b in blocks:
        cache[:, b, :] = (np.arange(LAYERS * BLOCK_BYTES, dtype=np.uint32)
                          .reshape(LAYERS, BLOCK_BYTES) * 31 + b * 7 + seed).astype(np.uint8)


def decode(conn):
    with kvlane.Agent("decode") as agent:
        cache = np.zeros((LAYERS, BLOCKS, BLOCK_BYTES), np.uint8)
        print(agent.register_memory(cache))
        conn.send((agent.get_metadata(), cache.ctypes.data))
        request = conn.recv()     # {"id", "prefill_blocks", "decode_blocks"}
        if not agent.wait_notif(30000):
            raise SystemExit("decode: no notification within 30 s")
        (sender, msg), = agent.poll()
        expect = np.zeros_like(cache)
        fill(expect, request["prefill_blocks"], seed=request["id"])
        got = cache[:, request["decode_blocks"], :]
        want = expect[:, request["prefill_blocks"], :]
        if not np.array_equal(got, want):
            raise SystemExit("decode: KV blocks differ")
        print(f"decode: {msg.decode()!r} from {sender}: {got.nbytes >> 20} MiB in "
              f"{len(request['decode_blocks'])} blocks x {LAYERS} layers verified")
        conn.send("ok")


def prefill(conn):
    with kvlane.Agent("prefill") as agent:
        cache = np.zeros((LAYERS, BLOCKS, BLOCK_BYTES), np.uint8)
        agent.register_memory(cache)
        metadata, remote_base = conn.recv()
        remote = agent.load_metadata(metadata)

        request = {"id": 42, "prefill_blocks": [3, 4, 5, 17, 90],
                   "decode_blocks": [200, 201, 7, 8, 9]}
        fill(cache, request["prefill_blocks"], seed=request["id"])
        conn.send(request)

        # Block b of every layer: base + b*BLOCK_BYTES, stride one layer, LAYERS blocks.
        layer_stride = BLOCKS * BLOCK_BYTES
        local = kvlane.DList.from_strided(
            cache.ctypes.data + np.array(request["prefill_blocks"], np.uint64) * BLOCK_BYTES,
            layer_stride, LAYERS, BLOCK_BYTES)
        dst = kvlane.DList.from_strided(
            remote_base + np.array(request["decode_blocks"], np.uint64) * BLOCK_BYTES,
            layer_stride, LAYERS, BLOCK_BYTES)
        xfer = agent.xfer("WRITE", local, remote, dst, notif=f"req-{request['id']} ready")
        xfer.post()
        xfer.wait(30000)
        s = xfer.stats()
        print(f"prefill: wrote {s['bytes'] >> 20} MiB ({s['blocks']} blocks, {s['segments']} "
              f"segments) to {remote} over {s['backend']}/{s['path']} in "
              f"{s['duration_ns'] / 1e6:.2f} ms")
        if conn.recv() != "ok":
            raise SystemExit("prefill: decode did not confirm")


def main():
    ctx = mp.get_context("spawn")     # agents are never inherited through fork
    a, b = ctx.Pipe()
    p = ctx.Process(target=decode, args=(b,))
    p.start()
    try:
        prefill(a)
    finally:
        p.join(60)
    return p.exitcode


if __name__ == "__main__":
    sys.exit(main())
