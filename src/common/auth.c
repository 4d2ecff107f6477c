/* HMAC-SHA256 challenge-response over a socket, shared by the tcp backend and the listener (see auth.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include "auth.h"
#include "mac.h"
#include "wire.h"
#include "inet.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#define KVLI_AUTH1_MAGIC 0x3141564bu   /* "KVA1" */
#define KVLI_AUTH2_MAGIC 0x3241564bu
#define KVLI_AUTH3_MAGIC 0x3341564bu
#define KVLI_AUTH4_MAGIC 0x3441564bu
#define KVLI_AUTH_VERSION 1u

/* Nonces from the kernel (getrandom: no OpenSSL random generator to set
 * up in every process, which cost each agent's first connection about half
 * a millisecond); OpenSSL's where a seccomp profile refuses the call. */
static int kvli_tcp_auth_random(uint8_t *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(b + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got == n)
        return 0;
    return RAND_bytes(b, (int)n) == 1 ? 0 : -1;
}
static void kvli_tcp_auth_hmac(const uint8_t *key, size_t klen, const uint8_t *msg, size_t mlen,
                               uint8_t *out)
{
    kvli_mac_part_t part = {msg, mlen};
    kvli_mac(key, klen, &part, 1, out);
}
static int kvli_tcp_auth_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    return kvli_mac_equal(a, b, n);
}

static void kvli_tcp_auth_mac(const kvli_tcp_auth_t *a, int server, uint8_t *out)
{
    static const char ls[] = "kvlane-auth-v1 server", lc[] = "kvlane-auth-v1 client";
    uint8_t msg[sizeof(ls) + 2 + 2 * KVLI_AUTH_NONCE];
    size_t o = sizeof(ls) - 1;
    memcpy(msg, server ? ls : lc, o);
    kvli_put16(msg + o, a->purpose);
    o += 2;
    memcpy(msg + o, server ? a->nonce_c : a->nonce_s, KVLI_AUTH_NONCE);
    o += KVLI_AUTH_NONCE;
    memcpy(msg + o, server ? a->nonce_s : a->nonce_c, KVLI_AUTH_NONCE);
    o += KVLI_AUTH_NONCE;
    if (a->secret == NULL || a->secret_len == 0) {
        memset(out, 0, KVLI_AUTH_MAC);
        return;
    }
    kvli_tcp_auth_hmac(a->secret, a->secret_len, msg, o, out);
}

int kvli_tcp_auth_step1(kvli_tcp_auth_t *a, uint8_t *out)
{
    if (kvli_tcp_auth_random(a->nonce_c, KVLI_AUTH_NONCE) != 0)
        return -1;
    kvli_put32(out, KVLI_AUTH1_MAGIC);
    kvli_put16(out + 4, KVLI_AUTH_VERSION);
    kvli_put16(out + 6, a->purpose);
    kvli_put32(out + 8, a->secret_len > 0 ? 1u : 0u);
    memcpy(out + 12, a->nonce_c, KVLI_AUTH_NONCE);
    return 0;
}

int kvli_tcp_auth_step2(kvli_tcp_auth_t *a, const uint8_t *in1, uint8_t *out, char *why,
                        size_t why_cap)
{
    uint32_t magic = kvli_get32(in1), flags = kvli_get32(in1 + 8);
    if (magic != KVLI_AUTH1_MAGIC || kvli_get16(in1 + 4) != KVLI_AUTH_VERSION) {
        snprintf(why, why_cap, "its first 8 bytes are not a kvlane AUTH1 (magic 0x%08" PRIx32
                 ", version %u)", magic, (unsigned)kvli_get16(in1 + 4));
        return -1;
    }
    if (kvli_get16(in1 + 6) != a->purpose || flags > 1) {
        snprintf(why, why_cap, "AUTH1 for purpose %u flags 0x%" PRIx32 " (this port serves "
                 "purpose %u: %s)", (unsigned)kvli_get16(in1 + 6), flags, (unsigned)a->purpose,
                 a->purpose == KVLI_AUTH_PURPOSE_DATA ? "tcp data" : "agent listener");
        return -1;
    }
    a->peer_has_secret = (int)(flags & 1u);
    memcpy(a->nonce_c, in1 + 12, KVLI_AUTH_NONCE);
    if (kvli_tcp_auth_random(a->nonce_s, KVLI_AUTH_NONCE) != 0) {
        snprintf(why, why_cap, "RAND_bytes() failed to draw a nonce");
        return -1;
    }
    kvli_put32(out, KVLI_AUTH2_MAGIC);
    kvli_put16(out + 4, KVLI_AUTH_VERSION);
    kvli_put16(out + 6, a->purpose);
    kvli_put32(out + 8, a->secret_len > 0 ? 1u : 0u);
    memcpy(out + 12, a->nonce_s, KVLI_AUTH_NONCE);
    kvli_tcp_auth_mac(a, 1, out + 12 + KVLI_AUTH_NONCE);
    return 0;
}

int kvli_tcp_auth_step3(kvli_tcp_auth_t *a, const uint8_t *in2, uint8_t *out, char *why,
                        size_t why_cap)
{
    uint8_t mac[KVLI_AUTH_MAC];
    uint32_t magic = kvli_get32(in2), flags = kvli_get32(in2 + 8);
    int verdict = KVLI_AUTH_OK;
    if (magic != KVLI_AUTH2_MAGIC || kvli_get16(in2 + 4) != KVLI_AUTH_VERSION ||
        kvli_get16(in2 + 6) != a->purpose || flags > 1) {
        snprintf(why, why_cap, "it answered with magic 0x%08" PRIx32 " version %u purpose %u, "
                 "not a kvlane AUTH2", magic, (unsigned)kvli_get16(in2 + 4),
                 (unsigned)kvli_get16(in2 + 6));
        return -1;
    }
    a->peer_has_secret = (int)(flags & 1u);
    memcpy(a->nonce_s, in2 + 12, KVLI_AUTH_NONCE);
    if (a->peer_has_secret && a->secret_len == 0) {
        verdict = KVLI_AUTH_CLIENT_NO_SECRET;
        snprintf(why, why_cap, "it requires a shared secret and this agent has none");
    } else if (!a->peer_has_secret && a->secret_len > 0) {
        verdict = KVLI_AUTH_SERVER_NO_SECRET;
        snprintf(why, why_cap, "it has no shared secret, so it cannot prove it knows ours; "
                 "refusing it");
    } else if (a->secret_len > 0) {
        kvli_tcp_auth_mac(a, 1, mac);
        if (!kvli_tcp_auth_equal(mac, in2 + 12 + KVLI_AUTH_NONCE, KVLI_AUTH_MAC)) {
            verdict = KVLI_AUTH_SERVER_BAD_PROOF;
            snprintf(why, why_cap, "its proof of the shared secret is wrong (HMAC-SHA256 "
                     "mismatch): the two agents have different secrets");
        }
    }
    kvli_put32(out, KVLI_AUTH3_MAGIC);
    kvli_put32(out + 4, (uint32_t)verdict);
    if (verdict == KVLI_AUTH_OK)
        kvli_tcp_auth_mac(a, 0, out + 8);
    else
        memset(out + 8, 0, KVLI_AUTH_MAC);
    return verdict;
}

int kvli_tcp_auth_step4(kvli_tcp_auth_t *a, const uint8_t *in3, uint8_t *out, size_t *out_len,
                        const char *me, char *why, size_t why_cap)
{
    char text[KVLI_AUTH_TEXT_MAX + 1];
    uint8_t mac[KVLI_AUTH_MAC];
    uint32_t verdict = kvli_get32(in3 + 4);
    int32_t status = 0;
    size_t tl;
    text[0] = '\0';
    if (kvli_get32(in3) != KVLI_AUTH3_MAGIC) {
        snprintf(why, why_cap, "AUTH3 magic 0x%08" PRIx32 " is not valid", kvli_get32(in3));
        snprintf(text, sizeof(text), "malformed AUTH3");
        status = KVL_ERR_REMOTE_REFUSED;
    } else if (verdict == KVLI_AUTH_CLIENT_NO_SECRET) {
        snprintf(why, why_cap, "it has no shared secret (this agent requires one)");
        snprintf(text, sizeof(text), "agent '%.63s' requires a shared secret", me);
        status = KVL_ERR_PERMISSION;
    } else if (verdict == KVLI_AUTH_SERVER_NO_SECRET) {
        snprintf(why, why_cap, "it requires a shared secret and this agent has none");
        status = KVL_ERR_PERMISSION;
    } else if (verdict == KVLI_AUTH_SERVER_BAD_PROOF) {
        snprintf(why, why_cap, "it says our proof of the shared secret is wrong: the two "
                 "agents have different secrets");
        status = KVL_ERR_PERMISSION;
    } else if (verdict != KVLI_AUTH_OK) {
        snprintf(why, why_cap, "AUTH3 verdict %" PRIu32 " is not valid", verdict);
        status = KVL_ERR_REMOTE_REFUSED;
    } else if (a->secret_len > 0) {
        kvli_tcp_auth_mac(a, 0, mac);
        if (!a->peer_has_secret || !kvli_tcp_auth_equal(mac, in3 + 8, KVLI_AUTH_MAC)) {
            snprintf(why, why_cap, "%s",
                     a->peer_has_secret ? "its proof of the shared secret is wrong (HMAC-SHA256 "
                                          "mismatch): it does not know our secret"
                                        : "it has no shared secret (this agent requires one)");
            snprintf(text, sizeof(text), "agent '%.63s' refused the proof of the shared secret",
                     me);
            status = KVL_ERR_PERMISSION;
        }
    }
    tl = strlen(text);
    kvli_put32(out, KVLI_AUTH4_MAGIC);
    kvli_put32(out + 4, (uint32_t)status);
    kvli_put32(out + 8, (uint32_t)tl);
    memcpy(out + KVLI_AUTH4_FIXED, text, tl);
    *out_len = KVLI_AUTH4_FIXED + tl;
    return status == 0 ? 0 : -1;
}

kvl_status_t kvli_tcp_auth_client(int fd, uint16_t purpose, const uint8_t *secret, size_t len,
                                  uint64_t deadline_ns, const char *component,
                                  const char *peer_desc, kvl_error_t *err)
{
    kvli_tcp_auth_t a;
    uint8_t m1[KVLI_AUTH1_LEN], m2[KVLI_AUTH2_LEN], m3[KVLI_AUTH3_LEN];
    uint8_t m4[KVLI_AUTH4_FIXED + KVLI_AUTH_TEXT_MAX + 1];
    char why[256] = "";
    uint32_t tl;
    int32_t status;
    int rc, verdict;

    memset(&a, 0, sizeof(a));
    a.secret = secret;
    a.secret_len = secret ? len : 0;
    a.purpose = purpose;
    if (kvli_tcp_auth_step1(&a, m1) != 0) {
        kvl_bk_error_set(err, KVL_ERR_SYSTEM, 0, component, -1,
                         "authenticating to %s: RAND_bytes() failed to draw a nonce", peer_desc);
        kvl_bk_error_hint(err, "the system's random source is not available");
        return KVL_ERR_SYSTEM;
    }
    rc = kvli_tcp_io_write(fd, m1, sizeof(m1), deadline_ns);
    if (rc == 0)
        rc = kvli_tcp_io_read(fd, m2, sizeof(m2), deadline_ns);
    if (rc != 0) {
        kvl_bk_error_set(err, rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT,
                         rc > 0 ? rc : ECONNRESET, component, -1,
                         "authentication with %s: %s", peer_desc, kvli_tcp_io_text(rc));
        kvl_bk_error_hint(err, "the peer closed the connection or did not answer; check that "
                          "the address is a kvlane agent and that the peer is alive");
        return rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT;
    }
    verdict = kvli_tcp_auth_step3(&a, m2, m3, why, sizeof(why));
    if (verdict < 0) {
        kvl_bk_error_set(err, KVL_ERR_REMOTE, EPROTO, component, -1, "%s is not a kvlane %s: %s",
                         peer_desc, purpose == KVLI_AUTH_PURPOSE_DATA ? "tcp data port"
                                                                      : "agent listener", why);
        kvl_bk_error_hint(err, "another program owns that port, or the peer runs an "
                          "incompatible kvlane; check the address and the peer's version");
        return KVL_ERR_REMOTE;
    }
    rc = kvli_tcp_io_write(fd, m3, sizeof(m3), deadline_ns);
    if (verdict != KVLI_AUTH_OK) {
        kvl_bk_error_set(err, KVL_ERR_PERMISSION, 0, component, -1,
                         "refusing %s: %s", peer_desc, why);
        kvl_bk_error_hint(err, "give both agents the same secret "
                          "(kvl_agent_config_t.secret with KVL_AGENT_CFG_SECRET), or none to both");
        return KVL_ERR_PERMISSION;
    }
    if (rc == 0)
        rc = kvli_tcp_io_read(fd, m4, KVLI_AUTH4_FIXED, deadline_ns);
    if (rc == 0) {
        tl = kvli_get32(m4 + 8);
        if (kvli_get32(m4) != KVLI_AUTH4_MAGIC || tl > KVLI_AUTH_TEXT_MAX)
            rc = EPROTO;
        else
            rc = kvli_tcp_io_read(fd, m4 + KVLI_AUTH4_FIXED, tl, deadline_ns);
    }
    if (rc != 0) {
        kvl_bk_error_set(err, rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT,
                         rc > 0 ? rc : ECONNRESET, component, -1,
                         "authentication with %s: %s", peer_desc,
                         rc == EPROTO ? "malformed AUTH4" : kvli_tcp_io_text(rc));
        kvl_bk_error_hint(err, "the peer closed the connection or did not answer; check that "
                          "the address is a kvlane agent and that the peer is alive");
        return rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT;
    }
    status = (int32_t)kvli_get32(m4 + 4);
    m4[KVLI_AUTH4_FIXED + tl] = '\0';
    if (status != 0) {
        kvl_bk_error_set(err, KVL_ERR_PERMISSION, 0, component, -1,
                         "%s refused this agent: %s", peer_desc,
                         tl ? (const char *)m4 + KVLI_AUTH4_FIXED : "no reason given");
        kvl_bk_error_hint(err, "give both agents the same secret "
                          "(kvl_agent_config_t.secret with KVL_AGENT_CFG_SECRET), or none to both");
        return KVL_ERR_PERMISSION;
    }
    return KVL_OK;
}

int kvli_tcp_auth_server(int fd, uint16_t purpose, const uint8_t *secret, size_t len,
                         uint64_t deadline_ns, const char *me, char *why, size_t why_cap)
{
    kvli_tcp_auth_t a;
    uint8_t m1[KVLI_AUTH1_LEN], m2[KVLI_AUTH2_LEN], m3[KVLI_AUTH3_LEN];
    uint8_t m4[KVLI_AUTH4_FIXED + KVLI_AUTH_TEXT_MAX + 1];
    size_t l4 = 0;
    int rc, ok;

    memset(&a, 0, sizeof(a));
    a.secret = secret;
    a.secret_len = secret ? len : 0;
    a.purpose = purpose;
    rc = kvli_tcp_io_read(fd, m1, sizeof(m1), deadline_ns);
    if (rc != 0) {
        snprintf(why, why_cap, "reading AUTH1: %s", kvli_tcp_io_text(rc));
        return -1;
    }
    if (kvli_tcp_auth_step2(&a, m1, m2, why, why_cap) != 0)
        return -1;
    rc = kvli_tcp_io_write(fd, m2, sizeof(m2), deadline_ns);
    if (rc == 0)
        rc = kvli_tcp_io_read(fd, m3, sizeof(m3), deadline_ns);
    if (rc != 0) {
        snprintf(why, why_cap, "during authentication: %s", kvli_tcp_io_text(rc));
        return -1;
    }
    ok = kvli_tcp_auth_step4(&a, m3, m4, &l4, me, why, why_cap);
    (void)kvli_tcp_io_write(fd, m4, l4, deadline_ns);
    return ok;
}
