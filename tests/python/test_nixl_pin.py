"""Backend parameters as engines pass them: kvlane.nixl's
create_backend("UCX", {"cuda.pin_host": ...}) reaches the cuda backend. Run
against the stand-in CUDA driver (tests/fakes/fake_gpu.c), which keeps the
page-locked host ranges, so it runs on machines without a GPU: with auto a
registered NumPy buffer is pinned after register_memory returns, with sync
before it returns, with off never; deregister_memory unlocks it; a bad value
is refused naming the choices. Each case runs in its own process: the driver
is chosen (KVL_CUDA_DRIVER) when kvlane first needs it."""

import os
import subprocess
import sys

import pytest

from conftest import SRC

BUILD = os.environ.get("KVL_BUILD", os.path.join(SRC, "build"))
FAKE = os.path.join(BUILD, "tests", "libkvl_fake_gpu.so")

CASE = r"""
import ctypes, sys, time
import numpy as np
from kvlane.nixl import nixl_agent, nixl_agent_config

fake = ctypes.CDLL(sys.argv[1])
mode = sys.argv[2]


def locked(p):
    out = (ctypes.c_long * 5)()
    return fake.kvl_fake_gpu_hostreg(out, ctypes.c_void_p(p)) == 1


a = nixl_agent("pin-" + mode, nixl_agent_config(backends=[]))
try:
    a.create_backend("UCX", {"cuda.pin_host": mode})
except Exception as e:
    print("refused:", type(e).__name__, e)
    sys.exit(3)
buf = np.ones(1 << 20, np.uint8)
p = buf.ctypes.data
descs = a.register_memory([(p, buf.nbytes, 0, "")], "DRAM")
if mode == "sync":
    assert locked(p) and locked(p + buf.nbytes - 1), "sync: pinned when the call returns"
elif mode == "auto":
    for _ in range(60000):  # bounded: 60 s
        if locked(p + buf.nbytes - 1):
            break
        time.sleep(0.001)
    assert locked(p) and locked(p + buf.nbytes - 1), "auto: pinned by the pin thread"
else:
    assert not locked(p), "off: never pinned"
a.deregister_memory(descs)
assert not locked(p), "unlocked when deregister_memory returns"
print("ok", mode)
"""


def _case(mode):
    if not os.path.exists(FAKE):
        pytest.skip(f"the stand-in driver {FAKE} is not built")
    env = dict(os.environ, KVL_CUDA_DRIVER=FAKE)
    return subprocess.run([sys.executable, "-c", CASE, FAKE, mode], capture_output=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("mode", ["auto", "sync", "off"])
def test_pin_host_modes(mode):
    r = _case(mode)
    out = r.stdout.decode() + r.stderr.decode()
    assert r.returncode == 0, out
    assert f"ok {mode}" in out


def test_pin_host_bad_value():
    r = _case("lazy")
    out = r.stdout.decode() + r.stderr.decode()
    assert r.returncode == 3, out
    assert 'parameter pin_host="lazy" is not one of auto, sync, off' in out, out
