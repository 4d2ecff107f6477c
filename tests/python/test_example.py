"""examples/prefill_decode.py runs and verifies its bytes."""

import os
import subprocess
import sys

from conftest import SRC


def test_prefill_decode_example():
    r = subprocess.run([sys.executable, os.path.join(SRC, "examples", "prefill_decode.py")],
                       capture_output=True, timeout=120, env=dict(os.environ))
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert "verified" in out and "prefill: wrote" in out
