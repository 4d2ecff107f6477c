/*
 * SHA-1, for the one place the WebSocket protocol needs it (the
 * Sec-WebSocket-Accept check of RFC 6455, etcd_ws.c): not for security.
 * Our own, so that the watcher thread never enters libcrypto, whose first
 * digest fetch alone cost about half a millisecond per agent.
 */
#ifndef KVLI_SHA1_H
#define KVLI_SHA1_H

#include <stddef.h>
#include <stdint.h>

#define KVLI_SHA1_LEN 20

void kvli_sha1(const void *data, size_t len, uint8_t out[KVLI_SHA1_LEN]);

#endif
