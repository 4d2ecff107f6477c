/*
 * kvlane ucx backend: turn UCX failures into diagnoses. Each one names the
 * device or transport, quotes UCX's status (ucs_status_string) and what UCX
 * logged during the call (ucx_log.c), and says what to do.
 *
 * Error texts are built so the first ~200 characters (what a registration
 * report line shows) already hold the cause and UCX's words.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ucx.h"
#include "common/rdma_diag.h"

const char *kvli_ucx_mem_types_str(uint64_t types, char *buf, size_t len)
{
    static const struct { int t; const char *n; } names[] = {
        {UCS_MEMORY_TYPE_HOST, "host"}, {UCS_MEMORY_TYPE_CUDA, "cuda"},
        {UCS_MEMORY_TYPE_CUDA_MANAGED, "cuda-managed"}, {UCS_MEMORY_TYPE_ROCM, "rocm"},
        {UCS_MEMORY_TYPE_ROCM_MANAGED, "rocm-managed"},
    };
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && off < len; i++)
        if (types & (1ull << names[i].t))
            off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "," : "", names[i].n);
    if (off == 0)
        snprintf(buf, len, "none");
    return buf;
}

static const char *kvli_ucx_env(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? v : "(unset)";
}

/* Does UCX's transport list ("tcp,sysv,posix,cma,self") hold a shared-memory
 * transport, the fast path between agents on one host? */
int kvli_ucx_tls_has_shm(const char *list)
{
    static const char *const shm[] = {"sysv", "posix", "cma", "xpmem", "knem"};
    char pat[40], cur[200];
    snprintf(cur, sizeof(cur), ",%.190s,", list);
    for (size_t i = 0; i < sizeof(shm) / sizeof(shm[0]); i++) {
        snprintf(pat, sizeof(pat), ",%s,", shm[i]);
        if (strstr(cur, pat) != NULL)
            return 1;
    }
    return 0;
}

/* Transports that pin (lock) registered memory: RDMA ones. */
static int kvli_ucx_tl_pins(const char *tl)
{
    static const char *const pins[] = {"rc", "rc_verbs", "rc_mlx5", "ud", "ud_verbs",
                                       "ud_mlx5", "dc", "dc_mlx5", "gdr_copy"};
    for (size_t i = 0; i < sizeof(pins) / sizeof(pins[0]); i++)
        if (strcmp(tl, pins[i]) == 0)
            return 1;
    return 0;
}

/* Which transports/devices the context uses: UCX prints them
 * ("# resource 1 : md 1 dev 1 flags -- tcp/lo"); there is no query call. */
void kvli_ucx_diag_resources(kvli_ucx_iface_t *iface)
{
    char *text = NULL, *save = NULL;
    size_t tlen = 0, off = 0, loff = 0;
    FILE *f = open_memstream(&text, &tlen);

    iface->transports[0] = '\0';
    iface->tls_list[0] = '\0';
    if (f == NULL)
        return;
    ucp_context_print_info(iface->context, f);
    fclose(f);
    for (char *ln = strtok_r(text, "\n", &save); ln != NULL; ln = strtok_r(NULL, "\n", &save)) {
        char *r = strstr(ln, "resource"), *dash = strstr(ln, "-- ");
        char tl[64];
        if (r == NULL || dash == NULL)
            continue;
        dash += 3;
        if (off < sizeof(iface->transports))
            off += (size_t)snprintf(iface->transports + off, sizeof(iface->transports) - off,
                                    "%s%.60s", off ? " " : "", dash);
        snprintf(tl, sizeof(tl), "%.63s", dash);
        tl[strcspn(tl, "/")] = '\0';
        if (kvli_ucx_tl_pins(tl))
            iface->pinning = 1;
        /* unique transport names, comma-separated */
        char pat[70];
        snprintf(pat, sizeof(pat), ",%s,", tl);
        char cur[sizeof(iface->tls_list) + 2];
        snprintf(cur, sizeof(cur), ",%s,", iface->tls_list);
        if (strstr(cur, pat) == NULL && loff < sizeof(iface->tls_list))
            loff += (size_t)snprintf(iface->tls_list + loff, sizeof(iface->tls_list) - loff,
                                     "%s%s", loff ? "," : "", tl);
    }
    free(text);
}

/* "tls=rc (backend parameter)" or "UCX_TLS=rc" or "UCX_TLS=(unset)". */
static void kvli_ucx_setting(char *buf, size_t cap, const char *param, const char *key,
                             const char *env)
{
    if (param != NULL && param[0])
        snprintf(buf, cap, "%s=%.60s (backend parameter; %s=%.60s)", key, param, env,
                 kvli_ucx_env(env));
    else
        snprintf(buf, cap, "%s=%.60s", env, kvli_ucx_env(env));
}

void kvli_ucx_diag_init_failed(kvl_error_t *err, const char *call, ucs_status_t s,
                               const kvli_ucx_log_t *log, const char *tls, const char *dev)
{
    char said[1100], ts[160], ds[160];
    int tls_param = tls != NULL && tls[0], dev_param = dev != NULL && dev[0];
    kvl_status_t code = s == UCS_ERR_NO_DEVICE ? KVL_ERR_NO_DEVICE
                      : s == UCS_ERR_NO_MEMORY ? KVL_ERR_NO_MEMORY
                      : s == UCS_ERR_UNSUPPORTED ? KVL_ERR_UNSUPPORTED : KVL_ERR_SYSTEM;
    kvli_ucx_log_said(log, said, sizeof(said));
    kvli_ucx_setting(ts, sizeof(ts), tls, "tls", "UCX_TLS");
    kvli_ucx_setting(ds, sizeof(ds), dev, "net_devices", "UCX_NET_DEVICES");
    kvl_bk_error_set(err, code, 0, KVLI_UCX_NAME, -1, "%s = %s%s (%s, %s)", call,
                     ucs_status_string(s), said, ts, ds);
    if (log != NULL && strstr(log->text, "transport '") != NULL)
        kvl_bk_error_hint(err, tls_param
                          ? "the backend parameter tls names transports this UCX does not "
                            "have: use transports UCX lists above (ucx_info -d), e.g. tls=tcp "
                            "or tls=sm,tcp, or leave it out to let UCX choose"
                          : "UCX_TLS names transports this UCX does not have: set it to "
                            "transports UCX lists above (ucx_info -d), e.g. UCX_TLS=tcp or "
                            "UCX_TLS=sm,tcp, or unset it to let UCX choose");
    else if (log != NULL && strstr(log->text, "network device") != NULL)
        kvl_bk_error_hint(err, dev_param
                          ? "the backend parameter net_devices names devices UCX cannot open: "
                            "use devices UCX lists above (ucx_info -d) or leave it out; kvlane "
                            "doctor compares /sys/class/infiniband with /dev/infiniband"
                          : "UCX_NET_DEVICES names devices UCX cannot open: set it to "
                            "devices UCX lists above (ucx_info -d) or unset it; kvlane doctor "
                            "compares /sys/class/infiniband with /dev/infiniband");
    else
        kvl_bk_error_hint(err, "run ucx_info -d to see the transports and devices UCX finds, "
                          "and check UCX_* environment variables");
}

/* UCX_NET_DEVICES naming a device UCX does not have is only a warning in
 * UCX: the context comes up without it, and traffic silently takes
 * another path (or none reaches the peer). Make it a diagnosis. */
void kvli_ucx_diag_net_devices(kvli_ucx_iface_t *iface, const kvli_ucx_log_t *log)
{
    const char *p = log->text, *q;
    char devs[160] = "", explain[900] = "", first[64] = "";
    size_t off = 0;
    kvli_rdma_scan_t *scan;

    while ((p = strstr(p, "network device '")) != NULL) {
        p += strlen("network device '");
        q = strchr(p, '\'');
        if (q == NULL)
            break;
        if (off < sizeof(devs))
            off += (size_t)snprintf(devs + off, sizeof(devs) - off, "%s%.*s", off ? ", " : "",
                                    (int)(q - p < 60 ? q - p : 60), p);
        if (first[0] == '\0')
            snprintf(first, sizeof(first), "%.*s", (int)(q - p < 60 ? q - p : 60), p);
        p = q;
    }
    if (devs[0] == '\0')
        return;
    scan = malloc(sizeof(*scan));
    if (scan != NULL) {
        kvli_rdma_diag_scan(scan);
        kvli_rdma_diag_explain(scan, first, explain, sizeof(explain));
        free(scan);
    }
    iface->config_bad = 1;
    kvl_bk_error_set(&iface->config_err, KVL_ERR_NO_DEVICE, 0, KVLI_UCX_NAME, -1,
                     "UCX has no network device %s (UCX_NET_DEVICES=%.60s); UCX said \"%.300s\" "
                     "(ucp_init: %s, went on without it: %.120s)", devs,
                     kvli_ucx_env("UCX_NET_DEVICES"), log->text, ucs_status_string(UCS_OK),
                     iface->transports);
    kvl_bk_error_hint(&iface->config_err, "set UCX_NET_DEVICES to devices UCX lists (ucx_info "
                      "-d) or unset it; %.400s", explain);
}

void kvli_ucx_diag_memlock(kvli_ucx_iface_t *iface, uint64_t len, char *buf, size_t cap)
{
    uint64_t lim = kvli_rdma_diag_memlock();
    char l[32];
    buf[0] = '\0';
    if (lim >= len)
        return;
    kvli_rdma_diag_size_str(lim, l, sizeof(l));
    if (iface->pinning)
        snprintf(buf, cap, "; warning: locked-memory limit %s is below this region and RDMA "
                 "transports pin memory (raise ulimit -l)", l);
    else
        snprintf(buf, cap, "; locked-memory limit %s is below the region but no transport in "
                 "use pins memory (%.80s)", l, iface->tls_list);
}

void kvli_ucx_diag_map_failed(kvli_ucx_iface_t *iface, const kvl_region_info_t *r,
                              ucs_status_t s, const kvli_ucx_log_t *log, kvl_error_t *err)
{
    char said[1100], l[32];
    uint64_t lim = kvli_rdma_diag_memlock();
    int locked = lim < r->len;
    kvli_ucx_log_said(log, said, sizeof(said));
    kvl_bk_error_set(err, s == UCS_ERR_NO_MEMORY || locked ? KVL_ERR_NO_MEMORY : KVL_ERR_SYSTEM,
                     0, KVLI_UCX_NAME, r->dev, "ucp_mem_map(%s, 0x%llx+%llu) = %s%s%s%s",
                     r->kind == KVL_MEM_VRAM ? "cuda" : "host", (unsigned long long)r->addr,
                     (unsigned long long)r->len, ucs_status_string(s), said,
                     locked ? "; locked-memory limit is " : "",
                     locked ? kvli_rdma_diag_size_str(lim, l, sizeof(l)) : "");
    if (locked)
        kvl_bk_error_hint(err, "RLIMIT_MEMLOCK (%s) is smaller than the region (%llu bytes) and "
                          "UCX must pin it for %.80s: raise it (ulimit -l unlimited; in "
                          "Kubernetes/docker: --ulimit memlock=-1, or CAP_IPC_LOCK)",
                          l, (unsigned long long)r->len, iface->tls_list);
    else
        kvl_bk_error_hint(err, "check that the range is mapped memory of this process; "
                          "transports in use: %.200s", iface->transports);
}

void kvli_ucx_diag_unreachable(kvli_ucx_iface_t *iface, kvli_ucx_peer_t *peer,
                               ucs_status_t s, const kvli_ucx_log_t *log, kvl_error_t *err)
{
    char said[1100];
    kvli_ucx_log_said(log, said, sizeof(said));
    kvl_bk_error_set(err, s == UCS_ERR_UNREACHABLE ? KVL_ERR_NO_BACKEND : KVL_ERR_REMOTE, 0,
                     KVLI_UCX_NAME, -1, "ucp_ep_create(to '%.60s') = %s: no transport of this "
                     "side (%.80s) reaches agent '%.60s' (%.80s)%s", peer->name,
                     ucs_status_string(s), iface->tls_list, peer->name, peer->remote_tls, said);
    kvl_bk_error_hint(err, "UCX_TLS must leave both agents a common transport that reaches "
                      "the other: e.g. tcp on both (any hosts) or sm on both (same host); "
                      "this side has UCX_TLS=%.60s", iface->tls_cfg);
}
