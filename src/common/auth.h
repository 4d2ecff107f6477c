/*
 * Mutual challenge-response on a fresh connection (shared layer), used by the
 * tcp backend's data connections and the agent listener (src/store/).
 *
 *   client -> AUTH1  magic "KVA1" u32 | version u16 | purpose u16 | flags u32
 *                    (bit 0: client has a secret) | nonce_c[32]          44 B
 *   server -> AUTH2  magic "KVA2" u32 | version u16 | purpose u16 | flags u32
 *                    (bit 0: server has a secret) | nonce_s[32] | mac_s[32] 76 B
 *   client -> AUTH3  magic "KVA3" u32 | verdict u32 | mac_c[32]            40 B
 *   server -> AUTH4  magic "KVA4" u32 | status i32 | text_len u32 | text   12+ B
 *
 *   mac_s = HMAC-SHA256(secret, "kvlane-auth-v1 server" | purpose | nonce_c | nonce_s)
 *   mac_c = HMAC-SHA256(secret, "kvlane-auth-v1 client" | purpose | nonce_s | nonce_c)
 *
 * Nonces are 32 fresh random bytes (RAND_bytes) per connection; MACs are
 * compared in constant time (CRYPTO_memcmp). The secret itself never crosses
 * the wire. Without a secret on either side the exchange still runs (it
 * costs one round trip) and MACs are zero. The server proves first; the
 * client refuses a server that cannot prove (verdict), the server refuses a
 * client that cannot (status); each side logs or returns the exact reason.
 */
#ifndef KVLI_AUTH_H
#define KVLI_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/backend.h>

#define KVLI_AUTH_NONCE 32u
#define KVLI_AUTH_MAC 32u
#define KVLI_AUTH1_LEN 44u
#define KVLI_AUTH2_LEN 76u
#define KVLI_AUTH3_LEN 40u
#define KVLI_AUTH4_FIXED 12u
#define KVLI_AUTH_TEXT_MAX 255u

enum { KVLI_AUTH_PURPOSE_DATA = 1, KVLI_AUTH_PURPOSE_LISTENER = 2 };

/* AUTH3 verdicts */
enum {
    KVLI_AUTH_OK = 0,
    KVLI_AUTH_CLIENT_NO_SECRET = 1,     /* server wants a secret, client has none */
    KVLI_AUTH_SERVER_NO_SECRET = 2,     /* client has a secret, server proved none */
    KVLI_AUTH_SERVER_BAD_PROOF = 3      /* server's MAC is wrong: secrets differ */
};

typedef struct kvli_tcp_auth {
    const uint8_t *secret;
    size_t secret_len;
    uint16_t purpose;
    uint8_t nonce_c[KVLI_AUTH_NONCE], nonce_s[KVLI_AUTH_NONCE];
    int peer_has_secret;
} kvli_tcp_auth_t;

/* Pure steps (no I/O). why gets a short reason on failure. */
int kvli_tcp_auth_step1(kvli_tcp_auth_t *a, uint8_t *out);
int kvli_tcp_auth_step2(kvli_tcp_auth_t *a, const uint8_t *in1, uint8_t *out, char *why,
                        size_t why_cap);
/* Returns the verdict sent in AUTH3 (KVLI_AUTH_OK or a refusal), -1 when
 * AUTH2 is malformed. */
int kvli_tcp_auth_step3(kvli_tcp_auth_t *a, const uint8_t *in2, uint8_t *out, char *why,
                        size_t why_cap);
/* Server: AUTH4 into out (at most KVLI_AUTH4_FIXED + KVLI_AUTH_TEXT_MAX);
 * returns 0 when the client is accepted, -1 with why (for the log) else. */
int kvli_tcp_auth_step4(kvli_tcp_auth_t *a, const uint8_t *in3, uint8_t *out, size_t *out_len,
                        const char *me, char *why, size_t why_cap);

/*
 * Blocking client exchange on a connected socket, bounded by deadline_ns.
 * component names the error's backend ("tcp" or "listener"), peer_desc the
 * peer ("agent 'x' at 1.2.3.4:5" or "listener 1.2.3.4:5").
 */
kvl_status_t kvli_tcp_auth_client(int fd, uint16_t purpose, const uint8_t *secret, size_t len,
                                  uint64_t deadline_ns, const char *component,
                                  const char *peer_desc, kvl_error_t *err);
/* Blocking server exchange: 0 when the client is accepted, -1 with why. */
int kvli_tcp_auth_server(int fd, uint16_t purpose, const uint8_t *secret, size_t len,
                         uint64_t deadline_ns, const char *me, char *why, size_t why_cap);

#endif
