"""kvlane.nixl with NIXL_ETCD_ENDPOINTS: metadata through a real etcd (Debian's
etcd-server on a temporary data dir and free ports), in NIXL's call shapes:
send_local_metadata() / fetch_remote_metadata(name) without an address,
check_remote_metadata polled until the asynchronous fetch lands,
invalidate_local_metadata(), partial metadata under a label; a peer's
departure and restart seen by the agent that loaded it; etcd unreachable
at creation refused with the endpoint named."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pytest

import kvlane
from kvlane.nixl import nixl_agent, nixl_agent_config

ETCD = os.environ.get("KVL_ETCD_BIN", "/usr/bin/etcd")


def _built_without_etcd():
    """The library says so when it was built without the etcd store."""
    a = kvlane.Agent("etcd-built-probe", backends="")
    try:
        a.etcd_attach("http://127.0.0.1:1", timeout_ms=1)
    except kvlane.UnsupportedError as e:
        return "built without the etcd metadata store" in str(e)
    except kvlane.Error:
        return False
    finally:
        a.close()
    return False


pytestmark = [
    pytest.mark.skipif(not os.access(ETCD, os.X_OK),
                       reason=f"no etcd binary at {ETCD} (Debian's etcd-server)"),
    pytest.mark.skipif(_built_without_etcd(), reason="kvlane was built without the etcd store"),
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def etcd():
    d = tempfile.mkdtemp(prefix="kvl-etcd-py-")
    cp, pp = _free_port(), _free_port()
    url, purl = f"http://127.0.0.1:{cp}", f"http://127.0.0.1:{pp}"
    log = open(os.path.join(d, "etcd.log"), "w")
    proc = subprocess.Popen([ETCD, "--name", "kt", "--data-dir", os.path.join(d, "data"),
                             "--listen-client-urls", url, "--advertise-client-urls", url,
                             "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                             "--initial-cluster", f"kt={purl}", "--log-level", "warn"],
                            stdout=log, stderr=log)
    try:
        for _ in range(300):          # 30 s: never hangs
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        break
            except OSError:
                pass
            assert proc.poll() is None, "etcd exited at start"
            time.sleep(0.1)
        else:
            pytest.fail("etcd did not answer /health in 30 s")
        yield url
    finally:
        proc.kill()
        proc.wait()
        log.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def env(etcd, uniq, monkeypatch):
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", etcd)
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", f"/kvltest/{uniq}/")
    monkeypatch.setenv("KVL_ETCD_LEASE_TTL", "10")  # no test here waits for an expiry
    return etcd


def _until(cond, seconds=30):
    """Poll cond (bounded: never hangs)."""
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _xfer_done(agent, h, seconds=30):
    return _until(lambda: agent.check_xfer_state(h) == "DONE", seconds)


def test_publish_fetch_transfer_invalidate(env, uniq):
    conf = nixl_agent_config(backends=["UCX"])
    target = nixl_agent(uniq + "-target", conf)
    init = nixl_agent(uniq + "-init", conf)
    try:
        dst = np.zeros(1 << 16, np.uint8)
        src = (np.arange(1 << 16) % 251).astype(np.uint8)
        target.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
        init.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
        # NIXL's order: fetch may come first; it waits for the publish
        assert init.fetch_remote_metadata(uniq + "-target") is None
        target.send_local_metadata()
        assert _until(lambda: init.check_remote_metadata(uniq + "-target"))
        h = init.initialize_xfer("WRITE", init.get_xfer_descs([(src.ctypes.data, src.nbytes, 0)],
                                                              "DRAM"),
                                 init.get_xfer_descs([(dst.ctypes.data, dst.nbytes, 0)], "DRAM"),
                                 uniq + "-target", b"etcd-done")
        assert init.transfer(h) in ("DONE", "PROC")
        assert _xfer_done(init, h)
        assert np.array_equal(src, dst)
        assert _until(lambda: target.check_remote_xfer_done(uniq + "-init", b"etcd-done"))
        init.release_xfer_handle(h)
        # invalidate: the follower drops it
        target.invalidate_local_metadata()
        assert _until(lambda: not init.check_remote_metadata(uniq + "-target"))
        # published again, fetched again
        target.send_local_metadata()
        init.fetch_remote_metadata(uniq + "-target")
        assert _until(lambda: init.check_remote_metadata(uniq + "-target"))
    finally:
        init.close()
        target.close()


def test_partial_metadata_label(env, uniq):
    a = nixl_agent(uniq + "-a", nixl_agent_config(backends=["UCX"]))
    b = nixl_agent(uniq + "-b", nixl_agent_config(backends=["UCX"]))
    try:
        buf = np.zeros(8192, np.uint8)
        descs = a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
        with pytest.raises(kvlane.InvalidArgument, match="label is required"):
            a.send_partial_agent_metadata(descs, True, ["UCX"])
        a.send_partial_agent_metadata(descs, True, ["UCX"], label="kv-layer0")
        b.fetch_remote_metadata(uniq + "-a", label="other")      # not published: not loaded
        b.fetch_remote_metadata(uniq + "-a", label="kv-layer0")
        assert _until(lambda: b.check_remote_metadata(uniq + "-a"))
        assert b.check_remote_metadata(uniq + "-a",
                                       b.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM"))
    finally:
        b.close()
        a.close()


def test_partial_metadata_steps(env, uniq):
    """NIXL's EtcdSendLocalPartialAndFetchRemote: connection info under one
    label, regions under others, each fetch merged; the default label keeps
    the full metadata."""
    a = nixl_agent(uniq + "-a", nixl_agent_config(backends=["UCX"]))
    b = nixl_agent(uniq + "-b", nixl_agent_config(backends=["UCX"]))
    c = nixl_agent(uniq + "-c", nixl_agent_config(backends=["UCX"]))
    name = uniq + "-a"
    try:
        r1, r2 = np.zeros(8192, np.uint8), np.zeros(8192, np.uint8)
        src = (np.arange(8192) % 251).astype(np.uint8)
        a.register_memory([(r1.ctypes.data, 8192, 0, ""), (r2.ctypes.data, 8192, 0, "")], "DRAM")
        b.register_memory([(src.ctypes.data, 8192, 0, "")], "DRAM")
        x1 = b.get_xfer_descs([(r1.ctypes.data, 8192, 0)], "DRAM")
        x2 = b.get_xfer_descs([(r2.ctypes.data, 8192, 0)], "DRAM")
        a.send_partial_agent_metadata([], label="conn_info")
        b.fetch_remote_metadata(name, label="conn_info")
        assert _until(lambda: b.check_remote_metadata(name))
        assert not b.check_remote_metadata(name, x1)
        a.send_partial_agent_metadata([(r1.ctypes.data, 8192, 0)], label="first_partial")
        b.fetch_remote_metadata(name, label="first_partial")
        assert _until(lambda: b.check_remote_metadata(name, x1))
        assert not b.check_remote_metadata(name, x2)
        h = b.initialize_xfer("WRITE", b.get_xfer_descs([(src.ctypes.data, 8192, 0)], "DRAM"),
                              x1, name)
        assert b.transfer(h) in ("DONE", "PROC")
        assert _xfer_done(b, h)
        assert np.array_equal(r1, src)
        b.release_xfer_handle(h)
        a.send_partial_agent_metadata([(r2.ctypes.data, 8192, 0)], label="second_partial")
        b.fetch_remote_metadata(name, label="second_partial")
        assert _until(lambda: b.check_remote_metadata(name, x2))
        assert b.check_remote_metadata(name, x1)
        # the default label is not a partial one, and it keeps the full metadata
        with pytest.raises(kvlane.InvalidArgument, match="is the default label"):
            a.agent.etcd_publish(None, a.get_partial_agent_metadata([]))
        a.send_local_metadata()
        c.fetch_remote_metadata(name)
        assert _until(lambda: c.check_remote_metadata(name, x1) and
                      c.check_remote_metadata(name, x2))
    finally:
        c.close()
        b.close()
        a.close()


def test_departure_and_restart_seen(env, uniq, caplog):
    name = uniq + "-peer"
    watcher = nixl_agent(uniq + "-w", nixl_agent_config(backends=["UCX"]))
    try:
        peer = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
        peer.send_local_metadata()
        watcher.fetch_remote_metadata(name)
        assert _until(lambda: watcher.check_remote_metadata(name))
        inc1 = watcher.agent.remote_incarnation(name) if hasattr(watcher.agent,
                                                                 "remote_incarnation") else None
        # restart: a new incarnation publishes while the old one still runs
        peer2 = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
        peer2.send_local_metadata()
        assert _until(lambda: not watcher.check_remote_metadata(name))
        peer.close()
        watcher.fetch_remote_metadata(name)
        assert _until(lambda: watcher.check_remote_metadata(name))
        if inc1 is not None:
            assert watcher.agent.remote_incarnation(name) != inc1
        # departure
        peer2.close()
        assert _until(lambda: not watcher.check_remote_metadata(name))
        # a fetch of an agent that never publishes fails in the background,
        # named by the engine's polling of check_remote_metadata
        with caplog.at_level("ERROR", logger="kvlane.nixl"):
            watcher.fetch_remote_metadata(uniq + "-nobody")
            assert _until(lambda: not watcher.check_remote_metadata(uniq + "-nobody") and
                          f"Failed to fetch metadata from etcd for agent {uniq}-nobody"
                          in caplog.text, 40)
        assert "etcd has no metadata of agent" in caplog.text
        assert not watcher.check_remote_metadata(uniq + "-nobody")
    finally:
        watcher.close()


def test_unreachable_at_creation(uniq, monkeypatch):
    port = _free_port()
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", f"http://127.0.0.1:{port}")
    t0 = time.time()
    with pytest.raises(kvlane.RemoteError, match=f"no etcd endpoint answered.*127.0.0.1:{port}"):
        nixl_agent(uniq, nixl_agent_config(backends=["UCX"]))
    assert time.time() - t0 < 60          # bounded (never hangs)


def test_without_store(uniq, monkeypatch):
    monkeypatch.delenv("NIXL_ETCD_ENDPOINTS", raising=False)
    a = nixl_agent(uniq, nixl_agent_config(backends=["UCX"]))
    try:
        with pytest.raises(kvlane.UnsupportedError, match="no central metadata store"):
            a.fetch_remote_metadata("peer")
        with pytest.raises(kvlane.UnsupportedError, match="no central metadata store"):
            a.send_local_metadata()
    finally:
        a.close()


def test_core_agent_api(env, uniq):
    a = kvlane.Agent(uniq + "-ca", backends=("tcp",))
    b = kvlane.Agent(uniq + "-cb", backends=("tcp",))
    try:
        with pytest.raises(kvlane.StateError, match="not attached to etcd"):
            a.etcd_publish()
        a.etcd_attach(env, prefix=f"/kvltest/{uniq}-core", lease_ttl_s=10)
        b.etcd_attach(env, prefix=f"/kvltest/{uniq}-core", lease_ttl_s=10)
        a.etcd_publish()
        with pytest.raises(kvlane.NotFound, match="waited 200 ms"):
            b.etcd_fetch(uniq + "-nope", wait_ms=200)
        b.etcd_fetch(uniq + "-ca", wait_ms=30000)  # waits out a lease lost to load
        assert b.check_remote(uniq + "-ca")
        a.etcd_unpublish()
        assert _until(lambda: not b.check_remote(uniq + "-ca"))
    finally:
        b.close()
        a.close()


def test_core_background_fetch(env, uniq):
    """etcd_fetch_async / etcd_fetch_status: pending, loaded, failed with
    its reason, never started."""
    a = kvlane.Agent(uniq + "-ba", backends=("tcp",))
    b = kvlane.Agent(uniq + "-bb", backends=("tcp",))
    try:
        for x in (a, b):
            x.etcd_attach(env, prefix=f"/kvltest/{uniq}-bg", lease_ttl_s=10)
        with pytest.raises(kvlane.StateError, match="started no background fetch"):
            b.etcd_fetch_status(uniq + "-ba")
        with pytest.raises(kvlane.InvalidArgument, match="not its own peer"):
            b.etcd_fetch_async(uniq + "-bb")
        b.etcd_fetch_async(uniq + "-ba", wait_ms=60000)
        assert b.etcd_fetch_status(uniq + "-ba") is False    # a has not published
        a.etcd_publish()
        assert b.etcd_fetch_status(uniq + "-ba", wait_ms=60000) is True
        assert b.check_remote(uniq + "-ba")
        b.etcd_fetch_async(uniq + "-nope", wait_ms=200)
        with pytest.raises(kvlane.NotFound, match="waited 200 ms"):
            b.etcd_fetch_status(uniq + "-nope", wait_ms=60000)
    finally:
        b.close()
        a.close()


def test_core_partial_withdrawn(env, uniq):
    """A partial label whose region is deregistered is withdrawn from etcd
    (never republished with a region that is gone); the default label stays."""
    a = kvlane.Agent(uniq + "-pa", backends=("tcp",))
    b = kvlane.Agent(uniq + "-pb", backends=("tcp",))
    try:
        a.etcd_attach(env, prefix=f"/kvltest/{uniq}-core", lease_ttl_s=10)
        b.etcd_attach(env, prefix=f"/kvltest/{uniq}-core", lease_ttl_s=10)
        buf, keep = np.zeros(8192, np.uint8), np.zeros(8192, np.uint8)
        a.register_memory([(buf.ctypes.data, 8192, -1), (keep.ctypes.data, 8192, -1)], "DRAM")
        a.etcd_publish()
        part = a.get_partial_metadata(kvlane.DList.from_descs([(buf.ctypes.data, 64, -1)]))
        with pytest.raises(kvlane.InvalidArgument, match="not partial metadata of this agent"):
            a.etcd_publish("p", b.get_partial_metadata())
        a.etcd_publish("p", part)
        with pytest.raises(kvlane.NotFound, match="carries no connection info"):
            b.etcd_fetch(uniq + "-pa", "p", wait_ms=30000)
        b.etcd_fetch(uniq + "-pa", wait_ms=30000)
        b.etcd_fetch(uniq + "-pa", "p", wait_ms=30000)       # merged: nothing new
        a.deregister_memory([(buf.ctypes.data, 8192, -1)])

        def withdrawn():
            try:
                b.etcd_fetch(uniq + "-pa", "p")
            except kvlane.NotFound:
                return True
            except kvlane.Stale:    # still there, older than what b follows
                return False
            return False
        assert _until(withdrawn)
        b.etcd_fetch(uniq + "-pa", wait_ms=30000)            # the default label stays
    finally:
        b.close()
        a.close()


def test_core_label_limit(env, uniq):
    """An agent publishes at most 16 labels (its default one included); a
    label published again replaces its metadata even at the limit."""
    a = kvlane.Agent(uniq + "-la", backends=("tcp",))
    b = kvlane.Agent(uniq + "-lb", backends=("tcp",))
    try:
        for x in (a, b):
            x.etcd_attach(env, prefix=f"/kvltest/{uniq}-lim", lease_ttl_s=10)
        bufs = [np.zeros(4096, np.uint8) for _ in range(16)]
        a.register_memory([(x.ctypes.data, 4096, -1) for x in bufs], "DRAM")
        a.etcd_publish()
        parts = [a.get_partial_metadata(kvlane.DList.from_descs([(x.ctypes.data, 64, -1)]))
                 for x in bufs]
        for i in range(15):
            a.etcd_publish(f"l{i}", parts[i])
        with pytest.raises(kvlane.InvalidArgument, match="already publishes 16 labels"):
            a.etcd_publish("l15", parts[15])
        a.etcd_publish("l3", parts[15])          # replaced: no new label
        a.etcd_publish()                         # the default label again
        b.etcd_fetch(uniq + "-la", wait_ms=30000)
        b.etcd_fetch(uniq + "-la", "l3", wait_ms=30000)
        assert b.check_remote(uniq + "-la")
    finally:
        b.close()
        a.close()


class _Relay:
    """A TCP relay to etcd on a port of its own: each accepted connection
    goes to _serve (in a thread)."""

    def __init__(self, target):
        import threading
        host, port = target.rsplit("//", 1)[1].split(":")
        self.target = (host, int(port))
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.url = f"http://127.0.0.1:{self.lsock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.lsock.close()


class _NoUpgradeProxy(_Relay):
    """Answers WebSocket upgrades with 400, as an HTTP proxy without
    WebSocket support does; every other connection is relayed byte for
    byte. Counts what the first request of each connection asked for."""

    def __init__(self, target):
        self.upgrades = self.watch_posts = 0
        super().__init__(target)

    def _serve(self, c):
        import threading
        head = b""
        while b"\r\n\r\n" not in head:
            d = c.recv(65536)
            if not d:
                c.close()
                return
            head += d
        first = head.split(b"\r\n\r\n", 1)[0].lower()
        if b"upgrade: websocket" in first:
            self.upgrades += 1
            c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                      b"Connection: close\r\n\r\n")
            c.close()
            return
        if first.startswith(b"post /v3/watch "):
            self.watch_posts += 1
        u = socket.create_connection(self.target)
        u.sendall(head)
        threading.Thread(target=self._pump, args=(u, c), daemon=True).start()
        self._pump(c, u)


class _AnswerProxy(_Relay):
    """Reads the HTTP requests of each connection one by one (curl sends
    the next only once the answer before came back) and, while fail is set,
    answers /v3/lease/keepalive itself with the 503 an etcd whose apply
    loop is behind gives; a path in answers gets that body (HTTP 200)
    instead of etcd's; everything else goes to etcd. WebSocket
    connections (the agent's watches) are relayed as they are, and
    counted."""

    ANSWER = (b'{"error":"etcdserver: request timed out, waiting for the applied index '
              b'took too long","code":14,"message":"etcdserver: request timed out, waiting '
              b'for the applied index took too long"}')

    def __init__(self, target):
        self.upgrades = self.failed = self.passed = self.requests = 0
        self.fail = False
        self.answers = {}     # b"/v3/kv/range": body answered in etcd's place (HTTP 200)
        self.canned = 0
        super().__init__(target)

    @staticmethod
    def _read_request(c, buf):
        """One request (head and Content-Length body) from buf and c: the
        request, its head in lower case, what is left; None at the end."""
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return None
            buf += d
        head, rest = buf.split(b"\r\n\r\n", 1)
        low = head.lower()
        n = 0
        for line in low.split(b"\r\n")[1:]:
            if line.startswith(b"content-length:"):
                n = int(line.split(b":", 1)[1])
        while len(rest) < n:
            d = c.recv(65536)
            if not d:
                return None
            rest += d
        return head + b"\r\n\r\n" + rest[:n], low, rest[n:]

    def _serve(self, c):
        import threading
        u = socket.create_connection(self.target)
        buf = b""
        first = True
        while True:
            r = self._read_request(c, buf)
            if r is None:
                break
            req, low, buf = r
            self.requests += 1
            if first and b"upgrade: websocket" in low:
                self.upgrades += 1
                u.sendall(req + buf)
                threading.Thread(target=self._pump, args=(u, c), daemon=True).start()
                self._pump(c, u)
                return
            if first:
                threading.Thread(target=self._pump, args=(u, c), daemon=True).start()
            first = False
            if low.startswith(b"post /v3/lease/keepalive ") and self.fail:
                # no answer from etcd is pending: curl waits for each one
                self.failed += 1
                c.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                          b"application/json\r\nContent-Length: %d\r\n\r\n"
                          % len(self.ANSWER) + self.ANSWER)
                continue
            if low.startswith(b"post /v3/lease/keepalive "):
                self.passed += 1
            path = low.split(b" ", 2)[1] if low.startswith(b"post ") else b""
            if path in self.answers:
                self.canned += 1
                body = self.answers[path]
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
                continue
            u.sendall(req)
        for x in (c, u):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_keepalive_answered_error_keeps_watches(etcd, uniq, monkeypatch):
    """etcd answering keepalives with an error (503: its apply loop is
    behind, as when it is short of CPU) makes the agent retry until it is
    renewed, but not make its watches again: the connection works, and
    every follower re-creating its watches would only add to an overloaded
    etcd's work. The watch still sees a departure afterwards. (The proxy
    reads HTTP/1.1: the agent speaks to etcd's JSON gateway.)"""
    monkeypatch.setenv("KVL_ETCD_API", "gateway")
    px = _AnswerProxy(etcd)
    a = kvlane.Agent(uniq + "-ka", backends=("tcp",))
    b = kvlane.Agent(uniq + "-kb", backends=("tcp",))
    try:
        pfx = f"/kvltest/{uniq}-ka"
        a.etcd_attach(px.url, prefix=pfx, lease_ttl_s=3)     # a keepalive every second
        b.etcd_attach(etcd, prefix=pfx, lease_ttl_s=10)
        b.etcd_publish()
        a.etcd_fetch(uniq + "-kb", wait_ms=30000)
        assert _until(lambda: px.upgrades >= 1)              # a's watch connection
        watches = px.upgrades
        px.fail = True
        assert _until(lambda: px.failed >= 2)                # failed, and retried
        passed = px.passed
        px.fail = False
        assert _until(lambda: px.passed > passed)            # renewed again
        b.close()
        assert _until(lambda: not a.check_remote(uniq + "-kb"))
        assert px.upgrades == watches
    finally:
        b.close()
        a.close()
        px.close()


def test_malformed_answers_refused(etcd, uniq, monkeypatch):
    """Answers that are JSON but not what etcd's gateway writes (a proxy
    rewriting them, another program on the port): json-c aborts the process
    when an array call meets a null or an object, so {"kvs":null} once ended
    the engine. Now each is refused or read as "no key", with the reason,
    and the agent works on once etcd answers again. (Over gRPC the same
    answers are protobuf: test_etcd_pb refuses malformed ones.)"""
    monkeypatch.setenv("KVL_ETCD_API", "gateway")
    px = _AnswerProxy(etcd)
    a = kvlane.Agent(uniq + "-ma", backends=("tcp",))
    b = kvlane.Agent(uniq + "-mb", backends=("tcp",))
    try:
        pfx = f"/kvltest/{uniq}-ma"
        a.etcd_attach(px.url, prefix=pfx, lease_ttl_s=10)
        b.etcd_attach(etcd, prefix=pfx, lease_ttl_s=10)
        b.etcd_publish()
        for body in (b'{"kvs":null}', b'{"kvs":{}}', b'{"kvs":"x"}', b'{"kvs":[null]}',
                     b'{"kvs":[{"key":"eA==","value":null}]}', b'{"header":[]}'):
            px.answers = {b"/v3/kv/range": body}
            with pytest.raises(kvlane.Error) as ei:
                a.etcd_fetch(uniq + "-mb", wait_ms=300)
            msg = str(ei.value)
            assert "has no metadata of agent" in msg or "not a string" in msg, (body, msg)
        px.answers = {b"/v3/kv/range": b'{"kvs":[{"key":"eA==","value":"!!!!"}]}'}
        with pytest.raises(kvlane.Error) as ei:
            a.etcd_fetch(uniq + "-mb", wait_ms=30000)              # refused at once
        assert "value is not base64" in str(ei.value)
        assert "another program may write under that prefix" in str(ei.value)
        assert px.canned >= 7
        px.answers = {}
        a.etcd_fetch(uniq + "-mb", wait_ms=30000)
        assert a.check_remote(uniq + "-mb")
    finally:
        b.close()
        a.close()
        px.close()


def test_gateway_without_websockets(etcd, uniq, monkeypatch):
    """Behind a proxy that refuses WebSocket upgrades, the watcher falls back
    to one plain HTTP stream per followed agent: restarts and departures
    are still seen."""
    monkeypatch.setenv("KVL_ETCD_API", "gateway")
    px = _NoUpgradeProxy(etcd)
    a = kvlane.Agent(uniq + "-pa", backends=("tcp",))
    b = kvlane.Agent(uniq + "-pb", backends=("tcp",))
    try:
        pfx = f"/kvltest/{uniq}-px"
        a.etcd_attach(px.url, prefix=pfx, lease_ttl_s=10)
        b.etcd_attach(px.url, prefix=pfx, lease_ttl_s=10)
        b.etcd_publish()
        a.etcd_fetch(uniq + "-pb", wait_ms=30000)
        assert a.check_remote(uniq + "-pb")
        assert _until(lambda: px.watch_posts >= 1)
        assert px.upgrades >= 1
        b.close()
        assert _until(lambda: not a.check_remote(uniq + "-pb"))
    finally:
        b.close()
        a.close()
        px.close()


class _Http1Proxy(_AnswerProxy):
    """An HTTP/1.1 proxy in front of etcd, as most are: it answers the
    HTTP/2 preface of a gRPC client with 400 and closes; HTTP/1.1 requests
    and WebSocket upgrades go to etcd's gateway."""

    def __init__(self, target):
        self.refused_h2 = 0
        super().__init__(target)

    def _serve(self, c):
        head = c.recv(24, socket.MSG_PEEK | socket.MSG_WAITALL)
        if head.startswith(b"PRI * HTTP/2.0"):
            self.refused_h2 += 1
            c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                      b"Connection: close\r\n\r\n")
            c.close()
            return
        super()._serve(c)


def test_grpc_falls_back_to_gateway(etcd, uniq, monkeypatch):
    """By default kvlane speaks gRPC to etcd and keeps to the JSON gateway
    where what answers is not HTTP/2 (a proxy): the agent behind such a
    proxy attaches, publishes, fetches and sees a departure through the
    gateway; one beside it, straight to etcd, speaks gRPC. KVL_ETCD_API
    is checked."""
    monkeypatch.delenv("KVL_ETCD_API", raising=False)
    px = _Http1Proxy(etcd)
    a = kvlane.Agent(uniq + "-ga", backends=("tcp",))
    b = kvlane.Agent(uniq + "-gb", backends=("tcp",))
    try:
        pfx = f"/kvltest/{uniq}-gw"
        a.etcd_attach(px.url, prefix=pfx, lease_ttl_s=10)
        assert px.refused_h2 == 1                         # tried once, then the gateway
        b.etcd_attach(etcd, prefix=pfx, lease_ttl_s=10)
        b.etcd_publish()
        a.etcd_publish()
        assert px.requests >= 3                           # grant, check, publish
        a.etcd_fetch(uniq + "-gb", wait_ms=30000)
        b.etcd_fetch(uniq + "-ga", wait_ms=30000)
        assert _until(lambda: px.upgrades >= 1)          # a's watches: the WebSocket
        b.close()
        assert _until(lambda: not a.check_remote(uniq + "-gb"))
        # kvlane doctor says which way it went, and warns about the proxy
        cli = os.path.join(os.environ.get("KVL_BUILD", os.path.join(
            os.path.dirname(__file__), "..", "..", "build")), "kvlane")
        out = subprocess.run([cli, "doctor", "--etcd", px.url], capture_output=True, text=True,
                             timeout=120).stdout
        assert "0.api" in out and "the JSON gateway: no gRPC there" in out, out
        assert "pass HTTP/2 (h2c)" in out, out
        out = subprocess.run([cli, "doctor", "--etcd", etcd], capture_output=True, text=True,
                             timeout=120).stdout
        assert "gRPC over HTTP/2" in out, out
        monkeypatch.setenv("KVL_ETCD_API", "grpc")       # gRPC only: the proxy is not etcd
        c = kvlane.Agent(uniq + "-gc", backends=("tcp",))
        try:
            with pytest.raises(kvlane.Error) as ei:
                c.etcd_attach(px.url, prefix=pfx, lease_ttl_s=10)
            assert "not HTTP/2" in str(ei.value) or "400" in str(ei.value), str(ei.value)
            monkeypatch.setenv("KVL_ETCD_API", "h2")
            with pytest.raises(kvlane.Error) as ei:
                c.etcd_attach(etcd, prefix=pfx, lease_ttl_s=10)
            assert "KVL_ETCD_API='h2' is not one of auto, grpc, gateway" in str(ei.value)
        finally:
            c.close()
    finally:
        b.close()
        a.close()
        px.close()
