/*
 * kvlane ucx backend: preflight checks for `kvlane doctor` (the ops table's
 * probe slot). Runs without creating the backend: one UCP context, built
 * from the environment exactly as the backend builds it, is opened,
 * queried and closed. Reports, as "ucx.<check>":
 *
 *   version      UCX's version and the libucp that was loaded
 *   env          the UCX_* variables in the environment
 *   transports   the transports/devices UCX selected (fail: none usable,
 *                or only `self`; warn: only same-host ones)
 *   net_devices  UCX_NET_DEVICES entries UCX does not have (fail), each
 *                explained from sysfs vs /dev/infiniband (rdma_diag)
 *   tls          UCX_TLS leaving out RDMA while RDMA devices are listed (warn)
 *   rdma         RDMA devices listed and openable, but UCX has no RDMA
 *                transport on them (warn: verbs provider missing)
 *   gpu_memory   whether this UCX registers GPU memory (memory types)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ucx.h"
#include "common/rdma_diag.h"

extern char **environ;

typedef void (*kvli_ucx_report_t)(void *arg, const char *check, int status,
                                  const char *observed, const char *hint);

enum { KVLI_P_OK = 0, KVLI_P_WARN = 1, KVLI_P_FAIL = 2 };

/* A UCX_TLS entry that selects an RDMA (verbs) transport: ib, rc, ud, dc
 * and their _verbs/_mlx5/_x/_v variants, or all. */
static int kvli_ucx_probe_tl_rdma(const char *t, size_t n)
{
    static const char *const fam[] = {"rc", "ud", "dc"};
    if ((n == 3 && strncmp(t, "all", 3) == 0) || (n == 2 && strncmp(t, "ib", 2) == 0))
        return 1;
    for (size_t i = 0; i < sizeof(fam) / sizeof(fam[0]); i++)
        if (n >= 2 && strncmp(t, fam[i], 2) == 0 && (n == 2 || t[2] == '_'))
            return 1;
    return 0;
}

/* Does UCX_TLS (NULL: unset) let UCX use RDMA? "^list" excludes; RDMA is
 * off then only when "ib" or every rc/ud/dc family is excluded. */
static int kvli_ucx_probe_tls_rdma(const char *tls)
{
    int neg, any = 0, fams = 0;
    const char *p;
    if (tls == NULL || tls[0] == '\0')
        return 1;
    neg = tls[0] == '^';
    for (p = tls + neg; *p;) {
        size_t n = strcspn(p, ",");
        size_t tn = strcspn(p, ",:"); /* "ud:aux" */
        while (tn > 0 && p[0] == ' ')
            p++, n--, tn--;
        if (kvli_ucx_probe_tl_rdma(p, tn)) {
            any = 1;
            if (tn == 2 && strncmp(p, "ib", 2) == 0)
                fams = 3;
            else if (tn == 2)
                fams++;
        }
        p += n;
        if (*p == ',')
            p++;
    }
    return neg ? fams < 3 : any;
}

/* Transport of one resource "tcp/eth0": RDMA, network, or same host. */
static int kvli_ucx_probe_res_net(const char *res)
{
    return strncmp(res, "tcp/", 4) == 0 || kvli_ucx_probe_tl_rdma(res, strcspn(res, "/"));
}

/* Is dev ("mlx5_0:1", "eth0") the device of one of UCX's resources? */
static int kvli_ucx_probe_has_dev(const char *transports, const char *dev, size_t dn)
{
    const char *p = transports;
    while (*p) {
        size_t n = strcspn(p, " ");
        const char *slash = memchr(p, '/', n);
        if (slash != NULL && (size_t)(p + n - slash - 1) == dn && strncmp(slash + 1, dev, dn) == 0)
            return 1;
        p += n;
        while (*p == ' ')
            p++;
    }
    return 0;
}

/* The distinct network devices of UCX's resources, "eth0, lo, mlx5_0:1". */
static void kvli_ucx_probe_net_devs(const char *transports, char *buf, size_t len)
{
    const char *p = transports;
    size_t off = 0;
    buf[0] = '\0';
    while (*p && off < len) {
        size_t n = strcspn(p, " ");
        const char *slash = memchr(p, '/', n);
        if (slash != NULL && kvli_ucx_probe_res_net(p)) {
            int dn = (int)(p + n - slash - 1);
            char pat[72], cur[600];
            snprintf(pat, sizeof(pat), ", %.*s,", dn > 60 ? 60 : dn, slash + 1);
            snprintf(cur, sizeof(cur), ", %.590s,", buf);
            if (strstr(cur, pat) == NULL)
                off += (size_t)snprintf(buf + off, len - off, "%s%.*s", off ? ", " : "",
                                        dn > 60 ? 60 : dn, slash + 1);
        }
        p += n;
        while (*p == ' ')
            p++;
    }
    if (buf[0] == '\0')
        snprintf(buf, len, "none");
}

static void kvli_ucx_probe_env(kvli_ucx_report_t report, void *arg)
{
    char buf[900];
    size_t off = 0;
    buf[0] = '\0';
    for (char **e = environ; e != NULL && *e != NULL && off < sizeof(buf); e++)
        if (strncmp(*e, "UCX_", 4) == 0)
            off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%s%.200s", off ? " " : "", *e);
    report(arg, "env", KVLI_P_OK, off ? buf : "no UCX_* variables set: UCX picks transports and "
           "devices itself", "");
}

/* The network devices UCX would use with UCX_NET_DEVICES=all (the rest of
 * the environment as is): what the user may name. */
static void kvli_ucx_probe_all_devs(char *buf, size_t len)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    ucp_config_t *cfg = NULL;
    kvli_ucx_iface_t *tmp = calloc(1, sizeof(*tmp));
    kvli_ucx_log_t log;
    ucs_status_t s;

    snprintf(buf, len, "unknown");
    if (tmp == NULL)
        return;
    kvli_ucx_log_begin(&log);
    s = ucp_config_read(NULL, NULL, &cfg);
    if (s == UCS_OK) {
        ucp_config_modify(cfg, "NET_DEVICES", "all");
        s = ucp_init(&p, cfg, &tmp->context);
        ucp_config_release(cfg);
    }
    kvli_ucx_log_end();
    if (s == UCS_OK) {
        kvli_ucx_diag_resources(tmp);
        kvli_ucx_probe_net_devs(tmp->transports, buf, len);
        ucp_cleanup(tmp->context);
    }
    free(tmp);
}

/* UCX_NET_DEVICES: each entry UCX does not have is a failure, explained. */
static void kvli_ucx_probe_net_devices(kvli_ucx_report_t report, void *arg,
                                       const kvli_ucx_iface_t *iface, int ctx_ok,
                                       const kvli_rdma_scan_t *scan, const kvli_ucx_log_t *log)
{
    const char *nd = getenv("UCX_NET_DEVICES");
    char obs[2048], hint[1024], have[300], missing[300] = "";
    size_t off = 0, moff = 0;
    const char *p;
    if (nd == NULL || nd[0] == '\0' || strcmp(nd, "all") == 0)
        return;
    obs[0] = '\0';
    for (p = nd; *p && off < sizeof(obs);) {
        size_t n = strcspn(p, ",");
        char dev[64], why[900];
        snprintf(dev, sizeof(dev), "%.*s", (int)(n < 63 ? n : 63), p);
        p += n;
        if (*p == ',')
            p++;
        if (dev[0] == '\0' || (ctx_ok && kvli_ucx_probe_has_dev(iface->transports, dev,
                                                                  strlen(dev))))
            continue;
        if (scan != NULL && (strchr(dev, ':') != NULL || scan->n > 0)) {
            kvli_rdma_diag_explain(scan, dev, why, sizeof(why));
            if (strstr(why, " opens") != NULL)
                snprintf(why + strlen(why), sizeof(why) - strlen(why), ", so UCX_TLS (%.60s) "
                         "leaves out every transport that uses it", getenv("UCX_TLS") ?
                         getenv("UCX_TLS") : "unset");
        } else {
            snprintf(why, sizeof(why), "%.63s is not a network interface of this host (ip "
                     "link) nor an RDMA device", dev);
        }
        moff += (size_t)snprintf(missing + moff, sizeof(missing) - moff, "%s%.63s",
                                 moff ? ", " : "", dev);
        if (moff >= sizeof(missing))
            moff = sizeof(missing) - 1;
        off += (size_t)snprintf(obs + off, sizeof(obs) - off, "%s%.890s", off ? "; " : "", why);
    }
    kvli_ucx_probe_all_devs(have, sizeof(have));
    if (missing[0] == '\0') {
        snprintf(obs, sizeof(obs), "UCX_NET_DEVICES=%.200s: UCX has every device named (all "
                 "its network devices: %.300s)", nd, have);
        report(arg, "net_devices", KVLI_P_OK, obs, "");
        return;
    }
    {
        char full[3000], said[1100];
        snprintf(full, sizeof(full), "UCX_NET_DEVICES=%.200s names %.300s, which UCX does not "
                 "have (it has: %.300s): the ucx backend refuses every "
                 "registration (UCX alone would go on without the device)%.600s. %.1500s",
                 nd, missing, have, log->lines ? kvli_ucx_log_said(log, said, sizeof(said)) : "",
                 obs);
        snprintf(hint, sizeof(hint), "set UCX_NET_DEVICES to devices UCX lists (ucx_info -d: "
                 "%.300s) or unset it; when an RDMA device is listed but not openable, expose "
                 "/dev/infiniband to the container", have);
        report(arg, "net_devices", KVLI_P_FAIL, full, hint);
    }
}

static void kvli_ucx_probe_rdma(kvli_ucx_report_t report, void *arg,
                                const kvli_ucx_iface_t *iface, const kvli_rdma_scan_t *scan)
{
    const char *tls = getenv("UCX_TLS");
    char devs[300] = "", obs[1200], hint[600];
    size_t off = 0;
    /* Shared memory left out: agents on this host take the slow path. Said
     * with the RDMA finding when there is one, alone otherwise. */
    int no_shm = iface->tls_list[0] && !kvli_ucx_tls_has_shm(iface->tls_list);
    if (no_shm && (scan == NULL || scan->n == 0 || kvli_ucx_probe_tls_rdma(tls))) {
        snprintf(obs, sizeof(obs), "UCX_TLS=%.100s leaves out shared memory (UCX uses %.300s): "
                 "agents on this host move KV cache over them, far slower",
                 tls ? tls : "(unset)", iface->tls_list);
        report(arg, "tls", KVLI_P_WARN, obs,
               "add sm to UCX_TLS (e.g. UCX_TLS=sm,tcp) or unset it; kvlane's shm backend "
               "carries same-host transfers without UCX");
        return;
    }
    if (scan == NULL || scan->n == 0) {
        if (tls != NULL && tls[0] != '\0')
        {
            snprintf(obs, sizeof(obs), "UCX_TLS=%.100s; no RDMA devices here, so it leaves none "
                     "out (UCX uses %.300s)", tls, iface->tls_list[0] ? iface->tls_list : "none");
            report(arg, "tls", KVLI_P_OK, obs, "");
        }
        return;
    }
    for (unsigned i = 0; i < scan->n && off < sizeof(devs); i++)
        off += (size_t)snprintf(devs + off, sizeof(devs) - off, "%s%.63s", off ? ", " : "",
                                scan->devs[i].name);
    if (!kvli_ucx_probe_tls_rdma(tls)) {
        snprintf(obs, sizeof(obs), "UCX_TLS=%.100s leaves out every RDMA transport while %u "
                 "RDMA device%s %s listed (%.200s): UCX silently moves KV cache over %.120s "
                 "instead%s", tls, scan->n, scan->n == 1 ? "" : "s", scan->n == 1 ? "is" : "are",
                 devs, iface->tls_list[0] ? iface->tls_list : "the transports it allows",
                 no_shm ? "; it leaves out shared memory too (same-host agents are slow)" : "");
        report(arg, "tls", KVLI_P_WARN, obs,
               "to use RDMA, add it to UCX_TLS (e.g. UCX_TLS=rc,sm,self, or ^ud to exclude only "
               "ud) or unset UCX_TLS; ignore this if RDMA is meant to be off");
        return;
    }
    if (tls != NULL && tls[0] != '\0') {
        snprintf(obs, sizeof(obs), "UCX_TLS=%.100s allows RDMA transports", tls);
        report(arg, "tls", KVLI_P_OK, obs, "");
    }
    if (iface->pinning) {
        snprintf(obs, sizeof(obs), "UCX uses RDMA: %.600s", iface->transports);
        report(arg, "rdma", KVLI_P_OK, obs, "");
        return;
    }
    if (scan->n_broken == scan->n) {
        snprintf(obs, sizeof(obs), "RDMA devices are listed (%.200s) but none is openable, so "
                 "UCX has no RDMA transport (it uses %.200s): see rdma.devices", devs,
                 iface->tls_list);
        report(arg, "rdma", KVLI_P_WARN, obs,
               "expose /dev/infiniband to the container (see rdma.devices)");
        return;
    }
    off = 0;
    devs[0] = '\0';
    for (unsigned i = 0; i < scan->n && off < sizeof(devs); i++)
        if (scan->devs[i].node_openable)
            off += (size_t)snprintf(devs + off, sizeof(devs) - off, "%s%.63s", off ? ", " : "",
                                    scan->devs[i].name);
    snprintf(obs, sizeof(obs), "RDMA devices are listed and open (%.200s) but UCX offers no "
             "RDMA transport on them (it uses %.200s)", devs, iface->tls_list);
    snprintf(hint, sizeof(hint), "the verbs provider library for the NIC is missing in this "
             "image (rdma-core: libibverbs1 and ibverbs-providers, e.g. libmlx5.so), or this UCX "
             "was built without verbs (ucx_info -d lists no rc_/ud_ transports); check with "
             "ibv_devices and ucx_info -d");
    report(arg, "rdma", KVLI_P_WARN, obs, hint);
}

void kvli_ucx_probe(kvli_ucx_report_t report, void *arg, kvl_mem_kind_t mem, int32_t dev,
                    uint64_t planned_bytes)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    ucp_context_attr_t a = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    ucp_config_t *cfg = NULL;
    kvli_ucx_iface_t *iface;
    kvli_rdma_scan_t *scan;
    kvli_ucx_log_t log;
    kvl_error_t err;
    Dl_info di;
    char obs[2048], types[64];
    ucs_status_t s;
    int ctx_ok = 0;

    (void)planned_bytes; /* limits.memlock of doctor covers it */
    snprintf(obs, sizeof(obs), "UCX %.40s (%.300s)", ucp_get_version_string(),
             dladdr((void *)(uintptr_t)ucp_get_version_string, &di) && di.dli_fname ?
             di.dli_fname : "libucp");
    report(arg, "version", KVLI_P_OK, obs, "");
    kvli_ucx_probe_env(report, arg);

    iface = calloc(1, sizeof(*iface));
    scan = malloc(sizeof(*scan));
    if (iface == NULL || scan == NULL) {
        free(iface);
        free(scan);
        report(arg, "transports", KVLI_P_FAIL, "out of memory", "");
        return;
    }
    kvli_rdma_diag_scan(scan);

    kvli_ucx_log_begin(&log);
    s = ucp_config_read(NULL, NULL, &cfg);
    if (s == UCS_OK) {
        s = ucp_init(&p, cfg, &iface->context);
        ucp_config_release(cfg);
    }
    kvli_ucx_log_end();
    if (s != UCS_OK) {
        iface->context = NULL;
        kvli_ucx_diag_init_failed(&err, "ucp_init()", s, &log, "", "");
        snprintf(obs, sizeof(obs), "UCX has no usable transport: %.1900s", err.what);
        report(arg, "transports", KVLI_P_FAIL, obs, err.hint);
    } else {
        ctx_ok = 1;
        if (ucp_context_query(iface->context, &a) != UCS_OK)
            a.memory_types = 1u << UCS_MEMORY_TYPE_HOST;
        iface->mem_types = a.memory_types;
        kvli_ucx_diag_resources(iface);
    }

    if (ctx_ok) {
        int net = 0, other = 0;
        const char *t = iface->transports;
        char devs[300];
        while (*t) {
            size_t n = strcspn(t, " ");
            if (kvli_ucx_probe_res_net(t))
                net = 1;
            else if (strncmp(t, "self/", 5) != 0)
                other = 1;
            t += n;
            while (*t == ' ')
                t++;
        }
        kvli_ucx_probe_net_devs(iface->transports, devs, sizeof(devs));
        snprintf(obs, sizeof(obs), "%.600s (network devices: %.300s; UCX_TLS=%.100s)",
                 iface->transports[0] ? iface->transports : "no resources", devs,
                 getenv("UCX_TLS") ? getenv("UCX_TLS") : "unset");
        if (net)
            report(arg, "transports", KVLI_P_OK, obs, "");
        else if (other)
            report(arg, "transports", KVLI_P_WARN, obs,
                   "only same-host transports (shared memory): agents on other hosts cannot be "
                   "reached; add tcp or RDMA to UCX_TLS (e.g. UCX_TLS=tcp,sm,self) if the peer "
                   "is on another host");
        else
            report(arg, "transports", KVLI_P_FAIL, obs,
                   "UCX_TLS leaves only the loopback transport self: no other process can be "
                   "reached; set UCX_TLS=tcp,sm,self (or RDMA: rc,sm,self) or unset it");
    }

    kvli_ucx_probe_net_devices(report, arg, iface, ctx_ok, scan, &log);
    kvli_ucx_probe_rdma(report, arg, iface, scan);

    if (ctx_ok) {
        int cuda = (iface->mem_types & (1ull << UCS_MEMORY_TYPE_CUDA)) != 0;
        kvli_ucx_mem_types_str(iface->mem_types, types, sizeof(types));
        if (cuda)
            snprintf(obs, sizeof(obs), "UCX registers GPU memory: memory types %s", types);
        else
            snprintf(obs, sizeof(obs), "this UCX has no GPU memory support: memory types %s "
                     "(no cuda)%s", types, mem == KVL_MEM_VRAM ? "; VRAM registered on the ucx "
                     "backend is staged through pinned host buffers" : "; only matters for VRAM");
        if (!cuda && mem == KVL_MEM_VRAM) {
            if (dev != KVL_DEV_ANY)
                snprintf(obs + strlen(obs), sizeof(obs) - strlen(obs), " (device %d)", (int)dev);
            report(arg, "gpu_memory", KVLI_P_WARN, obs,
                   "staged VRAM costs two extra copies per byte; for GPUDirect RDMA use a UCX "
                   "built with CUDA (ucx_info -d lists cuda_copy/cuda_ipc); on one host the cuda "
                   "backend moves VRAM directly");
        } else {
            report(arg, "gpu_memory", KVLI_P_OK, obs, "");
        }
        ucp_cleanup(iface->context);
    }
    free(scan);
    free(iface);
}
