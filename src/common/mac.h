/*
 * HMAC-SHA256 over several pieces, and a constant-time comparison: the
 * proofs of the agent's shared secret (tcp and listener challenge-response,
 * shm HELLO). libcrypto does the work.
 */
#ifndef KVLI_MAC_H
#define KVLI_MAC_H

#include <stddef.h>
#include <stdint.h>

#define KVLI_MAC_LEN 32

typedef struct kvli_mac_part {
    const void *p;
    size_t len;
} kvli_mac_part_t;

/* out = HMAC-SHA256(key, parts[0] | parts[1] | ...); all zero on failure
 * (which cannot match a peer's real MAC). */
void kvli_mac(const uint8_t *key, size_t klen, const kvli_mac_part_t *parts, size_t n,
              uint8_t out[KVLI_MAC_LEN]);
/* Initialise libcrypto so that it registers no exit handler: run from the
 * library's constructor (core/agent.c), see mac.c. */
void kvli_crypto_init(void);
/* 1 when equal, in time independent of the contents. */
int kvli_mac_equal(const uint8_t *a, const uint8_t *b, size_t n);

#endif
