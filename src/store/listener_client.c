/*
 * kvlane agent listener, client side: fetch a peer's metadata by address,
 * push ours, invalidate what we pushed. Every call is bounded by the agent's
 * timeout (connect, authentication, request, reply).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/errname.h"
#include "common/auth.h"
#include "common/inet.h"
#include "core/md_codec.h"
#include "listener.h"
#include "listener_proto.h"

kvl_status_t kvli_listener_call(kvl_agent_t *a, const char *hp, uint32_t type, const void *body,
                                size_t len, int32_t *status_p, char *text, size_t text_cap,
                                void **body_p, size_t *len_p, kvl_error_t *err)
{
    char host[256], why[256], desc[KVLI_LSN_HP_MAX + 16];
    struct sockaddr_storage ss;
    socklen_t sl;
    uint8_t req[KVLI_LSN_REQ_LEN], rep[KVLI_LSN_REP_LEN];
    char rtext[KVLI_LSN_TEXT_MAX + 1];
    uint64_t deadline, blen = 0;
    uint32_t tl = 0;
    kvl_status_t st;
    uint16_t port;
    int fd, e = 0, rc;

    if (body_p)
        *body_p = NULL;
    if (len_p)
        *len_p = 0;
    if (text && text_cap)
        text[0] = '\0';
    if (hp == NULL || kvli_tcp_hostport_split(hp, host, sizeof(host), &port) != 0 || port == 0) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "listener address '%.200s' is not host:port",
                 hp ? hp : "(null)");
        kvli_hint(err, "write it as 10.0.0.5:7000, [fd00::5]:7000 or name:7000 (port 1..65535)");
        return KVL_ERR_INVALID_ARG;
    }
    if (kvli_tcp_resolve(host, port, &ss, &sl, why, sizeof(why)) != 0) {
        kvli_err(err, KVL_ERR_INVALID_ARG, 0, "listener address '%.200s': %s", hp, why);
        kvli_hint(err, "check the host name or use a numeric address");
        return KVL_ERR_INVALID_ARG;
    }
    /* Blobs up to 64 MiB: allow for 10 MB/s on top of the timeout. */
    deadline = kvli_clock_ns() + (a->timeout_ms + len / 10000u) * 1000000u;
    fd = kvli_tcp_connect((struct sockaddr *)&ss, sl, a->timeout_ms, &e);
    if (fd < 0) {
        kvli_err(err, KVL_ERR_REMOTE_DISCONNECT, e, "connect(%.200s) to the agent listener = -1 "
                 "%s (%s)", hp, kvli_errno_name(e), strerror(e));
        kvli_hint(err, e == ECONNREFUSED
                  ? "no agent listens there (not started, exited, or another port: see what "
                    "kvl_agent_listen() returned)"
                  : "check the address and the route to the peer (host down, firewall)");
        return KVL_ERR_REMOTE_DISCONNECT;
    }
    kvli_tcp_sock_tune(fd, a->timeout_ms, 0, 0);
    snprintf(desc, sizeof(desc), "listener %s", hp);
    st = kvli_tcp_auth_client(fd, KVLI_AUTH_PURPOSE_LISTENER, a->secret, a->secret_len,
                              deadline, "listener", desc, err);
    if (st != KVL_OK) {
        close(fd);
        return st;
    }
    kvli_listener_proto_req_build(req, type, len);
    rc = kvli_tcp_io_write(fd, req, sizeof(req), deadline);
    if (rc == 0 && len > 0)
        rc = kvli_tcp_io_write(fd, body, len, deadline);
    if (rc == 0)
        rc = kvli_tcp_io_read(fd, rep, sizeof(rep), deadline);
    if (rc != 0) {
        close(fd);
        kvli_err(err, rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT,
                 rc > 0 ? rc : ECONNRESET, "listener %.200s, %s request: %s", hp,
                 kvli_listener_proto_type_name(type), kvli_tcp_io_text(rc));
        kvli_hint(err, "the peer closed the connection or did not answer in time (see its log: "
                       "it may have refused us); check it and retry");
        return rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT;
    }
    if (kvli_listener_proto_rep_parse(rep, status_p, &tl, &blen, why, sizeof(why)) != 0 ||
        (type != KVLI_LSN_FETCH && blen != 0)) {
        close(fd);
        kvli_err(err, KVL_ERR_REMOTE, EPROTO, "listener %.200s sent a malformed reply: %s", hp,
                 why[0] ? why : "a body for a request that has none");
        kvli_hint(err, "another program owns that port or the peer runs an incompatible kvlane");
        return KVL_ERR_REMOTE;
    }
    rc = kvli_tcp_io_read(fd, rtext, tl, deadline);
    if (rc == 0 && blen > 0) {
        void *b = malloc((size_t)blen);
        if (b == NULL) {
            close(fd);
            kvli_err(err, KVL_ERR_NO_MEMORY, ENOMEM, "listener %.200s: no memory for a %" PRIu64
                     "-byte reply", hp, blen);
            return KVL_ERR_NO_MEMORY;
        }
        deadline += blen / 10000u * 1000000u;
        rc = kvli_tcp_io_read(fd, b, (size_t)blen, deadline);
        if (rc == 0 && body_p) {
            *body_p = b;
            *len_p = (size_t)blen;
        } else {
            free(b);
        }
    }
    close(fd);
    if (rc != 0) {
        kvli_err(err, rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT,
                 rc > 0 ? rc : ECONNRESET, "listener %.200s, %s request: %s", hp,
                 kvli_listener_proto_type_name(type), kvli_tcp_io_text(rc));
        kvli_hint(err, "the peer closed the connection or did not answer in time (see its log: "
                       "it may have refused us); check it and retry");
        return rc == ETIMEDOUT ? KVL_ERR_TIMEOUT : KVL_ERR_REMOTE_DISCONNECT;
    }
    rtext[tl] = '\0';
    if (text && text_cap)
        snprintf(text, text_cap, "%s", rtext);
    return KVL_OK;
}

static kvl_status_t kvli_listener_refused(const char *hp, uint32_t type, int32_t status,
                                          const char *text, kvl_error_t *err)
{
    kvl_status_t code = status == KVL_ERR_STALE || status == KVL_ERR_BAD_METADATA ||
                                status == KVL_ERR_NOT_FOUND
                            ? status : KVL_ERR_REMOTE_REFUSED;
    kvli_err(err, code, 0, "listener %.200s refused the %s request (%s): %.600s", hp,
             kvli_listener_proto_type_name(type), kvl_status_name(status),
             text[0] ? text : "no reason given");
    kvli_hint(err, "the reason above is the peer's; see its log too");
    return code;
}

/* Push the blob given (partial metadata) or, blob NULL, our full metadata. */
static kvl_status_t kvli_listener_push_blob(kvl_agent_t *a, const char *hp, const void *given,
                                            size_t given_len, kvl_error_t *err)
{
    char text[KVLI_LSN_TEXT_MAX + 1];
    void *blob = NULL;
    size_t len = 0;
    int32_t status = 0;
    kvl_status_t st = KVL_OK;
    if (given == NULL)
        st = kvl_metadata_get(a, &blob, &len);
    if (st != KVL_OK) {
        *err = *kvl_last_error();
        return st;
    }
    st = kvli_listener_call(a, hp, KVLI_LSN_PUSH, given ? given : blob, given ? given_len : len,
                            &status, text, sizeof(text), NULL, NULL, err);
    kvl_free(blob);
    if (st == KVL_OK && status != 0)
        st = kvli_listener_refused(hp, KVLI_LSN_PUSH, status, text, err);
    return st;
}

kvl_status_t kvli_listener_push_one(kvl_agent_t *a, const char *hp, kvl_error_t *err)
{
    return kvli_listener_push_blob(a, hp, NULL, 0, err);
}

kvl_status_t kvli_listener_invalidate_one(kvl_agent_t *a, const char *hp, kvl_error_t *err)
{
    uint8_t body[8 + KVLI_LSN_NAME_MAX];
    char text[KVLI_LSN_TEXT_MAX + 1];
    int32_t status = 0;
    size_t bl = kvli_listener_proto_inval_build(body, a->incarnation, a->name);
    kvl_status_t st = kvli_listener_call(a, hp, KVLI_LSN_INVALIDATE, body, bl, &status, text,
                                         sizeof(text), NULL, NULL, err);
    if (st == KVL_OK && status != 0 && status != KVL_ERR_NOT_FOUND)
        st = kvli_listener_refused(hp, KVLI_LSN_INVALIDATE, status, text, err);
    return st;
}

kvl_status_t kvl_metadata_fetch(kvl_agent_t *a, const char *hp, char *name_out, size_t name_cap)
{
    kvl_error_t err;
    char text[KVLI_LSN_TEXT_MAX + 1];
    void *blob = NULL;
    size_t len = 0;
    int32_t status = 0;
    kvl_status_t st;
    if (name_out && name_cap)
        name_out[0] = '\0';
    if (a == NULL || hp == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_metadata_fetch: agent or host_port is NULL");
    memset(&err, 0, offsetof(kvl_error_t, causes));
    err.device = -1;
    st = kvli_listener_call(a, hp, KVLI_LSN_FETCH, NULL, 0, &status, text, sizeof(text), &blob,
                            &len, &err);
    if (st == KVL_OK && status != 0)
        st = kvli_listener_refused(hp, KVLI_LSN_FETCH, status, text, &err);
    if (st != KVL_OK) {
        kvli_scopy(err.backend, sizeof(err.backend), "listener");
        return kvli_fail(a, &err);
    }
    st = kvl_metadata_load(a, blob, len, name_out, name_cap);
    free(blob);
    return st;
}

static kvl_status_t kvli_metadata_push(kvl_agent_t *a, const char *hp, const void *blob,
                                       size_t len)
{
    kvl_error_t err;
    kvli_listener_t *l;
    kvl_status_t st;
    if (a == NULL || hp == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_metadata_push: agent or host_port is NULL");
    if (strlen(hp) >= KVLI_LSN_HP_MAX)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, "write it as host:port",
                                "listener address of %zu characters is too long", strlen(hp));
    memset(&err, 0, offsetof(kvl_error_t, causes));
    err.device = -1;
    if (blob != NULL && kvli_md_check_own_partial(a, blob, len, "kvl_metadata_push_partial",
                                                  &err) != KVL_OK)
        return kvli_fail(a, &err);
    st = kvli_listener_push_blob(a, hp, blob, len, &err);
    if (st != KVL_OK) {
        if (!err.backend[0])
            kvli_scopy(err.backend, sizeof(err.backend), "listener");
        return kvli_fail(a, &err);
    }
    l = kvli_listener_get(a, true);
    if (l == NULL)
        return kvli_fail_simple(a, KVL_ERR_NO_MEMORY, NULL, "kvl_metadata_push: out of memory");
    pthread_mutex_lock(&l->lock);
    kvli_listener_target_t *t = l->targets;
    while (t != NULL && strcmp(t->hp, hp) != 0)
        t = t->next;
    if (t == NULL && (t = calloc(1, sizeof(*t))) != NULL) {
        kvli_scopy(t->hp, sizeof(t->hp), hp);
        t->next = l->targets;
        l->targets = t;
    }
    pthread_mutex_unlock(&l->lock);
    return KVL_OK;
}

kvl_status_t kvl_metadata_push(kvl_agent_t *a, const char *hp)
{
    return kvli_metadata_push(a, hp, NULL, 0);
}

kvl_status_t kvl_metadata_push_partial(kvl_agent_t *a, const char *hp, const void *blob,
                                       size_t len)
{
    if (blob == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL,
                                "kvl_metadata_push_partial: blob is NULL");
    return kvli_metadata_push(a, hp, blob, len);
}

kvl_status_t kvl_metadata_invalidate(kvl_agent_t *a, const char *hp)
{
    kvl_error_t err, first;
    kvli_listener_t *l;
    kvl_status_t st = KVL_OK;
    if (a == NULL)
        return kvli_fail_simple(a, KVL_ERR_INVALID_ARG, NULL, "kvl_metadata_invalidate: agent is NULL");
    memset(&first, 0, sizeof(first));
    l = kvli_listener_get(a, false);
    for (;;) {
        char one[KVLI_LSN_HP_MAX];
        kvli_listener_target_t *t = NULL, **pp;
        kvl_status_t s;
        if (hp != NULL) {
            kvli_scopy(one, sizeof(one), hp);
        } else {
            if (l == NULL)
                break;
            pthread_mutex_lock(&l->lock);
            t = l->targets;
            if (t != NULL)
                l->targets = t->next;
            pthread_mutex_unlock(&l->lock);
            if (t == NULL)
                break;
            kvli_scopy(one, sizeof(one), t->hp);
            free(t);
        }
        if (hp != NULL && l != NULL) {
            pthread_mutex_lock(&l->lock);
            for (pp = &l->targets; *pp != NULL; pp = &(*pp)->next)
                if (strcmp((*pp)->hp, hp) == 0) {
                    t = *pp;
                    *pp = t->next;
                    free(t);
                    break;
                }
            pthread_mutex_unlock(&l->lock);
        }
        memset(&err, 0, offsetof(kvl_error_t, causes));
        err.device = -1;
        s = kvli_listener_invalidate_one(a, one, &err);
        if (s != KVL_OK && st == KVL_OK) {
            st = s;
            first = err;
        }
        if (hp != NULL)
            break;
    }
    if (st != KVL_OK) {
        kvli_scopy(first.backend, sizeof(first.backend), "listener");
        return kvli_fail(a, &first);
    }
    return KVL_OK;
}
