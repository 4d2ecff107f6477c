/* kvlane bench --suite costs (bench_costs.c). */
#ifndef KVL_BENCH_COSTS_H
#define KVL_BENCH_COSTS_H

#include <stdint.h>
#include <sys/types.h>
#include <kvlane/kvlane.h>

typedef struct {
    kvl_agent_t *a;             /* the initiator, with lbase registered */
    const char *target;         /* the target agent's name */
    pid_t target_pid;           /* its process on this host, or -1 */
    uint64_t lbase, rbase, len; /* registered local and remote buffers, len bytes each */
    const char *const *bks;     /* backends to measure */
    int nbk;
    const char *bkall;          /* all of them, as given ("shm,tcp") */
} kvl_costs_ctx_t;

int kvl_bench_costs(const kvl_costs_ctx_t *c);

#endif
