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

/* First line of a small sysfs file, trailing whitespace cut; "" on error. */
static void kvli_rdma_diag_read(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "re");
    out[0] = '\0';
    if (f == NULL)
        return;
    if (fgets(out, (int)cap, f) == NULL)
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\r\n")] = '\0';
}

/* A GID as sysfs prints it ("fe80:0000:...:0002"): any non-zero digit. */
static int kvli_rdma_diag_gid_set(const char *gid)
{
    for (; *gid; gid++)
        if (*gid != '0' && *gid != ':' && *gid != ' ')
            return 1;
    return 0;
}

static void kvli_rdma_diag_ports(const kvli_rdma_scan_t *s, kvli_rdma_dev_t *v)
{
    char path[700];
    DIR *d;
    struct dirent *e;

    snprintf(path, sizeof(path), "%.255s/class/infiniband/%.63s/ports", s->sysfs_root, v->name);
    d = opendir(path);
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL && v->nports < KVLI_RDMA_MAX_PORTS) {
        kvli_rdma_port_t *p;
        char base[700], file[800], buf[64];
        DIR *g;
        struct dirent *ge;
        char *end;
        unsigned long num = strtoul(e->d_name, &end, 10);
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end != '\0')
            continue;
        p = &v->ports[v->nports++];
        p->num = (unsigned)num;
        snprintf(base, sizeof(base), "%.255s/class/infiniband/%.63s/ports/%.16s", s->sysfs_root,
                 v->name, e->d_name);
        /* "4: ACTIVE" */
        snprintf(file, sizeof(file), "%.700s/state", base);
        kvli_rdma_diag_read(file, buf, sizeof(buf));
        end = strchr(buf, ':');
        snprintf(p->state, sizeof(p->state), "%.31s", end ? end + 1 + strspn(end + 1, " ") : buf);
        snprintf(file, sizeof(file), "%.700s/link_layer", base);
        kvli_rdma_diag_read(file, p->link_layer, sizeof(p->link_layer));
        snprintf(file, sizeof(file), "%.700s/gid_attrs/ndevs/0", base);
        kvli_rdma_diag_read(file, p->netdev, sizeof(p->netdev));
        snprintf(file, sizeof(file), "%.700s/gids", base);
        g = opendir(file);
        if (g == NULL)
            continue;
        p->gids_dir = 1;
        while ((ge = readdir(g)) != NULL) {
            char gid[80], gpath[900];
            if (ge->d_name[0] < '0' || ge->d_name[0] > '9')
                continue;
            snprintf(gpath, sizeof(gpath), "%.800s/%.16s", file, ge->d_name);
            kvli_rdma_diag_read(gpath, gid, sizeof(gid));
            if (kvli_rdma_diag_gid_set(gid))
                p->gids++;
        }
        closedir(g);
    }
    closedir(d);
    /* readdir order is arbitrary: port 1 first */
    for (unsigned i = 1; i < v->nports; i++)
        for (unsigned j = i; j > 0 && v->ports[j - 1].num > v->ports[j].num; j--) {
            kvli_rdma_port_t t = v->ports[j];
            v->ports[j] = v->ports[j - 1];
            v->ports[j - 1] = t;
        }
}

static int kvli_rdma_diag_cmp(const void *a, const void *b)
{
    return strcmp(((const kvli_rdma_dev_t *)a)->name, ((const kvli_rdma_dev_t *)b)->name);
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
        snprintf(path, sizeof(path), "%.255s/infiniband/rdma_cm", s->dev_root);
        if (access(path, F_OK) == 0) {
            int fd = open(path, O_RDWR | O_CLOEXEC);
            s->cm_present = 1;
            if (fd >= 0) {
                s->cm_openable = 1;
                close(fd);
            } else {
                s->cm_errno = errno;
            }
        } else {
            s->cm_errno = errno;
        }
    } else {
        s->cm_errno = errno;
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
        kvli_rdma_diag_ports(s, v);
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
    qsort(s->devs, s->n, sizeof(s->devs[0]), kvli_rdma_diag_cmp);
}

int kvli_rdma_diag_port(const kvli_rdma_dev_t *v, const kvli_rdma_port_t *p, char *buf,
                        size_t len, char *hint, size_t hint_len)
{
    const char *ll = p->link_layer[0] ? p->link_layer : "link layer unknown";
    int eth = strcmp(p->link_layer, "Ethernet") == 0;
    char gids[48];

    if (!p->gids_dir)
        snprintf(gids, sizeof(gids), "no gids directory");
    else if (p->gids == 0)
        snprintf(gids, sizeof(gids), "no GID (all zero)");
    else
        snprintf(gids, sizeof(gids), "%u GID%s", p->gids, p->gids == 1 ? "" : "s");
    snprintf(buf, len, "%.63s port %u: %.31s, %.31s%s%.31s%s, %s", v->name, p->num,
             p->state[0] ? p->state : "state unreadable", ll, p->netdev[0] ? " (" : "",
             p->netdev, p->netdev[0] ? ")" : "", gids);
    if (hint_len > 0)
        hint[0] = '\0';
    if (strcmp(p->state, "ACTIVE") != 0) {
        if (strcmp(p->state, "INIT") == 0 && !eth)
            snprintf(hint, hint_len, "the port has link but is not ACTIVE: an InfiniBand "
                     "port stays INIT until a subnet manager (opensm or the switch's) "
                     "configures it; leave it out of UCX_NET_DEVICES until then");
        else
            snprintf(hint, hint_len, "the port is not ACTIVE: transfers over it fail; check "
                     "the cable and the switch port (ibstat / ip link), or leave %.63s:%u "
                     "out of UCX_NET_DEVICES", v->name, p->num);
        return 1;
    }
    if (p->gids == 0) {
        if (eth)
            snprintf(hint, hint_len, "a RoCE port needs a GID, which comes from an IP "
                     "address on its network interface%s%.31s: configure one (RDMA "
                     "connections fail with no GID)", p->netdev[0] ? " " : "", p->netdev);
        else
            snprintf(hint, hint_len, "an ACTIVE InfiniBand port without a GID: check the "
                     "subnet manager and the driver (ibstat)");
        return 1;
    }
    return 0;
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
