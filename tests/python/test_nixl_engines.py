"""Each engine's NIXL call sequence between two processes, through the `nixl`
package with no import edited (tests/python/engine_shapes.py holds the
calls). DRAM runs everywhere; VRAM needs torch with CUDA (the GPU machine)
and must take kvlane's cuda backend."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
NIXL_PATH = os.environ.get("KVL_NIXL_PATH") or os.path.join(
    os.environ.get("KVL_BUILD", os.path.join(HERE, "..", "..", "build")), "python-nixl")
# Who moves the data: vLLM's decode pulls, the others' prefill pushes.
INITIATOR = {"vllm": "decode", "sglang": "prefill", "sglang_prepped": "prefill",
             "dynamo": "prefill", "lmcache": "prefill"}


def _cuda_ok():
    r = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                       capture_output=True, timeout=120)
    return r.returncode == 0


class Side:
    def __init__(self, engine, role, kind):
        env = dict(os.environ)
        env["PYTHONPATH"] = NIXL_PATH          # the nixl folder only: nothing else edited
        self.role = role
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "engine_shapes.py"), engine, role, kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            err = self.p.stderr.read()
            raise AssertionError(f"{self.role} exited ({self.p.wait()}) before answering:\n"
                                 f"{err[-4000:]}")
        return json.loads(line)

    def send(self, obj):
        self.p.stdin.write(json.dumps(obj) + "\n")
        self.p.stdin.flush()

    def finish(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        rc = self.p.wait(60)
        err = self.p.stderr.read()
        assert rc == 0, f"{self.role} exited {rc}:\n{err[-4000:]}"
        assert "Traceback" not in err, err[-4000:]


def run_pair(engine, kind):
    sides = {r: Side(engine, r, kind) for r in ("prefill", "decode")}
    try:
        hello = {r: s.read() for r, s in sides.items()}
        sides["prefill"].send(hello["decode"])
        sides["decode"].send(hello["prefill"])
        init = sides[INITIATOR[engine]]
        passive = sides["decode" if init.role == "prefill" else "prefill"]
        result = init.read()
        assert result["ok"], result
        passive.send(result)
        assert passive.read()["ok"]
        init.send({"bye": True})
        for s in sides.values():
            s.finish()
        return result
    finally:
        for s in sides.values():
            if s.p.poll() is None:
                s.p.kill()
                s.p.wait()


@pytest.mark.parametrize("engine", sorted(INITIATOR))
def test_engine_dram(engine):
    res = run_pair(engine, "DRAM")
    if "backend" in res:
        assert res["backend"] == "SHM"      # same host, DRAM: the shm backend


@pytest.mark.parametrize("engine", sorted(INITIATOR))
def test_engine_vram(engine):
    if not _cuda_ok():
        pytest.skip("needs torch with a CUDA GPU (runs on the GPU machine)")
    res = run_pair(engine, "VRAM")
    if "backend" in res:
        assert res["backend"] == "CUDA", res  # VRAM on one host: CUDA IPC, not staging


if __name__ == "__main__":
    # Without pytest (the GPU machine): python3 test_nixl_engines.py [DRAM|VRAM]...
    kinds = sys.argv[1:] or ["DRAM", "VRAM"]
    failed = 0
    for kind in kinds:
        for engine in sorted(INITIATOR):
            try:
                res = run_pair(engine, kind)
                want = "SHM" if kind == "DRAM" else "CUDA"
                ok = res.get("backend", want) == want
                print(f"{engine:<16}{kind:<6}{'ok' if ok else 'WRONG BACKEND'} {res}")
                failed += not ok
            except Exception as e:  # noqa: BLE001
                print(f"{engine:<16}{kind:<6}FAILED {e}")
                failed += 1
    sys.exit(1 if failed else 0)
