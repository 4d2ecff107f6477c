"""kvlane.nixl and Agent.etcd_attach against a real etcd over TLS with client
certificates (--client-cert-auth; throwaway certificates from the openssl CLI,
tests/common/kt_tls_certs.sh): the NIXL drop-in path with KVL_ETCD_CACERT /
KVL_ETCD_CERT / KVL_ETCD_KEY (and etcdctl's ETCDCTL_* names) publishes,
fetches and sees a departure; no client certificate, the wrong CA and a
missing key file are refused with their diagnoses."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

import kvlane
from kvlane.nixl import nixl_agent, nixl_agent_config

ETCD = os.environ.get("KVL_ETCD_BIN", "/usr/bin/etcd")
SRC = os.environ.get("KVL_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
CERTS_SH = os.path.join(SRC, "tests", "common", "kt_tls_certs.sh")


def _built_without_etcd():
    a = kvlane.Agent("etcd-tls-built-probe", backends="")
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
    pytest.mark.skipif(shutil.which("openssl") is None,
                       reason="no openssl CLI (Debian's openssl) to make test certificates"),
    pytest.mark.skipif(_built_without_etcd(), reason="kvlane was built without the etcd store"),
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(cond, seconds=30):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture(scope="module")
def tls_etcd():
    """(https URL, certificate dir) of an etcd requiring client certificates."""
    d = tempfile.mkdtemp(prefix="kvl-etcd-tls-py-")
    subprocess.run(["bash", CERTS_SH, d], check=True)
    cp, pp = _free_port(), _free_port()
    url, purl = f"https://127.0.0.1:{cp}", f"http://127.0.0.1:{pp}"
    log = open(os.path.join(d, "etcd.log"), "w")
    f = lambda n: os.path.join(d, n)
    proc = subprocess.Popen([ETCD, "--name", "kt", "--data-dir", f("data"),
                             "--listen-client-urls", url, "--advertise-client-urls", url,
                             "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                             "--initial-cluster", f"kt={purl}", "--log-level", "warn",
                             "--cert-file", f("server.crt"), "--key-file", f("server.key"),
                             "--trusted-ca-file", f("ca.crt"), "--client-cert-auth"],
                            stdout=log, stderr=log)
    try:
        # Ready when an attach with the right files works (bounded: 30 s).
        end = time.time() + 30
        while True:
            a = kvlane.Agent("etcd-tls-ready", backends="")
            try:
                a.etcd_attach(url, timeout_ms=1000, cacert=f("ca.crt"), cert=f("client.crt"),
                              key=f("client.key"))
                break
            except kvlane.Error:
                assert proc.poll() is None, "etcd exited at start"
                if time.time() > end:
                    pytest.fail("etcd over TLS did not answer in 30 s")
                time.sleep(0.2)
            finally:
                a.close()
        yield url, d
    finally:
        proc.kill()
        proc.wait()
        log.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tls_env(tls_etcd, uniq, monkeypatch):
    url, d = tls_etcd
    for v in ("KVL_ETCD_CACERT", "KVL_ETCD_CERT", "KVL_ETCD_KEY", "ETCDCTL_CACERT",
              "ETCDCTL_CERT", "ETCDCTL_KEY", "KVL_ETCD_TLS_VERIFY_NAME"):
        monkeypatch.delenv(v, raising=False)
    # host:port with TLS files means https
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", url[len("https://"):])
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", f"/kvltest/{uniq}/")
    monkeypatch.setenv("KVL_ETCD_LEASE_TTL", "30")
    return url, d


def test_nixl_over_tls(tls_env, uniq, monkeypatch):
    _, d = tls_env
    monkeypatch.setenv("KVL_ETCD_CACERT", os.path.join(d, "ca.crt"))
    monkeypatch.setenv("KVL_ETCD_CERT", os.path.join(d, "client.crt"))
    monkeypatch.setenv("KVL_ETCD_KEY", os.path.join(d, "client.key"))
    conf = nixl_agent_config(backends=["UCX"])
    watcher = nixl_agent(uniq + "-w", conf)
    try:
        # etcdctl's names work too
        for n in ("CACERT", "CERT", "KEY"):
            monkeypatch.setenv("ETCDCTL_" + n, os.environ.pop("KVL_ETCD_" + n))
        peer = nixl_agent(uniq + "-p", conf)
        peer.send_local_metadata()
        watcher.fetch_remote_metadata(uniq + "-p")
        assert _until(lambda: watcher.check_remote_metadata(uniq + "-p"))
        peer.close()                       # departure: seen through the TLS watch
        assert _until(lambda: not watcher.check_remote_metadata(uniq + "-p"), 60)
    finally:
        watcher.close()


def test_refusals(tls_env, uniq, monkeypatch):
    url, d = tls_env
    conf = nixl_agent_config(backends=["UCX"])
    monkeypatch.setenv("KVL_ETCD_CACERT", os.path.join(d, "ca.crt"))
    with pytest.raises(kvlane.PermissionDenied,
                       match=r"no client certificate was given[\s\S]*KVL_ETCD_CERT"):
        nixl_agent(uniq + "-nocert", conf)
    monkeypatch.setenv("KVL_ETCD_CACERT", os.path.join(d, "otherca.crt"))
    monkeypatch.setenv("KVL_ETCD_CERT", os.path.join(d, "client.crt"))
    monkeypatch.setenv("KVL_ETCD_KEY", os.path.join(d, "client.key"))
    with pytest.raises(kvlane.PermissionDenied,
                       match="its server certificate is not trusted by the CA file"):
        nixl_agent(uniq + "-wrongca", conf)
    monkeypatch.setenv("KVL_ETCD_CACERT", os.path.join(d, "ca.crt"))
    monkeypatch.setenv("KVL_ETCD_KEY", os.path.join(d, "missing.key"))
    with pytest.raises(kvlane.InvalidArgument, match="missing.key' cannot be read"):
        nixl_agent(uniq + "-nokey", conf)
    monkeypatch.setenv("KVL_ETCD_TLS_VERIFY_NAME", "maybe")
    with pytest.raises(kvlane.InvalidArgument, match="is not 0 or 1"):
        nixl_agent(uniq + "-vn", conf)


def test_core_api_keywords(tls_etcd, uniq):
    url, d = tls_etcd
    a = kvlane.Agent(uniq, backends="")
    try:
        with pytest.raises(kvlane.InvalidArgument, match="is plain http, but TLS files"):
            a.etcd_attach("http://" + url[len("https://"):], cacert=os.path.join(d, "ca.crt"))
        a.etcd_attach(url, prefix=f"/kvltest/{uniq}", cacert=os.path.join(d, "ca.crt"),
                      cert=os.path.join(d, "client.crt"), key=os.path.join(d, "client.key"),
                      verify_name=True)
        a.etcd_publish()
    finally:
        a.close()
