/*
 * RDMA devices listed vs openable, and the locked-memory limit.
 *
 * Why: in a container the kernel's sysfs often lists every NIC of the host
 * (/sys/class/infiniband/mlx5_*) while /dev/infiniband holds only some
 * nodes (or only rdma_cm). Verbs then fail with "No such device" and the
 * transport library says nothing about the missing node. Comparing both
 * lists turns that into "mlx5_3 is listed but /dev/infiniband/uverbs3 is
 * missing: expose it to the container".
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include "rdma_diag.h"

static void kvli_rdma_diag_root(const char *env, const char *dflt, char *buf, size_t len)
{
    const char *v = getenv(env);
    snprintf(buf, len, "%s", v && v[0] ? v : dflt);
}

/* The uverbs node sysfs associates with an IB device: class/infiniband_verbs/
 * uverbsN/ibdev holds the device name. */
static void kvli_rdma_diag_uverbs(const kvli_rdma_scan_t *s, const char *dev, char *out,
                                  size_t cap)
{
    char path[600];
    DIR *d;
    struct dirent *e;

    out[0] = '\0';
    snprintf(path, sizeof(path), "%.255s/class/infiniband_verbs", s->sysfs_root);
    d = opendir(path);
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        char ib[600], name[64] = "";
        FILE *f;
        if (strncmp(e->d_name, "uverbs", 6) != 0)
            continue;
        snprintf(ib, sizeof(ib), "%.255s/class/infiniband_verbs/%.64s/ibdev", s->sysfs_root,
                 e->d_name);
        f = fopen(ib, "re");
        if (f == NULL)
            continue;
        if (fgets(name, sizeof(name), f) != NULL)
            name[strcspn(name, "\r\n")] = '\0';
        fclose(f);
        if (strcmp(name, dev) == 0) {
            snprintf(out, cap, "%.31s", e->d_name);
            break;
        }
    }
    closedir(d);
}

void kvli_rdma_diag_scan(kvli_rdma_scan_t *s)
{
    char path[600];
    DIR *d;
    struct dirent *e;
    size_t off = 0;

    memset(s, 0, sizeof(*s));
    kvli_rdma_diag_root("KVL_SYSFS_ROOT", "/sys", s->sysfs_root, sizeof(s->sysfs_root));
    kvli_rdma_diag_root("KVL_DEV_ROOT", "/dev", s->dev_root, sizeof(s->dev_root));

    snprintf(path, sizeof(path), "%.255s/infiniband", s->dev_root);
    d = opendir(path);
    if (d != NULL) {
        s->dev_dir_present = 1;
        while ((e = readdir(d)) != NULL) {
            int n;
            if (e->d_name[0] == '.')
                continue;
            n = snprintf(s->dev_nodes + off, sizeof(s->dev_nodes) - off, "%s%.40s",
                         off ? " " : "", e->d_name);
            if (n < 0 || (size_t)n >= sizeof(s->dev_nodes) - off)
                break;
            off += (size_t)n;
        }
        closedir(d);
    }

    snprintf(path, sizeof(path), "%.255s/class/infiniband", s->sysfs_root);
    d = opendir(path);
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL && s->n < KVLI_RDMA_MAX_DEVS) {
        kvli_rdma_dev_t *v;
        char node[600];
        int fd;
        if (e->d_name[0] == '.')
            continue;
        v = &s->devs[s->n++];
        snprintf(v->name, sizeof(v->name), "%.63s", e->d_name);
        kvli_rdma_diag_uverbs(s, v->name, v->uverbs, sizeof(v->uverbs));
        if (v->uverbs[0] == '\0') {
            v->node_errno = ENOENT;
            s->n_broken++;
            continue;
        }
        snprintf(node, sizeof(node), "%.255s/infiniband/%.31s", s->dev_root, v->uverbs);
        if (access(node, F_OK) != 0) {
            v->node_errno = errno;
            s->n_broken++;
            continue;
        }
        v->node_present = 1;
        fd = open(node, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            v->node_errno = errno;
            s->n_broken++;
            continue;
        }
        close(fd);
        v->node_openable = 1;
    }
    closedir(d);
}

static const kvli_rdma_dev_t *kvli_rdma_diag_find(const kvli_rdma_scan_t *s, const char *dev)
{
    char name[64];
    size_t n = strcspn(dev, ":");
    if (n >= sizeof(name))
        n = sizeof(name) - 1;
    memcpy(name, dev, n);
    name[n] = '\0';
    for (unsigned i = 0; i < s->n; i++)
        if (strcmp(s->devs[i].name, name) == 0)
            return &s->devs[i];
    return NULL;
}

static int kvli_rdma_diag_one(const kvli_rdma_scan_t *s, const kvli_rdma_dev_t *v, char *buf,
                              size_t len)
{
    const char *nodes = s->dev_dir_present ? (s->dev_nodes[0] ? s->dev_nodes : "nothing")
                                           : "nothing (the directory is missing)";
    if (v->node_openable)
        return snprintf(buf, len, "%s is listed in %s/class/infiniband and %s/infiniband/%s "
                        "opens", v->name, s->sysfs_root, s->dev_root, v->uverbs);
    if (v->uverbs[0] == '\0')
        return snprintf(buf, len, "%s is listed in %s/class/infiniband but no uverbs device "
                        "belongs to it in %s/class/infiniband_verbs (the verbs driver, e.g. "
                        "ib_uverbs, is not loaded): load ib_uverbs on the host",
                        v->name, s->sysfs_root, s->sysfs_root);
    if (!v->node_present)
        return snprintf(buf, len, "%s is listed in %s/class/infiniband but %s/infiniband/%s "
                        "does not exist (%s/infiniband holds %.200s): the device is not "
                        "exposed to this container; add %s/infiniband/%s (e.g. the RDMA "
                        "device plugin, or --device=/dev/infiniband/%s) or leave it out of "
                        "UCX_NET_DEVICES", v->name, s->sysfs_root, s->dev_root, v->uverbs,
                        s->dev_root, nodes, s->dev_root, v->uverbs, v->uverbs);
    return snprintf(buf, len, "%s is listed and %s/infiniband/%s exists but cannot be opened "
                    "(%s): check its permissions and the container's device cgroup",
                    v->name, s->dev_root, v->uverbs, strerror(v->node_errno));
}

unsigned kvli_rdma_diag_render(const kvli_rdma_scan_t *s, char *buf, size_t len)
{
    size_t off = 0;
    if (len > 0)
        buf[0] = '\0';
    for (unsigned i = 0; i < s->n; i++) {
        char line[1024];
        int n;
        if (s->devs[i].node_openable)
            continue;
        kvli_rdma_diag_one(s, &s->devs[i], line, sizeof(line));
        if (off >= len)
            break;
        n = snprintf(buf + off, len - off, "%s%s", off ? "; " : "", line);
        if (n < 0)
            break;
        off += (size_t)n;
    }
    return s->n_broken;
}

void kvli_rdma_diag_explain(const kvli_rdma_scan_t *s, const char *dev, char *buf, size_t len)
{
    const kvli_rdma_dev_t *v = kvli_rdma_diag_find(s, dev);
    if (v != NULL) {
        kvli_rdma_diag_one(s, v, buf, len);
        return;
    }
    if (s->n == 0) {
        snprintf(buf, len, "%.64s is not an RDMA device of this host: %s/class/infiniband "
                 "lists none (no RDMA NIC or driver here)", dev, s->sysfs_root);
        return;
    }
    size_t off = (size_t)snprintf(buf, len, "%.64s is not listed in %s/class/infiniband (it "
                                  "lists:", dev, s->sysfs_root);
    for (unsigned i = 0; i < s->n && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, " %s", s->devs[i].name);
    if (off < len)
        snprintf(buf + off, len - off, ")");
}

uint64_t kvli_rdma_diag_memlock(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    return (uint64_t)rl.rlim_cur;
}

const char *kvli_rdma_diag_size_str(uint64_t v, char *buf, size_t len)
{
    if (v == UINT64_MAX)
        snprintf(buf, len, "unlimited");
    else if (v >= (1ull << 30) && v % (1ull << 30) == 0)
        snprintf(buf, len, "%llu GiB", (unsigned long long)(v >> 30));
    else if (v >= (1ull << 20) && v % (1ull << 20) == 0)
        snprintf(buf, len, "%llu MiB", (unsigned long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, len, "%llu KiB", (unsigned long long)(v >> 10));
    else
        snprintf(buf, len, "%llu bytes", (unsigned long long)v);
    return buf;
}
