/* A real etcd (Debian's etcd-server) for tests: temporary data dir, free ports. */
#ifndef KT_ETCD_H
#define KT_ETCD_H

#include <sys/types.h>

typedef struct kt_etcd {
    pid_t pid;
    char dir[128];
    unsigned client_port, peer_port;
    char url[64];             /* http://127.0.0.1:<client_port> */
    const char *host;         /* listen address, "127.0.0.1" unless set */
    /* Set before kt_etcd_start: serve https with the files kt_tls_certs made
     * there (server.crt/.key), requiring client certificates signed by its
     * ca.crt; url is then https://..., health is asked with etcdctl. */
    const char *tls_dir;
} kt_etcd_t;

/* Make throwaway TLS files in dir (tests/common/kt_tls_certs.sh: ca, server
 * with SAN IP 127.0.0.1 only, client, otherca, stranger): 0 when made. */
int kt_tls_certs(const char *dir);

/* The etcd binary, or NULL (tests skip with the reason). */
const char *kt_etcd_binary(void);
/* A TCP port nothing listens on now (bound then closed). */
unsigned kt_free_port(void);
/* Start etcd (new data dir, free ports); waits until it answers (bounded: fails the test). */
void kt_etcd_start(kt_etcd_t *e);
/* Start again on the same data dir and ports (after kt_etcd_kill). */
void kt_etcd_restart(kt_etcd_t *e);
/* SIGKILL and reap (the data dir stays). */
void kt_etcd_kill(kt_etcd_t *e);
/* SIGSTOP / SIGCONT. */
void kt_etcd_pause(kt_etcd_t *e, int paused);
/* Kill and remove the data dir. */
void kt_etcd_stop(kt_etcd_t *e);
/* Run etcdctl against it (with the client certificate when tls_dir) with args (space-separated); returns the exit status. */
int kt_etcdctl(const kt_etcd_t *e, const char *args);
/* The value of key (etcdctl get --print-value-only; json: the whole answer
 * as JSON, the value in base64 and the key's revisions) into out, its last
 * newline cut: 0, or -1 when etcdctl failed or printed nothing. */
int kt_etcd_get(const kt_etcd_t *e, const char *key, int json, char *out, size_t cap);
/* Compact etcd's history up to its current revision: 0 when done. */
int kt_etcd_compact(const kt_etcd_t *e);

#endif
