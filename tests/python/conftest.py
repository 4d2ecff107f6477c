"""Shared fixtures for kvlane's Python tests: the package from the build tree
and peer processes (tests/python/peer.py) driven over pipes."""

import os
import pickle
import struct
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))


def _pythonpath():
    p = os.environ.get("PYTHONPATH", "")
    if not p:
        build = os.environ.get("KVL_BUILD", os.path.join(SRC, "build"))
        p = os.path.join(build, "python")
        os.environ["PYTHONPATH"] = p
        sys.path.insert(0, p)
    return p


_pythonpath()


class Peer:
    """A peer process running peer.py: call(cmd, *args) -> its reply."""

    def __init__(self, name, mode="core", extra=()):
        self.proc = subprocess.Popen(
            [sys.executable, *_flags_to_args(), os.path.join(HERE, "peer.py"), mode, name,
             *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ))
        self.name = name

    def call(self, cmd, *args, timeout=30):
        data = pickle.dumps((cmd, args))
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self.proc.stdin.flush()
        hdr = self.proc.stdout.read(8)
        if len(hdr) != 8:
            raise RuntimeError(f"peer {self.name} died (exit {self.proc.wait(timeout)})")
        (n,) = struct.unpack("<Q", hdr)
        ok, value = pickle.loads(self.proc.stdout.read(n))
        if not ok:
            raise RuntimeError(f"peer {self.name}: {value}")
        return value

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("exit")
            except Exception:  # noqa: BLE001
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        return self.proc.returncode


def _flags_to_args():
    args = []
    if sys.flags.dev_mode:
        args += ["-X", "dev"]
    return args




@pytest.fixture
def peer_factory():
    peers = []

    def make(name, mode="core", extra=()):
        p = Peer(name, mode, extra)
        peers.append(p)
        return p
    yield make
    for p in peers:
        rc = p.close()
        assert rc == 0, f"peer {p.name} exited with {rc}"


@pytest.fixture
def uniq(request):
    """A name unique to this test and process (agents are named per test)."""
    return f"{request.node.name[:40]}-{os.getpid()}".replace("[", "_").replace("]", "_")
