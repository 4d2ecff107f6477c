/*
 * Wire byte order: every kvlane protocol (tcp, the listener, authentication)
 * puts integers on the wire little-endian, whatever the host.
 */
#ifndef KVLI_WIRE_H
#define KVLI_WIRE_H

#include <stddef.h>
#include <stdint.h>

static inline void kvli_put16(uint8_t *b, uint16_t v) { b[0] = (uint8_t)v; b[1] = (uint8_t)(v >> 8); }
static inline void kvli_put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvli_put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kvli_get16(const uint8_t *b) { return (uint16_t)(b[0] | (b[1] << 8)); }
static inline uint32_t kvli_get32(const uint8_t *b)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | b[i];
    return v;
}
static inline uint64_t kvli_get64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | b[i];
    return v;
}


/* An agent name on the wire: 1..max bytes, printable, no space. */
static inline int kvli_wire_name_ok(const uint8_t *b, size_t len, size_t max)
{
    if (len == 0 || len > max)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (b[i] <= 0x20 || b[i] >= 0x7f)
            return 0;
    return 1;
}

#endif
