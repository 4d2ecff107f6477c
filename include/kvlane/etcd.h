/* kvlane: agents publish and find metadata through etcd (v3). */
#ifndef KVLANE_ETCD_H
#define KVLANE_ETCD_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>
#include <kvlane/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVL_ETCD_DEFAULT_PREFIX "/nixl/agents"
#define KVL_ETCD_DEFAULT_LABEL "metadata"

typedef struct kvl_etcd_config {
    /* etcd client URLs, comma-separated: "http://10.0.0.5:2379,10.0.0.6:2379"
     * (host:port gets http://, or https:// when TLS files are given: see
     * kvl_etcd_tls_t). The format of NIXL_ETCD_ENDPOINTS. */
    const char *endpoints;
    /* Namespace of the keys: <prefix>/<agent name>/<label>. NULL or "":
     * KVL_ETCD_DEFAULT_PREFIX (NIXL's NIXL_ETCD_NAMESPACE default). */
    const char *prefix;
    /* Lease TTL in seconds (0: 10): a process that dies disappears from
     * every watcher at most this long after its last keepalive. */
    unsigned lease_ttl_s;
    /* Credentials when etcd has authentication on; NULL: none. */
    const char *user, *password;
    /* Bound of one request to one endpoint in ms (0: the agent's timeout). */
    uint64_t timeout_ms;
} kvl_etcd_config_t;

/*
 * TLS to etcd (etcd's --cert-file, --trusted-ca-file, --client-cert-auth).
 *
 * Why a struct of its own: kvl_etcd_config_t was published without a
 * field_mask, so a field appended to it would be read past the end of the
 * struct of a program built against the older header. This one carries a
 * field_mask (as kvl_agent_config_t does) and is passed to
 * kvl_etcd_attach_tls()/kvl_etcd_probe_tls(); kvl_etcd_attach() and
 * kvl_etcd_probe() stay as they were (no TLS files: the system's CAs for
 * https:// endpoints). Set field_mask to the fields you filled in; later
 * fields (a CRL, a minimum TLS version) are added behind new bits.
 *
 * With any file given, every endpoint is https: "host:port" gets https://
 * and an http:// endpoint is refused (certificates are never sent, nor
 * dropped, over plain http). The files are read at attach, before any
 * connection: missing, unreadable, not PEM, a key that is not the
 * certificate's, are refused naming the file.
 */
#define KVL_ETCD_TLS_CA_FILE     (1ull << 0)
#define KVL_ETCD_TLS_CERT_FILE   (1ull << 1)
#define KVL_ETCD_TLS_KEY_FILE    (1ull << 2)
#define KVL_ETCD_TLS_VERIFY_NAME (1ull << 3)

typedef struct kvl_etcd_tls {
    uint64_t field_mask;
    /* PEM bundle of the CA(s) that signed etcd's server certificates
     * (etcdctl --cacert). NULL: the system's CA store. */
    const char *ca_file;
    /* PEM client certificate that etcd checks against its
     * --trusted-ca-file (etcdctl --cert). NULL: none. */
    const char *cert_file;
    /* Its private key, PEM, not encrypted (etcdctl --key). NULL: the key is
     * in cert_file. Requires cert_file. */
    const char *key_file;
    /* 0: do not check that the server's certificate names the host of the
     * endpoint (it is still checked against the CA). Default (bit unset): 1. */
    int verify_name;
} kvl_etcd_tls_t;

/*
 * Attach the agent to etcd: check that an endpoint answers (authenticating
 * when a user is given), grant this agent's lease, and start keeping it
 * alive and watching the namespace. Fails, bounded by timeout_ms per
 * endpoint, when no endpoint answers or etcd refuses us. One attachment per
 * agent; kvl_agent_destroy() detaches (revokes the lease: our keys go).
 *
 * While attached:
 *   - the lease is kept alive (every TTL/3); when etcd is away longer than
 *     the TTL the lease expires and, once etcd answers again, a new one is
 *     granted and every label published is published again (fresh);
 *   - a peer loaded with kvl_etcd_fetch() is followed: when its key is
 *     deleted (destroy, kvl_etcd_unpublish, lease expired: the process died)
 *     or replaced by a new incarnation (it restarted), its metadata is
 *     dropped here (kvl_remote_remove); a new generation of the same
 *     incarnation (regions changed) is loaded;
 *   - after a deregistration, the labels published are published again.
 * Transfers set up before etcd went away keep working: etcd is only asked
 * for metadata.
 */
kvl_status_t kvl_etcd_attach(kvl_agent_t *agent, const kvl_etcd_config_t *config);

/* kvl_etcd_attach() over TLS: tls NULL is kvl_etcd_attach(). Every
 * connection to etcd (calls, keepalives, watches) uses these files. */
kvl_status_t kvl_etcd_attach_tls(kvl_agent_t *agent, const kvl_etcd_config_t *config,
                                 const kvl_etcd_tls_t *tls);

/* Publish this agent's metadata under <prefix>/<name>/<label> (label NULL
 * or "": KVL_ETCD_DEFAULT_LABEL), attached to its lease. */
kvl_status_t kvl_etcd_publish(kvl_agent_t *agent, const char *label);

/*
 * Publish partial metadata of this agent (kvl_metadata_get_partial) under
 * <prefix>/<name>/<label>, attached to its lease (NIXL's
 * sendLocalPartialMD with a label). The default label keeps the full
 * metadata: label NULL, "" or KVL_ETCD_DEFAULT_LABEL is refused, as is a
 * blob that is not partial metadata of this agent (KVL_ERR_INVALID_ARG).
 * kvl_etcd_fetch(name, label) loads it, merged into what is held (see
 * kvl_metadata_load). The blob is published again as it is when the lease
 * is renewed; after a deregistration of a region it names, it is withdrawn
 * (its key deleted, a warning logged) instead.
 */
kvl_status_t kvl_etcd_publish_partial(kvl_agent_t *agent, const char *label, const void *blob,
                                      size_t len);

/*
 * Load the metadata agent `name` published under label (NULL: the default),
 * waiting up to wait_ms for it to appear (0: no wait), and follow it (see
 * kvl_etcd_attach). KVL_ERR_NOT_FOUND when it is not there in time.
 */
kvl_status_t kvl_etcd_fetch(kvl_agent_t *agent, const char *name, const char *label,
                            uint64_t wait_ms);

/*
 * kvl_etcd_fetch() in the background (NIXL's fetch_remote_metadata without
 * an address): queued, and returns at once. One thread of the agent reads
 * the keys of every background fetch that is due in one request, and
 * waits for peers that have not published yet through the watch, up to
 * wait_ms each; up to 4 others load what it found (a peer that cannot be
 * reached holds one of them up to the agent's timeout, not the others).
 * kvl_remote_check(name) turns KVL_OK once the metadata is loaded;
 * kvl_etcd_fetch_status() says whether it is still pending, loaded or why
 * it failed (a failure is also logged, as NIXL does). Asking again for a
 * name that is pending restarts its wait with the new label and wait_ms;
 * for one that ended, fetches it again.
 * Fails at once only for what kvl_etcd_fetch refuses before reading (not
 * attached, a bad name or label) and when its thread cannot start.
 */
kvl_status_t kvl_etcd_fetch_async(kvl_agent_t *agent, const char *name, const char *label,
                                  uint64_t wait_ms);

/*
 * The last background fetch of agent `name`, waiting up to wait_ms for it
 * to end (0: no wait): KVL_OK (loaded), KVL_IN_PROGRESS (still pending), or
 * the error it failed with, as kvl_etcd_fetch would have returned it
 * (KVL_ERR_NOT_FOUND: not published within its wait). KVL_ERR_STATE when
 * none was started for that name, or its result was forgotten: an agent
 * keeps those of its last 4096 background fetches (by name), the oldest
 * ended ones going first.
 */
kvl_status_t kvl_etcd_fetch_status(kvl_agent_t *agent, const char *name, uint64_t wait_ms);

/* Remove every key this agent published (revokes its lease); followers drop
 * its metadata. A later kvl_etcd_publish publishes again. */
kvl_status_t kvl_etcd_unpublish(kvl_agent_t *agent);

/*
 * kvlane doctor's etcd checks, endpoint by endpoint (check names
 * "<i>.reach", "<i>.auth", "<i>.lease", then "endpoints"): reachable and
 * its version, the namespace readable with the credentials, a lease's
 * clock and the grant round trip. Takes about 2 s per live endpoint.
 * KVL_ERR_REMOTE_DISCONNECT when no endpoint answers.
 */
kvl_status_t kvl_etcd_probe(const kvl_etcd_config_t *config, kvl_probe_cb_t cb, void *arg);

/* kvl_etcd_probe() over TLS (tls NULL: kvl_etcd_probe). Adds the check
 * "tls" (the files, the client certificate's subject) and, per https
 * endpoint, "<i>.tls": the TLS version and who verified the server. */
kvl_status_t kvl_etcd_probe_tls(const kvl_etcd_config_t *config, const kvl_etcd_tls_t *tls,
                                kvl_probe_cb_t cb, void *arg);

#ifdef __cplusplus
}
#endif
#endif
