/* HMAC-SHA256 of several pieces (see mac.h). */
#include <string.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include "mac.h"

#define KVLI_MAC_MSG_MAX 1024

void kvli_mac(const uint8_t *key, size_t klen, const kvli_mac_part_t *parts, size_t n,
              uint8_t out[KVLI_MAC_LEN])
{
    uint8_t msg[KVLI_MAC_MSG_MAX];
    size_t len = 0;
    unsigned int ol = KVLI_MAC_LEN;

    for (size_t i = 0; i < n; i++) {
        if (parts[i].len > sizeof(msg) - len) {
            memset(out, 0, KVLI_MAC_LEN);
            return;
        }
        memcpy(msg + len, parts[i].p, parts[i].len);
        len += parts[i].len;
    }
    if (HMAC(EVP_sha256(), key, (int)klen, msg, len, out, &ol) == NULL || ol != KVLI_MAC_LEN)
        memset(out, 0, KVLI_MAC_LEN);
}

/*
 * OpenSSL frees its tables from an exit handler that it registers at its
 * first initialisation. Our threads (progress threads answering a peer's
 * HELLO, listener threads, etcd's keeper and watcher over TLS) may be inside
 * libcrypto when a process calls exit() without destroying its agents, and
 * crashed there (freed method tables, corrupted heap). Initialising it
 * first, at load, with OPENSSL_INIT_NO_ATEXIT leaves the tables to the
 * process's end. When the process initialised OpenSSL before loading us,
 * its handler is registered already; it then runs after the handlers
 * registered later, as the Python module's (which closes every agent).
 */
void kvli_crypto_init(void)
{
    (void)OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

int kvli_mac_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}
