/*
 * kvlane etcd client: TLS to etcd (kvl_etcd_tls_t). The files are read and
 * checked here at attach, before any connection (missing, unreadable, not
 * PEM, a key that is not the certificate's); every curl handle that talks
 * to etcd gets them through kvli_etcd_curl_setup; and curl's TLS failures
 * are turned into what went wrong and what to do (kvli_etcd_tls_explain).
 */
#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "etcd_client.h"

/* Open path for reading: NULL with err naming the file and why. */
static FILE *kvli_tls_open(const char *kind, const char *path, kvl_error_t *err)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int e = errno;
        kvli_err(err, KVL_ERR_INVALID_ARG, e, "etcd TLS: the %s file '%s' cannot be read: %s",
                 kind, path, strerror(e));
        kvli_hint(err, "give the path of a readable PEM file (KVL_ETCD_CACERT, KVL_ETCD_CERT, "
                       "KVL_ETCD_KEY or kvl_etcd_tls_t); this process runs as uid %u",
                  (unsigned)getuid());
    }
    return f;
}

static kvl_status_t kvli_tls_not_pem(const char *kind, const char *path, const char *what,
                                     kvl_error_t *err)
{
    ERR_clear_error();
    kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd TLS: the %s file '%s' holds no PEM %s", kind,
             path, what);
    kvli_hint(err, "give a PEM file (-----BEGIN CERTIFICATE----- or -----BEGIN PRIVATE "
                   "KEY-----); convert DER with openssl x509 -inform der or openssl pkey "
                   "-inform der; an encrypted key must be decrypted first (openssl pkey -in "
                   "KEY -out KEY.plain)");
    return KVL_ERR_INVALID_ARG;
}

/* Never ask for a passphrase: an encrypted key is refused, not prompted for. */
static int kvli_tls_no_pass(char *buf, int size, int rw, void *u)
{
    (void)buf;
    (void)size;
    (void)rw;
    (void)u;
    return 0;
}

static kvl_status_t kvli_tls_check(kvli_etcd_client_t *c, kvl_error_t *err)
{
    if (c->cacert[0] != '\0') {
        FILE *f = kvli_tls_open("CA", c->cacert, err);
        if (f == NULL)
            return KVL_ERR_INVALID_ARG;
        X509 *x = PEM_read_X509(f, NULL, kvli_tls_no_pass, NULL);
        fclose(f);
        if (x == NULL)
            return kvli_tls_not_pem("CA", c->cacert, "certificate", err);
        X509_free(x);
    }
    if (c->cert[0] == '\0')
        return KVL_OK;
    FILE *f = kvli_tls_open("client certificate", c->cert, err);
    if (f == NULL)
        return KVL_ERR_INVALID_ARG;
    X509 *x = PEM_read_X509(f, NULL, kvli_tls_no_pass, NULL);
    fclose(f);
    if (x == NULL)
        return kvli_tls_not_pem("client certificate", c->cert, "certificate", err);
    X509_NAME_oneline(X509_get_subject_name(x), c->subject, (int)sizeof(c->subject));
    const char *kp = c->key[0] ? c->key : c->cert;
    const char *kind = c->key[0] ? "client key" : "client certificate (no key file: its key)";
    if ((f = kvli_tls_open(kind, kp, err)) == NULL) {
        X509_free(x);
        return KVL_ERR_INVALID_ARG;
    }
    EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, kvli_tls_no_pass, NULL);
    fclose(f);
    if (k == NULL) {
        X509_free(x);
        return kvli_tls_not_pem(kind, kp, "private key", err);
    }
    int match = X509_check_private_key(x, k);
    EVP_PKEY_free(k);
    X509_free(x);
    ERR_clear_error();
    if (match != 1) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd TLS: the client key '%s' is not the key of "
                 "the certificate '%s'", kp, c->cert);
        kvli_hint(err, "give the key made with that certificate (openssl x509 -noout -pubkey "
                       "-in CERT and openssl pkey -pubout -in KEY print the same key)");
        return KVL_ERR_INVALID_ARG;
    }
    return KVL_OK;
}

kvl_status_t kvli_etcd_tls_init(kvli_etcd_client_t *c, const kvl_etcd_tls_t *tls,
                                kvl_error_t *err)
{
    c->verify_name = true;
    if (tls == NULL)
        return KVL_OK;
    const char *files[3] = {
        (tls->field_mask & KVL_ETCD_TLS_CA_FILE) ? tls->ca_file : NULL,
        (tls->field_mask & KVL_ETCD_TLS_CERT_FILE) ? tls->cert_file : NULL,
        (tls->field_mask & KVL_ETCD_TLS_KEY_FILE) ? tls->key_file : NULL};
    char *dst[3] = {c->cacert, c->cert, c->key};
    for (int i = 0; i < 3; i++) {
        if (files[i] == NULL || files[i][0] == '\0')
            continue;
        if (strlen(files[i]) >= sizeof(c->cert)) {
            kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd TLS: the file name '%.100s...' is "
                     "longer than %zu bytes", files[i], sizeof(c->cert) - 1);
            kvli_hint(err, "give a shorter path (a symbolic link to the file)");
            return KVL_ERR_INVALID_ARG;
        }
        kvli_scopy(dst[i], sizeof(c->cert), files[i]);
        c->tls = true;
    }
    if (tls->field_mask & KVL_ETCD_TLS_VERIFY_NAME)
        c->verify_name = tls->verify_name != 0;
    if (c->key[0] != '\0' && c->cert[0] == '\0') {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "etcd TLS: a client key file ('%s') without a "
                 "client certificate file", c->key);
        kvli_hint(err, "give the certificate too (KVL_ETCD_CERT, kvl_etcd_tls_t.cert_file)");
        return KVL_ERR_INVALID_ARG;
    }
    return kvli_tls_check(c, err);
}

void kvli_etcd_tls_setup(const kvli_etcd_client_t *c, CURL *h)
{
    if (c == NULL)
        return;
    if (c->cacert[0] != '\0')
        curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
    if (c->cert[0] != '\0') {
        curl_easy_setopt(h, CURLOPT_SSLCERT, c->cert);
        curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
        curl_easy_setopt(h, CURLOPT_SSLKEY, c->key[0] ? c->key : c->cert);
        curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
    }
    /* HTTP/1.1, as over plain http: under HTTP/2 a refused client
     * certificate reads as a framing error, not as the server's alert. */
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    /* No TLS session resumption: a session resumed skips the certificate
     * checks, so a refusal (wrong CA, no client certificate) would read as
     * another one. The connections themselves are kept and reused. */
    curl_easy_setopt(h, CURLOPT_SSL_SESSIONID_CACHE, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, c->verify_name ? 2L : 0L);
}

/* Does ep's host:port complete a TLS handshake? (Not verified: only to
 * tell a TLS listener from a plain one, on an error path.) */
static bool kvli_etcd_tls_sniff(const char *ep, uint64_t timeout_ms)
{
    char url[KVLI_ETCD_EP_LEN + 16];
    CURL *h = curl_easy_init();
    if (h == NULL)
        return false;
    snprintf(url, sizeof(url), "https://%s/", strstr(ep, "://") + 3);
    kvli_etcd_curl_setup(NULL, h, timeout_ms);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    return cc == CURLE_OK;
}

static bool kvli_has(const char *s, const char *needle)
{
    return s != NULL && strstr(s, needle) != NULL;
}

const char *kvli_etcd_tls_explain(const kvli_etcd_client_t *c, CURL *h, const char *ep, int cc,
                                  const char *detail, char *why, size_t cap)
{
    bool https = strncmp(ep, "https://", 8) == 0;
    /* A connection closed right after a handshake made by this request
     * (not a kept one that died: an etcd going away) is a refusal. */
    curl_off_t hs_us = 0;
    bool refused_after_hs = (cc == CURLE_SEND_ERROR || cc == CURLE_RECV_ERROR ||
                             cc == CURLE_GOT_NOTHING) &&
                            (h == NULL ||
                             (curl_easy_getinfo(h, CURLINFO_APPCONNECT_TIME_T, &hs_us) ==
                                  CURLE_OK && hs_us > 0));
    char ca[KVLI_ETCD_PATH_MAX + 16];
    if (c->cacert[0] != '\0')
        snprintf(ca, sizeof(ca), "the CA file '%s'", c->cacert);
    else
        snprintf(ca, sizeof(ca), "the system's CA store");
    if (!https) {
        /* Plain http to a TLS listener: etcd closes the connection without
         * a word (or resets it: our request unread); Go's plain server
         * answers this text. A TLS handshake
         * there, not verified, only to tell, confirms it. */
        if ((cc == CURLE_OK && kvli_has(detail, "HTTP request to an HTTPS server")) ||
            ((cc == CURLE_GOT_NOTHING || cc == CURLE_RECV_ERROR) &&
             kvli_etcd_tls_sniff(ep, c->timeout_ms))) {
            snprintf(why, cap, "etcd at %s serves https, but the endpoint says http://", ep);
            return "write the endpoint as https://host:port and give etcd's CA "
                   "(KVL_ETCD_CACERT, kvl_etcd_tls_t.ca_file), and a client certificate if "
                   "etcd has --client-cert-auth (KVL_ETCD_CERT, KVL_ETCD_KEY)";
        }
        return NULL;
    }
    if (cc == CURLE_OK)
        return NULL;
    if (kvli_has(detail, "certificate required") && c->cert[0] == '\0') {
        snprintf(why, cap, "etcd at %s: TLS: etcd requires a client certificate and none was "
                 "given (%.200s)", ep, detail);
        return "give a client certificate signed by a CA in etcd's --trusted-ca-file, and its "
               "key (KVL_ETCD_CERT and KVL_ETCD_KEY, kvl_etcd_tls_t)";
    }
    if (kvli_has(detail, "alert bad certificate") || kvli_has(detail, "alert unknown ca") ||
        kvli_has(detail, "alert certificate unknown") ||
        kvli_has(detail, "alert certificate required") ||
        kvli_has(detail, "alert certificate expired") ||
        kvli_has(detail, "alert unsupported certificate") ||
        kvli_has(detail, "alert handshake failure")) {
        if (c->cert[0] == '\0') {
            snprintf(why, cap, "etcd at %s: TLS: etcd refused the handshake, no client "
                     "certificate was given (%.200s)", ep, detail);
            return "etcd may require a client certificate (--client-cert-auth): give one "
                   "signed by a CA in its --trusted-ca-file, and its key (KVL_ETCD_CERT and "
                   "KVL_ETCD_KEY, kvl_etcd_tls_t)";
        }
        snprintf(why, cap, "etcd at %s: TLS: etcd refused the client certificate '%s' (%.200s)",
                 ep, c->cert, detail);
        return "the certificate must be signed by a CA in etcd's --trusted-ca-file, be valid "
               "now (openssl x509 -noout -dates -in CERT) and allow client authentication "
               "(extendedKeyUsage clientAuth)";
    }
    if (cc == CURLE_PEER_FAILED_VERIFICATION &&
        (kvli_has(detail, "subject name") || kvli_has(detail, "host name") ||
         kvli_has(detail, "hostname"))) {
        snprintf(why, cap, "etcd at %s: TLS: its server certificate does not name that host "
                 "(%.200s)", ep, detail);
        return "connect by a name or IP address the certificate lists (openssl x509 -noout "
               "-ext subjectAltName -in <etcd's --cert-file>), re-issue it with this one, or "
               "turn the name check off (KVL_ETCD_TLS_VERIFY_NAME=0, "
               "kvl_etcd_tls_t.verify_name)";
    }
    if (cc == CURLE_PEER_FAILED_VERIFICATION) {
        snprintf(why, cap, "etcd at %s: TLS: its server certificate is not trusted by %s "
                 "(%.200s)", ep, ca, detail);
        return "give the CA that signed etcd's --cert-file (KVL_ETCD_CACERT, "
               "kvl_etcd_tls_t.ca_file); openssl s_client -connect HOST:PORT -showcerts shows "
               "who signed it";
    }
    if (c->cert[0] == '\0' && refused_after_hs) {
        /* TLS 1.3: the server checks the client's certificate after the
         * handshake; without one etcd (--client-cert-auth) drops the
         * connection, and curl sees the send or the read fail. */
        snprintf(why, cap, "etcd at %s: TLS: etcd closed the connection after the handshake, "
                 "and no client certificate was given (%.200s)", ep, detail);
        return "etcd requires a client certificate (--client-cert-auth): give one signed by a "
               "CA in its --trusted-ca-file, and its key (KVL_ETCD_CERT and KVL_ETCD_KEY, "
               "kvl_etcd_tls_t)";
    }
    if (refused_after_hs) {
        snprintf(why, cap, "etcd at %s: TLS: etcd closed the connection after the handshake: "
                 "it may have refused the client certificate '%s' (%.200s)", ep, c->cert,
                 detail);
        return "the certificate must be signed by a CA in etcd's --trusted-ca-file, be valid "
               "now (openssl x509 -noout -dates -in CERT) and allow client authentication "
               "(extendedKeyUsage clientAuth); etcd's log names the reason";
    }
    if (kvli_has(detail, "wrong version number") || kvli_has(detail, "packet length too long") ||
        kvli_has(detail, "record layer failure")) {
        snprintf(why, cap, "etcd at %s: TLS: the server there does not speak TLS (%.200s)", ep,
                 detail);
        return "etcd there serves plain http: write the endpoint as http:// and give no TLS "
               "files, or start etcd with --cert-file/--key-file and https:// client URLs";
    }
    if (cc == CURLE_SSL_CONNECT_ERROR || cc == CURLE_SSL_CERTPROBLEM ||
        cc == CURLE_SSL_CACERT_BADFILE || cc == CURLE_SSL_CIPHER ||
        cc == CURLE_SSL_ENGINE_INITFAILED || cc == CURLE_SSL_ISSUER_ERROR) {
        snprintf(why, cap, "etcd at %s: TLS handshake failed (%.200s)", ep, detail);
        return "see etcd's log on that member; openssl s_client -connect HOST:PORT -CAfile CA "
               "-cert CERT -key KEY shows the handshake";
    }
    return NULL;
}
