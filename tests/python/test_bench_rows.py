"""bench/nixl_rows.py runs through the nixl package, its peer checks the data
it wrote, and it prints the rows it was asked for (a smoke run: one round,
no figure asserted)."""

import json
import os
import subprocess
import sys

from conftest import SRC

NIXL_PATH = os.environ.get("KVL_NIXL_PATH") or os.path.join(
    os.environ.get("KVL_BUILD", os.path.join(SRC, "build")), "python-nixl")


def _run(*args, timeout):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([NIXL_PATH, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, os.path.join(SRC, "bench", "nixl_rows.py"), *args],
                          capture_output=True, timeout=timeout, env=env)


def test_nixl_rows_smoke(tmp_path):
    out_json = tmp_path / "rows.json"
    r = _run("--rows", "write4k,kv,reg1,descs,burst", "--rounds", "1", "--json", str(out_json),
             timeout=300)
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert "all landed" in out
    assert "WRITE 4 KiB x 32" in out and "register 1 region of 1 MiB" in out
    rows = json.loads(out_json.read_text())
    assert rows["status"] == 0
    keys = {row["key"] for row in rows["rows"]}
    assert {"write4k", "kv", "reg1", "dereg1", "descs", "burst", "burst_faults"} <= keys, keys
    # page faults may be none at all; every other row is a time or a rate
    assert all(row["best"] > 0 for row in rows["rows"] if row["key"] != "burst_faults"), rows
    assert all(row["best"] >= 0 for row in rows["rows"]), rows


def test_nixl_rows_refuses_unknown_row():
    r = _run("--rows", "nosuchrow", timeout=60)
    assert r.returncode != 0
    assert b"nosuchrow" in r.stdout + r.stderr
