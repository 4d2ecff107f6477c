/*
 * kvlane built without the etcd metadata store (libcurl, json-c or nghttp2
 * development files were missing at build time: CMakeLists.txt leaves
 * src/store/etcd*.c out). The API stays, so programs link the same way;
 * every call is refused with the reason and the fix, and doctor's etcd
 * check fails saying so.
 */
#ifndef KVL_HAVE_ETCD
#include <kvlane/etcd.h>
#include "core/internal.h"

#define KVLI_NO_ETCD_WHY "this kvlane was built without the etcd metadata store: libcurl, " \
                         "json-c or nghttp2 development files were missing when it was built"
#define KVLI_NO_ETCD_FIX "rebuild kvlane with libcurl4-openssl-dev, libjson-c-dev and " \
                         "libnghttp2-dev installed (scripts/deps.sh), or exchange metadata " \
                         "through the agent listener"

static kvl_status_t kvli_no_etcd(kvl_agent_t *agent, const char *call)
{
    return kvli_fail_simple(agent, KVL_ERR_UNSUPPORTED, KVLI_NO_ETCD_FIX, "%s: %s", call,
                            KVLI_NO_ETCD_WHY);
}

kvl_status_t kvl_etcd_attach(kvl_agent_t *agent, const kvl_etcd_config_t *config)
{
    (void)config;
    return kvli_no_etcd(agent, "kvl_etcd_attach");
}

kvl_status_t kvl_etcd_attach_tls(kvl_agent_t *agent, const kvl_etcd_config_t *config,
                                 const kvl_etcd_tls_t *tls)
{
    (void)config;
    (void)tls;
    return kvli_no_etcd(agent, "kvl_etcd_attach_tls");
}

kvl_status_t kvl_etcd_publish(kvl_agent_t *agent, const char *label)
{
    (void)label;
    return kvli_no_etcd(agent, "kvl_etcd_publish");
}

kvl_status_t kvl_etcd_publish_partial(kvl_agent_t *agent, const char *label, const void *blob,
                                      size_t len)
{
    (void)label;
    (void)blob;
    (void)len;
    return kvli_no_etcd(agent, "kvl_etcd_publish_partial");
}

kvl_status_t kvl_etcd_fetch(kvl_agent_t *agent, const char *name, const char *label,
                            uint64_t wait_ms)
{
    (void)name;
    (void)label;
    (void)wait_ms;
    return kvli_no_etcd(agent, "kvl_etcd_fetch");
}

kvl_status_t kvl_etcd_fetch_async(kvl_agent_t *agent, const char *name, const char *label,
                                  uint64_t wait_ms)
{
    (void)name;
    (void)label;
    (void)wait_ms;
    return kvli_no_etcd(agent, "kvl_etcd_fetch_async");
}

kvl_status_t kvl_etcd_fetch_status(kvl_agent_t *agent, const char *name, uint64_t wait_ms)
{
    (void)name;
    (void)wait_ms;
    return kvli_no_etcd(agent, "kvl_etcd_fetch_status");
}

kvl_status_t kvl_etcd_unpublish(kvl_agent_t *agent)
{
    return kvli_no_etcd(agent, "kvl_etcd_unpublish");
}

kvl_status_t kvl_etcd_probe(const kvl_etcd_config_t *config, kvl_probe_cb_t cb, void *arg)
{
    (void)config;
    if (cb != NULL)
        cb(arg, "build", 2, KVLI_NO_ETCD_WHY, KVLI_NO_ETCD_FIX);
    return kvli_no_etcd(NULL, "kvl_etcd_probe");
}

kvl_status_t kvl_etcd_probe_tls(const kvl_etcd_config_t *config, const kvl_etcd_tls_t *tls,
                                kvl_probe_cb_t cb, void *arg)
{
    (void)tls;
    return kvl_etcd_probe(config, cb, arg);
}
#else
typedef int kvli_no_etcd_unused; /* the etcd store is built: nothing here */
#endif
