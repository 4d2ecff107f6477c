/*
 * The etcd metadata store over TLS with client certificates, against a real
 * etcd (--cert-file, --key-file, --trusted-ca-file, --client-cert-auth) and
 * throwaway certificates made with the openssl CLI: attach, publish, fetch,
 * and a departure seen by the watcher, over TLS (host:port means https);
 * refusals, each naming the endpoint or file and the fix: files missing,
 * a server certificate that does not name the host (and the check off),
 * not PEM, a key that is not the certificate's (all before any network), an
 * http:// endpoint with certificates, no client certificate, the wrong CA,
 * a client certificate etcd does not trust, https to a plain-http server
 * and http to etcd's https listener; kvlane doctor's TLS checks.
 * KVL_TEST_LABELS: etcd
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "common/kt_etcd.h"

static kt_etcd_t etcd;
static char dir[160], hostport[64], ca[200], cert[200], key[200];

static kvl_agent_t *agent(const char *name)
{
    kvl_agent_t *a;
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS | KVL_AGENT_CFG_TIMEOUT,
                              .create_backends = "", .timeout_ms = 3000};
    KT_OK(kvl_agent_create(name, &cfg, &a));
    kvl_param_t p = {"host", "127.0.0.1"};
    KT_OK(kvl_backend_create(a, "tcp", &p, 1, NULL));
    return a;
}

/* Attach with the given files (NULL: not given). */
static kvl_status_t attach(kvl_agent_t *a, const char *eps, const char *cafile,
                           const char *certfile, const char *keyfile)
{
    kvl_etcd_config_t c = {.endpoints = eps, .prefix = "/kt/tls", .lease_ttl_s = 30};
    kvl_etcd_tls_t t = {.field_mask = KVL_ETCD_TLS_CA_FILE | KVL_ETCD_TLS_CERT_FILE |
                                      KVL_ETCD_TLS_KEY_FILE,
                        .ca_file = cafile, .cert_file = certfile, .key_file = keyfile};
    return kvl_etcd_attach_tls(a, &c, &t);
}

static void path(char *buf, const char *name)
{
    snprintf(buf, 200, "%s/%s", dir, name);
}

/* Refused before any connection: the endpoint is a port nothing listens on,
 * so a connection tried would have failed as KVL_ERR_REMOTE_DISCONNECT, not
 * with the file's KVL_ERR_INVALID_ARG (no timing is asserted). */
static void files(void)
{
    char dead[64], missing[200], other_key[200], eps[200];
    snprintf(dead, sizeof(dead), "127.0.0.1:%u", kt_free_port());
    path(missing, "nonexistent.key");
    path(other_key, "stranger.key");
    kvl_agent_t *a = agent("files");
    KT_STATUS(attach(a, dead, ca, cert, missing), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("etcd TLS: the client key file '");
    KT_ERROR_HAS("nonexistent.key' cannot be read: No such file or directory");
    KT_STATUS(attach(a, dead, missing, cert, key), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("etcd TLS: the CA file '");
    KT_STATUS(attach(a, dead, ca, key, key), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("holds no PEM certificate");
    KT_STATUS(attach(a, dead, ca, cert, ca), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("holds no PEM private key");
    KT_STATUS(attach(a, dead, ca, cert, other_key), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("stranger.key' is not the key of the certificate '");
    KT_STATUS(attach(a, dead, ca, NULL, key), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("without a client certificate file");
    snprintf(eps, sizeof(eps), "http://%s", dead);
    KT_STATUS(attach(a, eps, ca, cert, key), KVL_ERR_INVALID_ARG);
    KT_ERROR_HAS("is plain http, but TLS files were given");
    kvl_agent_destroy(a);
    printf("files: missing, not PEM, mismatched key, key alone, http:// with certificates: "
           "refused before any connection, naming the file\n");
}

/* Poll (bounded) until kvl_remote_check(a, name) == want. */
static int wait_check(kvl_agent_t *a, const char *name, kvl_status_t want, int seconds)
{
    for (int i = 0; i < seconds * 20; i++) {
        if (kvl_remote_check(a, name) == want)
            return 1;
        usleep(50000);
    }
    return 0;
}

static void works(void)
{
    kvl_agent_t *a = agent("tls-a"), *b = agent("tls-b");
    uint8_t buf[4096];
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)buf, sizeof(buf), KVL_DEV_ANY};
    KT_OK(kvl_mem_register(b, &d, 1, NULL, NULL));
    KT_OK(attach(a, hostport, ca, cert, key)); /* host:port: https */
    KT_OK(attach(b, etcd.url, ca, cert, key)); /* https:// */
    KT_OK(kvl_etcd_publish(b, NULL));
    KT_OK(kvl_etcd_fetch(a, "tls-b", NULL, 30000));
    size_t n = 0;
    kvl_mem_desc_t r[2];
    KT_OK(kvl_remote_regions(a, "tls-b", r, NULL, 2, &n));
    KT_CHECK(n == 1 && r[0].addr == d.addr);
    kvl_agent_destroy(b); /* revokes its lease: the watch (TLS too) sees it go */
    KT_CHECK(wait_check(a, "tls-b", KVL_ERR_NOT_FOUND, 60));
    kvl_agent_destroy(a);
    printf("TLS with a client certificate: attach, publish, fetch, departure seen\n");
}

static void refused(void)
{
    char other_ca[200], stranger[200], stranger_key[200], eps[200];
    path(other_ca, "otherca.crt");
    path(stranger, "stranger.crt");
    path(stranger_key, "stranger.key");
    kvl_agent_t *a = agent("refused");

    KT_STATUS(attach(a, etcd.url, ca, NULL, NULL), KVL_ERR_PERMISSION);
    KT_ERROR_HAS(etcd.url);
    KT_ERROR_HAS("no client certificate was given");
    KT_ERROR_HAS("KVL_ETCD_CERT");
    printf("no client certificate: refused: %s\n", kvl_last_error()->what);

    KT_STATUS(attach(a, etcd.url, other_ca, cert, key), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("its server certificate is not trusted by the CA file '");
    KT_ERROR_HAS("otherca.crt'");
    printf("wrong CA: refused: %s\n", kvl_last_error()->what);

    KT_STATUS(attach(a, etcd.url, ca, stranger, stranger_key), KVL_ERR_PERMISSION);
    /* etcd's alert, or (when the request was being sent as it came) the
     * connection closed after the handshake: either text names the file */
    KT_ERROR_HAS("refused the client certificate '");
    KT_ERROR_HAS("stranger.crt'");
    KT_ERROR_HAS("--trusted-ca-file");
    printf("untrusted client certificate: refused: %s\n", kvl_last_error()->what);

    /* the server's certificate lists IP 127.0.0.1 only: "localhost" is not it */
    snprintf(eps, sizeof(eps), "https://localhost:%u", etcd.client_port);
    KT_STATUS(attach(a, eps, ca, cert, key), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("its server certificate does not name that host");
    KT_ERROR_HAS("KVL_ETCD_TLS_VERIFY_NAME=0");
    printf("host not in the server certificate: refused: %s\n", kvl_last_error()->what);
    kvl_etcd_config_t c = {.endpoints = eps, .prefix = "/kt/tls", .lease_ttl_s = 30};
    kvl_etcd_tls_t t = {.field_mask = KVL_ETCD_TLS_CA_FILE | KVL_ETCD_TLS_CERT_FILE |
                                      KVL_ETCD_TLS_KEY_FILE | KVL_ETCD_TLS_VERIFY_NAME,
                        .ca_file = ca, .cert_file = cert, .key_file = key, .verify_name = 0};
    kvl_agent_t *n = agent("noname");
    KT_OK(kvl_etcd_attach_tls(n, &c, &t)); /* the name check off: the CA still checked */
    kvl_agent_destroy(n);

    /* https to a plain-http server: etcd's peer port is one */
    snprintf(eps, sizeof(eps), "https://127.0.0.1:%u", etcd.peer_port);
    KT_STATUS(attach(a, eps, ca, cert, key), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("the server there does not speak TLS");
    printf("https to plain http: refused: %s\n", kvl_last_error()->what);

    /* plain http (no files) to etcd's https listener */
    snprintf(eps, sizeof(eps), "http://%s", hostport);
    KT_STATUS(attach(a, eps, NULL, NULL, NULL), KVL_ERR_PERMISSION);
    KT_ERROR_HAS("serves https, but the endpoint says http://");
    printf("http to https: refused: %s\n", kvl_last_error()->what);
    kvl_agent_destroy(a);
}

static char probe_out[16384];

static void probe_cb(void *arg, const char *check, int status, const char *obs,
                     const char *hint)
{
    (void)arg;
    size_t l = strlen(probe_out);
    snprintf(probe_out + l, sizeof(probe_out) - l, "%d %s: %s%s%s\n", status, check, obs,
             hint ? " -- " : "", hint ? hint : "");
}

static void doctor(void)
{
    kvl_etcd_config_t c = {.endpoints = hostport, .prefix = "/kt/tls"};
    kvl_etcd_tls_t t = {.field_mask = KVL_ETCD_TLS_CA_FILE | KVL_ETCD_TLS_CERT_FILE |
                                      KVL_ETCD_TLS_KEY_FILE,
                        .ca_file = ca, .cert_file = cert, .key_file = key};
    probe_out[0] = '\0';
    KT_OK(kvl_etcd_probe_tls(&c, &t, probe_cb, NULL));
    printf("%s", probe_out);
    KT_CHECK(strstr(probe_out, "0 tls: servers verified by CA file ") != NULL);
    KT_CHECK(strstr(probe_out, "CN=kvl-client") != NULL);
    KT_CHECK(strstr(probe_out, "0 0.tls: https://127.0.0.1:") != NULL);
    KT_CHECK(strstr(probe_out, "TLSv1.") != NULL);
    KT_CHECK(strstr(probe_out, "0 0.auth: ") != NULL);
    t.field_mask = KVL_ETCD_TLS_CA_FILE;
    probe_out[0] = '\0';
    KT_STATUS(kvl_etcd_probe_tls(&c, &t, probe_cb, NULL), KVL_ERR_REMOTE_DISCONNECT);
    printf("%s", probe_out);
    KT_CHECK(strstr(probe_out, "2 0.tls: ") != NULL &&
             strstr(probe_out, "no client certificate was given") != NULL);
    printf("doctor: TLS version, the CA and the client certificate reported; no client "
           "certificate is a failure\n");
}

int main(void)
{
    if (kvl_etcd_attach(NULL, NULL) == KVL_ERR_UNSUPPORTED) /* built without the store */
        KT_SKIP("%s", kvl_last_error()->what);
    if (kt_etcd_binary() == NULL)
        KT_SKIP("no etcd binary (/usr/bin/etcd from Debian's etcd-server, or KVL_ETCD_BIN)");
    if (system("command -v openssl >/dev/null 2>&1") != 0)
        KT_SKIP("no openssl CLI (Debian's openssl) to make the test certificates");
    if (system("command -v etcdctl >/dev/null 2>&1") != 0)
        KT_SKIP("no etcdctl (Debian's etcd-client) to ask a TLS etcd's health");
    signal(SIGPIPE, SIG_IGN);
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof(dir), "%s/kvl-etcd-tls-XXXXXX", base);
    KT_CHECK(mkdtemp(dir) != NULL);
    if (kt_tls_certs(dir) != 0) {
        fprintf(stderr, "making the certificates failed: see %s/kt_tls_certs.log\n", dir);
        KT_CHECK(!"certificates made");
    }
    path(ca, "ca.crt");
    path(cert, "client.crt");
    path(key, "client.key");
    etcd.tls_dir = dir;
    kt_etcd_start(&etcd);
    snprintf(hostport, sizeof(hostport), "127.0.0.1:%u", etcd.client_port);
    files();
    works();
    refused();
    doctor();
    kt_etcd_stop(&etcd);
    KT_CHECK(kt_sh("rm -rf '%s'", dir) == 0);
    printf("etcd TLS: all cases passed\n");
    return 0;
}
