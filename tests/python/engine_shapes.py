"""One side of an engine's KV transfer, written with that engine's NIXL calls
(imports, argument shapes, exceptions caught) and run through the `nixl`
package with no import edited:

    PYTHONPATH=build/python-nixl python3 engine_shapes.py ENGINE ROLE KIND

ENGINE: vllm (decode READs from prefill, notification to prefill), sglang
(prefill WRITEs with initialize_xfer), sglang_prepped (prefill WRITEs with
prepared lists, int32 indices), dynamo (keyword calls, 'cpu'/'cuda'),
lmcache (serialized descriptor lists, no notification). ROLE: prefill or
decode. KIND: DRAM (NumPy) or VRAM (torch CUDA tensors).

Protocol with the harness (tests/python/test_nixl_engines.py), JSON lines:
each side prints its hello (metadata, addresses), reads the other's; the
side that moves the data does it and prints its result; the harness hands
that to the passive side, which checks what it must (notifications, bytes)
and prints its own result. Exit 0 only when every check passed.
"""

import base64
import json
import sys
import time
import uuid

LAYERS, BLOCKS, BS = 4, 64, 16384
SRC_IDS = [3, 4, 5, 17, 30, 31, 63]          # prefill's blocks of the request
DST_IDS = [10, 2, 40, 41, 0, 63, 7]           # where they go on the decode side
ROOM = 7


def out(obj):
    print(json.dumps(obj), flush=True)


def inp():
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("harness closed the pipe")
    return json.loads(line)


def b64(b):
    return base64.b64encode(b).decode()


def unb64(s):
    return base64.b64decode(s)


class KV:
    """LAYERS tensors of BLOCKS x BS bytes, DRAM (NumPy) or VRAM (torch)."""

    def __init__(self, kind, fill):
        self.kind = kind
        if kind == "VRAM":
            import torch
            self.torch = torch
            self.t = [torch.zeros(BLOCKS * BS, dtype=torch.uint8, device="cuda:0")
                      for _ in range(LAYERS)]
            self.dev = 0
        else:
            import numpy as np
            self.np = np
            self.t = [np.zeros(BLOCKS * BS, np.uint8) for _ in range(LAYERS)]
            self.dev = 0
        if fill:
            for layer in range(LAYERS):
                for b in range(BLOCKS):
                    self.view(layer, b)[:] = self.expect(layer, b)

    def ptr(self, layer):
        t = self.t[layer]
        return t.data_ptr() if self.kind == "VRAM" else t.ctypes.data

    def view(self, layer, b):
        return self.t[layer][b * BS:(b + 1) * BS]

    def expect(self, layer, b):
        if self.kind == "VRAM":
            a = self.torch.arange(BS, device="cuda:0", dtype=self.torch.int64)
            return ((a + layer * 17 + b * 7) % 251).to(self.torch.uint8)
        a = self.np.arange(BS, dtype=self.np.int64)
        return ((a + layer * 17 + b * 7) % 251).astype(self.np.uint8)

    def check(self):
        """Moved blocks hold the prefill's bytes, every other block zeros."""
        moved = dict(zip(DST_IDS, SRC_IDS))
        if self.kind == "VRAM":
            self.torch.cuda.synchronize()
        for layer in range(LAYERS):
            for b in range(BLOCKS):
                got = self.view(layer, b)
                if b in moved:
                    want = self.expect(layer, moved[b])
                    ok = bool((got == want).all())
                else:
                    ok = not bool(got.any())
                if not ok:
                    raise AssertionError(f"layer {layer} block {b}: wrong bytes")

    @property
    def mem(self):
        return "VRAM" if self.kind == "VRAM" else "DRAM"


def wait_notifs(agent, want, timeout=30, method="get_new_notifs"):
    """Poll notifications until every message in want arrived (set of bytes)."""
    got, t0 = [], time.time()
    while not want <= set(got):
        if time.time() - t0 > timeout:
            raise AssertionError(f"notifications {want - set(got)} not received (got {got})")
        res = getattr(agent, method)()
        if method == "update_notifs":
            got = [m for msgs in res.values() for m in msgs]
        else:
            for msgs in res.values():
                got.extend(msgs)
        time.sleep(0.001)
    return got


def wait_done(agent, h, timeout=30):
    t0 = time.time()
    state = "PROC"
    while state == "PROC":
        if time.time() - t0 > timeout:
            raise AssertionError("transfer not done in time")
        state = agent.check_xfer_state(h)
    return state


# ---- vLLM: NixlConnector (decode pulls) -------------------------------------------------

def vllm(role, kind):
    from nixl._api import nixl_agent as NixlWrapper
    from nixl._bindings import nixlXferTelemetry
    from nixl._api import nixl_agent_config
    import numpy as np

    backends = ["UCX"]
    config = nixl_agent_config(num_threads=4, capture_telemetry=True)
    w = NixlWrapper(str(uuid.uuid4()), config)
    kv = KV(kind, fill=(role == "prefill"))
    memory_type = kv.mem
    caches_data = [(kv.ptr(layer), BLOCKS * BS, kv.dev, "") for layer in range(LAYERS)]
    descs = w.get_reg_descs(caches_data, memory_type)
    w.register_memory(descs, backends=backends)
    blocks_data = np.empty((LAYERS * BLOCKS, 3), dtype=np.uint64)
    for layer in range(LAYERS):
        for b in range(BLOCKS):
            blocks_data[layer * BLOCKS + b] = (kv.ptr(layer) + b * BS, BS, kv.dev)
    xfer_descs = w.get_xfer_descs(blocks_data, memory_type)
    local = w.prep_xfer_dlist("NIXL_INIT_AGENT", xfer_descs)
    out({"md": b64(w.get_agent_metadata()), "blocks": blocks_data.tolist()})
    peer = inp()
    if role == "decode":
        remote_name = w.add_remote_agent(unb64(peer["md"]))
        rdata = np.array(peer["blocks"], dtype=np.uint64)
        remote = w.prep_xfer_dlist(remote_name, w.get_xfer_descs(rdata, memory_type))
        lids = np.concatenate([np.arange(LAYERS) * BLOCKS + d for d in DST_IDS])
        rids = np.concatenate([np.arange(LAYERS) * BLOCKS + s for s in SRC_IDS])
        notif_id = f"req-{ROOM}:1".encode()
        handle = None
        try:
            handle = w.make_prepped_xfer("READ", local, lids, remote, rids, notif_msg=notif_id)
            w.transfer(handle)
        except Exception:
            if handle is not None:
                w.release_xfer_handle(handle)
            raise
        state = w.check_xfer_state(handle)
        while state == "PROC":
            state = w.check_xfer_state(handle)
        assert state == "DONE", state
        res = w.get_xfer_telemetry(handle)
        assert isinstance(res, nixlXferTelemetry)
        assert res.totalBytes == len(lids) * BS and res.descCount == len(lids)
        assert res.xferDuration >= 0 and res.postDuration >= 0
        backend = w.query_xfer_backend(handle)
        w.release_xfer_handle(handle)
        kv.check()
        w.release_dlist_handle(remote)
        w.remove_remote_agent(remote_name)
        out({"ok": True, "backend": backend, "path": res.path})
        inp()
    else:
        got = wait_notifs(w, {f"req-{ROOM}:1".encode()})
        for notif in got:
            req_id, consumers = notif.decode("utf-8").rsplit(":", 1)
            assert req_id == f"req-{ROOM}" and consumers == "1"
        fin = inp()
        out({"ok": True, "peer": fin})
    w.release_dlist_handle(local)
    w.deregister_memory(descs)


# ---- SGLang: NixlKVManager (prefill pushes) -------------------------------------------------

def sglang(role, kind, prepped=False):
    from nixl._api import nixl_agent
    import numpy as np

    agent = nixl_agent(str(uuid.uuid4()))
    kv = KV(kind, fill=(role == "prefill"))
    aux = np.zeros(4096, np.uint8)
    if role == "prefill":
        aux[:] = 42
    kv_addrs = [(kv.ptr(layer), BLOCKS * BS, kv.dev, "") for layer in range(LAYERS)]
    kv_descs = agent.register_memory(kv_addrs, kv.mem)
    if not kv_descs:
        raise Exception("NIXL memory registration failed for kv tensors")
    aux_descs = agent.register_memory([(aux.ctypes.data, aux.nbytes, 0, "")], "DRAM")
    if not aux_descs:
        raise Exception("NIXL memory registration failed for aux tensors")
    out({"md": b64(agent.get_agent_metadata()), "name": agent.name,
         "kv": [kv.ptr(layer) for layer in range(LAYERS)], "aux": aux.ctypes.data})
    peer = inp()
    if role == "prefill":
        agent.add_remote_agent(unb64(peer["md"]))
        peer_name = peer["name"]
        notif = f"{ROOM}_kv_0_1"
        handles = []
        if not prepped:
            src_addrs, dst_addrs = [], []
            for layer in range(LAYERS):
                for s, d in zip(SRC_IDS, DST_IDS):
                    src_addrs.append((kv.ptr(layer) + s * BS, BS, kv.dev))
                    dst_addrs.append((peer["kv"][layer] + d * BS, BS, kv.dev))
            src_descs = agent.get_xfer_descs(src_addrs, kv.mem)
            dst_descs = agent.get_xfer_descs(dst_addrs, kv.mem)
            xfer_handle = agent.initialize_xfer("WRITE", src_descs, dst_descs, peer_name,
                                                notif.encode("ascii"))
        else:
            def table(bases):
                arrays = []
                for base in bases:
                    addrs = np.arange(BLOCKS, dtype=np.uint64) * np.uint64(BS) + np.uint64(base)
                    arrays.append(np.column_stack([addrs, np.full(BLOCKS, BS, dtype=np.uint64),
                                                   np.full(BLOCKS, kv.dev, dtype=np.uint64)]))
                return np.vstack(arrays)
            src_prep = agent.prep_xfer_dlist("NIXL_INIT_AGENT",
                                             table([kv.ptr(i) for i in range(LAYERS)]), kv.mem)
            dst_prep = agent.prep_xfer_dlist(peer_name, table(peer["kv"]), kv.mem)
            assert src_prep is not None and dst_prep is not None
            src_indices = np.concatenate([np.array(SRC_IDS) + layer * BLOCKS
                                          for layer in range(LAYERS)]).astype(np.int32)
            dst_indices = np.concatenate([np.array(DST_IDS) + layer * BLOCKS
                                          for layer in range(LAYERS)]).astype(np.int32)
            xfer_handle = agent.make_prepped_xfer("WRITE", src_prep, src_indices, dst_prep,
                                                  dst_indices, notif.encode("ascii"))
        if not xfer_handle:
            raise Exception("KVSender failed to create transfer")
        state = agent.transfer(xfer_handle)
        if state == "ERR":
            raise Exception("KVSender failed to post transfer")
        handles.append(xfer_handle)
        aux_src = agent.get_xfer_descs([(aux.ctypes.data, aux.nbytes, 0)], "DRAM")
        aux_dst = agent.get_xfer_descs([(peer["aux"], aux.nbytes, 0)], "DRAM")
        aux_handle = agent.initialize_xfer("WRITE", aux_src, aux_dst, peer_name,
                                           f"{ROOM}_aux".encode("ascii"))
        assert agent.transfer(aux_handle) != "ERR"
        handles.append(aux_handle)
        while True:
            states = [agent.check_xfer_state(x) for x in handles]
            if "ERR" in states:
                raise Exception("transfer failed")
            if all(s == "DONE" for s in states):
                break
        out({"ok": True, "backend": agent.query_xfer_backend(handles[0]),
             "name": agent.name.encode("ascii").decode()})
        inp()
    else:
        want = {f"{ROOM}_kv_0_1".encode(), f"{ROOM}_aux".encode()}
        got = wait_notifs(agent, want)
        for msg in got:
            parts = msg.decode("ascii").split("_")
            assert int(parts[0]) == ROOM
        kv.check()
        assert (aux == 42).all()
        fin = inp()
        out({"ok": True, "peer": fin})
    agent.deregister_memory(kv_descs)
    agent.deregister_memory(aux_descs)


# ---- Dynamo: nixl_connect (keyword calls) -----------------------------------------------------

def dynamo(role, kind):
    try:
        import nixl._api as nixl_api
        import nixl._bindings as nixl_bindings  # noqa: F401
    except ImportError as e:
        raise ImportError("NIXL Python bindings must be installed") from e

    nixl = nixl_api.nixl_agent(uuid.uuid4().hex)
    kv = KV(kind, fill=(role == "prefill"))
    device_kind = "cuda" if kind == "VRAM" else "cpu"
    if kind == "VRAM":
        handles = [nixl.register_memory(t) for t in kv.t]        # one tensor each
    else:
        handles = [nixl.register_memory([(kv.ptr(layer), BLOCKS * BS, kv.dev, device_kind)],
                                        device_kind) for layer in range(LAYERS)]
    out({"md": b64(nixl.get_agent_metadata()), "kv": [kv.ptr(i) for i in range(LAYERS)]})
    peer = inp()
    key = str(uuid.uuid4())
    if role == "prefill":
        name = nixl.add_remote_agent(unb64(peer["md"]))
        if isinstance(name, bytes):
            name = name.decode("utf-8")
        local = [(kv.ptr(layer) + s * BS, BS, kv.dev) for layer in range(LAYERS) for s in SRC_IDS]
        remote = [(peer["kv"][layer] + d * BS, BS, kv.dev)
                  for layer in range(LAYERS) for d in DST_IDS]
        local_xfer_descs = nixl.get_xfer_descs(descs=local, mem_type=device_kind)
        remote_xfer_descs = nixl.get_xfer_descs(descs=remote, mem_type=device_kind)
        xfer_hndl = nixl.initialize_xfer(operation="WRITE", local_descs=local_xfer_descs,
                                         remote_descs=remote_xfer_descs, remote_agent=name,
                                         notif_msg=key.encode("utf-8"))
        state = nixl.transfer(xfer_hndl, key.encode("utf-8"))
        while state not in ("DONE", "ERR"):
            state = nixl.check_xfer_state(xfer_hndl)
        assert state == "DONE", state
        try:
            nixl.release_xfer_handle(xfer_hndl)
        except Exception:
            raise
        nixl.remove_remote_agent(name)
        out({"ok": True, "key": key})
        inp()
    else:
        fin = inp()
        t0 = time.time()
        while True:
            notifications = nixl.update_notifs()
            msgs = [m for v in notifications.values() for m in v]
            if fin["key"].encode("utf-8") in msgs:
                break
            if time.time() - t0 > 30:
                raise AssertionError("notification not received")
            time.sleep(0.001)
        kv.check()
        out({"ok": True})
    for h in handles:
        nixl.deregister_memory(h)


# ---- LMCache: NIXL channel (serialized descriptor lists) -----------------------------------

def lmcache(role, kind):
    try:
        from nixl._api import nixl_agent as NixlAgent
        from nixl._api import nixl_agent_config
        from nixl._api import nixl_prepped_dlist_handle as NixlDlistHandle  # noqa: F401
        from nixl._api import nixl_xfer_handle as NixlXferHandle  # noqa: F401
        from nixl._api import nixlBind
    except ImportError as err:
        raise RuntimeError("NIXL is not available") from err
    try:
        from nixl._api import nixl_thread_sync_t
        sync = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
    except ImportError:
        sync = None

    tp_rank = 0
    agent = NixlAgent(str(uuid.uuid4()), nixl_agent_config(backends=["UCX"], sync_mode=sync))
    kv = KV(kind, fill=(role == "prefill"))
    mem = "cuda" if kind == "VRAM" else "cpu"
    # One buffer: the layers are adjacent tensors; register each as LMCache
    # registers its paged buffer, pages of one block.
    memory_desc = [(kv.ptr(layer), BLOCKS * BS, tp_rank, "") for layer in range(LAYERS)]
    reg_descs = agent.get_reg_descs(memory_desc, mem_type=mem)
    agent.register_memory(reg_descs)
    xfer_desc = [(kv.ptr(layer) + b * BS, BS, tp_rank)
                 for layer in range(LAYERS) for b in range(BLOCKS)]
    xfer_descs = agent.get_xfer_descs(xfer_desc, mem_type=mem)
    xfer_handler = agent.prep_xfer_dlist("", xfer_descs, mem_type=mem)
    out({"md": b64(agent.get_agent_metadata()),
         "descs": b64(agent.get_serialized_descs(xfer_descs))})
    peer = inp()
    if role == "prefill":
        remote_agent_name = agent.add_remote_agent(unb64(peer["md"]))
        remote_xfer_dlist = agent.deserialize_descs(unb64(peer["descs"]))
        remote_handler = agent.prep_xfer_dlist(remote_agent_name, remote_xfer_dlist)
        local_indices = [layer * BLOCKS + s for layer in range(LAYERS) for s in SRC_IDS]
        remote_indices = [layer * BLOCKS + d for layer in range(LAYERS) for d in DST_IDS]
        handle = agent.make_prepped_xfer("WRITE", xfer_handler, local_indices, remote_handler,
                                         remote_indices)
        state = agent.transfer(handle)
        while state not in ("DONE", "ERR"):
            try:
                state = agent.check_xfer_state(handle)
            except nixlBind.nixlBackendError:
                raise
        if state == "ERR":
            raise RuntimeError("NIXL transfer failed")
        agent.release_dlist_handle(remote_handler)
        out({"ok": True})
        inp()
    else:
        fin = inp()
        assert fin["ok"]
        kv.check()
        out({"ok": True})
    agent.deregister_memory(reg_descs)
    agent.release_dlist_handle(xfer_handler)


def main():
    engine, role, kind = sys.argv[1:4]
    if engine == "vllm":
        vllm(role, kind)
    elif engine == "sglang":
        sglang(role, kind)
    elif engine == "sglang_prepped":
        sglang(role, kind, prepped=True)
    elif engine == "dynamo":
        dynamo(role, kind)
    elif engine == "lmcache":
        lmcache(role, kind)
    else:
        raise SystemExit(f"unknown engine {engine}")


if __name__ == "__main__":
    main()
