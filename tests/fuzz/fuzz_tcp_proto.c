/* libFuzzer target: every parser of what the tcp backend and the agent
 * listener read from the network (message headers, ranges, HELLO, HELLO_ACK,
 * connection info, region keys, listener requests and replies, the
 * authentication messages) must refuse or accept any input without crashing,
 * and what it accepts must respect the bounds the callers rely on. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common/auth.h"
#include "backends/tcp/tcp_proto.h"
#include "store/listener_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t buf[256];
    char why[256], name[64];
    kvli_tcp_hdr_t h;
    memset(buf, 0, sizeof(buf));
    memcpy(buf, data, size < sizeof(buf) ? size : sizeof(buf));

    for (int dir = 0; dir < 2; dir++) {
        if (kvli_tcp_proto_hdr_parse(buf, dir, &h, why, sizeof(why)) != 0)
            continue;
        if (dir == KVLI_TCP_DIR_REQUEST && (h.type == KVLI_TCP_MSG_WRITE || h.type == KVLI_TCP_MSG_READ) &&
            (h.nranges == 0 || h.nranges > KVLI_TCP_RANGES_MAX || h.payload == 0 ||
             h.payload > KVLI_TCP_PAYLOAD_MAX))
            abort();
        if (dir == KVLI_TCP_DIR_REPLY && (h.text_len > KVLI_TCP_TEXT_MAX || h.len < h.text_len))
            abort();
    }
    if (size > 32) {
        uint32_t n = (uint32_t)((size - 32) / 16);
        uint64_t *out = malloc(sizeof(uint64_t) * 2 * (n + 1));
        uint64_t payload;
        memcpy(&payload, data + 24, 8);
        if (n > 0 && n <= KVLI_TCP_RANGES_MAX &&
            kvli_tcp_proto_ranges_parse(data + 32, n, payload, out, why, sizeof(why)) == 0) {
            uint64_t sum = 0;
            for (uint32_t i = 0; i < n; i++) {
                if (out[2 * i + 1] == 0 || out[2 * i] + out[2 * i + 1] < out[2 * i])
                    abort();
                sum += out[2 * i + 1];
            }
            if (sum != payload)
                abort();
        }
        free(out);
    }
    {
        kvli_tcp_hello_t hello;
        uint64_t inc, a, l;
        kvli_tcp_conninfo_t ci;
        if (kvli_tcp_proto_hello_parse(data, size, &hello, why, sizeof(why)) == 0 &&
            (strlen(hello.name) == 0 || strlen(hello.target) == 0))
            abort();
        (void)kvli_tcp_proto_ack_parse(data, size, &inc, name, sizeof(name), why, sizeof(why));
        if (kvli_tcp_proto_conn_parse(data, size, &ci, why, sizeof(why)) == 0 &&
            (ci.port == 0 || (ci.family != 4 && ci.family != 6)))
            abort();
        (void)kvli_tcp_proto_key_parse(data, size, &a, &l, why, sizeof(why));
    }
    {
        uint32_t type, tl;
        uint64_t len, inc;
        int32_t st;
        if (kvli_listener_proto_req_parse(buf, &type, &len, why, sizeof(why)) == 0 &&
            len > KVLI_LSN_BLOB_MAX)
            abort();
        if (kvli_listener_proto_rep_parse(buf, &st, &tl, &len, why, sizeof(why)) == 0 &&
            (tl > KVLI_LSN_TEXT_MAX || len > KVLI_LSN_BLOB_MAX))
            abort();
        (void)kvli_listener_proto_inval_parse(data, size, &inc, name, sizeof(name), why,
                                              sizeof(why));
    }
    {
        /* the server and client steps of the authentication on raw input */
        static const uint8_t key[] = "fuzz";
        kvli_tcp_auth_t s = {.secret = size & 1 ? key : NULL, .secret_len = size & 1 ? 4 : 0,
                             .purpose = KVLI_AUTH_PURPOSE_DATA};
        kvli_tcp_auth_t c = s;
        uint8_t out[KVLI_AUTH4_FIXED + KVLI_AUTH_TEXT_MAX + KVLI_AUTH2_LEN];
        size_t ol = 0;
        (void)kvli_tcp_auth_step2(&s, buf, out, why, sizeof(why));
        (void)kvli_tcp_auth_step3(&c, buf, out, why, sizeof(why));
        (void)kvli_tcp_auth_step4(&s, buf, out, &ol, "fuzz", why, sizeof(why));
        if (ol > sizeof(out))
            abort();
    }
    return 0;
}
