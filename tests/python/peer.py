"""A peer process for kvlane's Python tests: peer.py MODE NAME.

Exposes a 1 MiB buffer filled with a known pattern and answers commands read
from stdin (length-prefixed pickles of (cmd, args)); replies (ok, value)."""

import pickle
import struct
import sys

from kvlpattern import pattern

mode, name = sys.argv[1], sys.argv[2]


buf = pattern(7)
if mode == "nixl":
    from kvlane.nixl import nixl_agent, nixl_agent_config
    listen = len(sys.argv) > 3 and sys.argv[3] == "listen"
    agent = nixl_agent(name, nixl_agent_config(enable_listen_thread=listen, listen_port=0,
                                               backends=["UCX"]))
    reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    core = agent.agent
else:
    import kvlane
    agent = kvlane.Agent(name)
    agent.register_memory(buf)
    core = agent


def reply(ok, value):
    data = pickle.dumps((ok, value))
    sys.stdout.buffer.write(struct.pack("<Q", len(data)) + data)
    sys.stdout.buffer.flush()


def handle(cmd, args):
    if cmd == "addr":
        return buf.ctypes.data
    if cmd == "md":
        return core.get_metadata()
    if cmd == "load":
        return core.load_metadata(args[0])
    if cmd == "bytes":
        off, n = args
        return buf[off:off + n].tobytes()
    if cmd == "fill":
        buf[:] = pattern(args[0])
        return None
    if cmd == "zero":
        buf[:] = 0
        return None
    if cmd == "notifs":
        want, timeout_ms = args
        got = []
        while len(got) < want and core.wait_notif(timeout_ms):
            got += core.poll_notifs()
        return got
    if cmd == "nixl_notifs":
        import time
        want, timeout_s = args
        got, t0 = {}, time.time()
        while sum(len(v) for v in got.values()) < want and time.time() - t0 < timeout_s:
            for k, v in agent.get_new_notifs().items():
                got.setdefault(k, []).extend(v)
            time.sleep(0.001)
        return got
    if cmd == "send":
        core.send_notif(args[0], args[1])
        return None
    if cmd == "listen":
        return core.listen("127.0.0.1", 0)
    if cmd == "listen_address":
        return agent.listen_address
    if cmd == "exit":
        return None
    raise ValueError(f"unknown command {cmd}")


while True:
    hdr = sys.stdin.buffer.read(8)
    if len(hdr) != 8:
        break
    (n,) = struct.unpack("<Q", hdr)
    cmd, args = pickle.loads(sys.stdin.buffer.read(n))
    try:
        reply(True, handle(cmd, args))
    except Exception as e:  # noqa: BLE001
        reply(False, f"{type(e).__name__}: {e}")
    if cmd == "exit":
        break
