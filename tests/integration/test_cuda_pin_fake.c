/*
 * cuda backend, pinning registered host memory (pin_host), without a GPU:
 * the stand-in driver (tests/fakes/fake_gpu.c, named by KVL_CUDA_DRIVER)
 * keeps the page-locked host ranges, can fail cuMemHostRegister and can
 * hold it at a gate. Checked, through the public calls:
 *  - auto (the default): the registration returns before the pin (the
 *    report says it happens in the background), the pin lands, and
 *    deregistration unpins;
 *  - a region still queued when it is deregistered is never pinned;
 *  - memory page-locked already is neither pinned nor unlocked;
 *  - a region being pinned when it is deregistered is waited for and
 *    unpinned: nothing this backend locked stays locked after the
 *    deregistration returns;
 *  - 1,000 regions in one call, then deregistered in one call; an agent
 *    destroyed with regions still queued;
 *  - sync pins in the registering call, off never pins, a failed pin is a
 *    warning naming the range, a bad value is refused naming the choices.
 * The invariants hold whatever order the threads run in: no assertion
 * depends on timing.
 * KVL_TEST_LABELS: tsan
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/kvltest.h"

enum { H_CALLS, H_PINNED, H_UNPINNED, H_WAITING, H_LIVE, H_N };
enum { RLEN = 1 << 20, MANY = 1000, MANY_LEN = 4096 };

static int (*fake_hostreg)(long *, const void *);
static void (*fake_gate)(int);
static int (*fake_lock)(void *, size_t, unsigned);  /* cuMemHostRegister itself */
static int (*fake_unlock)(void *);                  /* cuMemHostUnregister */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char warned[1024];

static void on_log(kvl_log_level_t level, const char *component, const char *message, void *arg)
{
    (void)arg;
    if (level != KVL_LOG_WARN || strcmp(component, "cuda") != 0)
        return;
    pthread_mutex_lock(&log_lock);
    snprintf(warned, sizeof(warned), "%s", message);
    pthread_mutex_unlock(&log_lock);
}

static int pinned(const void *p, long *h)
{
    long tmp[H_N];
    return fake_hostreg(h ? h : tmp, p);
}

/* Wait (bounded: 60 s, then fail) until what() holds. */
static void await(int (*what)(const void *), const void *arg, const char *label)
{
    for (int i = 0; i < 60000 && !what(arg); i++)
        usleep(1000);
    if (!what(arg)) {
        fprintf(stderr, "still not %s after 60 s\n", label);
        KT_CHECK(0);
    }
}

static int is_pinned(const void *p) { return pinned(p, NULL); }
static int at_gate(const void *n)
{
    long h[H_N];
    pinned(NULL, h);
    return h[H_WAITING] >= *(const long *)n;
}

static kvl_agent_t *agent(const char *pin)
{
    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    kvl_agent_t *a = NULL;
    KT_OK(kvl_agent_create("cuda-pin-fake", &cfg, &a));
    kvl_param_t prm[] = {{"pin_host", pin}};
    KT_OK(kvl_backend_create(a, "cuda", prm, pin ? 1 : 0, NULL));
    return a;
}

/* Register [p, p+len) as DRAM with the cuda backend; its detail in det. */
static void reg(kvl_agent_t *a, void *p, size_t len, char *det, size_t cap)
{
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)p, len, 0};
    kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_DRAM};
    kvl_reg_report_t *rep = NULL;
    KT_OK(kvl_mem_register(a, &d, 1, &rp, &rep));
    KT_CHECK(rep != NULL && rep->n_entries == 1 && rep->entries[0].n_outcomes == 1);
    KT_CHECK(strcmp(rep->entries[0].outcomes[0].backend, "cuda") == 0);
    snprintf(det, cap, "%s", rep->entries[0].outcomes[0].detail);
    kvl_reg_report_free(rep);
}

static void dereg(kvl_agent_t *a, void *p, size_t len)
{
    kvl_mem_desc_t d = {(uint64_t)(uintptr_t)p, len, 0};
    KT_OK(kvl_mem_deregister(a, &d, 1));
}

static void *buf(size_t len)
{
    void *p = NULL;
    KT_CHECK(posix_memalign(&p, 4096, len) == 0);
    memset(p, 0x5a, len);
    return p;
}

static void background(void)
{
    char det[2100];
    long h0[H_N], h1[H_N];
    kvl_agent_t *a = agent(NULL); /* the default: auto */
    unsigned char *p = buf(RLEN);
    pinned(NULL, h0);
    reg(a, p, RLEN, det, sizeof(det));
    printf("auto: %s\n", det);
    KT_CHECK(strstr(det, "in the background") != NULL);
    await(is_pinned, p, "pinned");
    await(is_pinned, p + RLEN - 1, "pinned to its end");
    dereg(a, p, RLEN);
    KT_CHECK(!pinned(p, h1));
    KT_CHECK(h1[H_PINNED] - h0[H_PINNED] == 1 && h1[H_UNPINNED] - h0[H_UNPINNED] == 1);
    kvl_agent_destroy(a);
    free(p);
}

typedef struct {
    kvl_agent_t *a;
    void *p;
} job_t;

static void *dereg_main(void *arg)
{
    job_t *j = arg;
    dereg(j->a, j->p, RLEN);
    return NULL;
}

static void gate(void)
{
    char det[2100];
    long h0[H_N], h1[H_N], one = 1;
    kvl_agent_t *a = agent("auto");
    unsigned char *x = buf(RLEN), *y = buf(RLEN);
    pinned(NULL, h0);
    fake_gate(1);
    reg(a, x, RLEN, det, sizeof(det));
    await(at_gate, &one, "at the gate"); /* x is being pinned */
    reg(a, y, RLEN, det, sizeof(det));   /* y waits in the queue behind it */
    dereg(a, y, RLEN);                   /* taken out of the queue */
    job_t j = {a, x};
    pthread_t t;
    KT_CHECK(pthread_create(&t, NULL, dereg_main, &j) == 0);
    /* Whether the deregistration waits at the gate or comes after the pin,
     * x must be unlocked once it returns. */
    usleep(20000);
    fake_gate(0);
    KT_CHECK(pthread_join(t, NULL) == 0);
    KT_CHECK(!pinned(x, h1) && !pinned(y, NULL));
    printf("gate: %ld cuMemHostRegister call(s), %ld pinned, %ld unpinned\n",
           h1[H_CALLS] - h0[H_CALLS], h1[H_PINNED] - h0[H_PINNED],
           h1[H_UNPINNED] - h0[H_UNPINNED]);
    KT_CHECK(h1[H_CALLS] - h0[H_CALLS] == 1); /* y's pin never ran */
    KT_CHECK(h1[H_PINNED] - h0[H_PINNED] == 1 && h1[H_UNPINNED] - h0[H_UNPINNED] == 1);
    kvl_agent_destroy(a);
    free(x);
    free(y);
}

/* Memory page-locked by someone else (cudaHostAlloc; here the stand-in's
 * cuMemHostRegister called directly) is neither pinned again nor unlocked
 * by the deregistration. */
static void foreign(void)
{
    char det[2100];
    long h0[H_N], h1[H_N];
    unsigned char *p = buf(RLEN), *q = buf(RLEN);
    KT_CHECK(fake_lock(p, RLEN, 0) == 0);
    kvl_agent_t *a = agent("auto");
    pinned(NULL, h0);
    reg(a, p, RLEN, det, sizeof(det));
    reg(a, q, RLEN, det, sizeof(det));
    await(is_pinned, q, "pinned"); /* one thread, in order: p was looked at first */
    pinned(NULL, h1);
    KT_CHECK(h1[H_CALLS] - h0[H_CALLS] == 1); /* q only */
    dereg(a, p, RLEN);
    KT_CHECK(pinned(p, NULL)); /* still the owner's */
    dereg(a, q, RLEN);
    KT_CHECK(!pinned(q, NULL));
    printf("page-locked already: left alone, still locked after its deregistration\n");
    kvl_agent_destroy(a);
    KT_CHECK(fake_unlock(p) == 0);
    free(p);
    free(q);
}

static void many(void)
{
    long h0[H_N], h1[H_N];
    kvl_mem_desc_t *d = calloc(MANY, sizeof(*d));
    unsigned char *p = buf((size_t)MANY * MANY_LEN);
    KT_CHECK(d != NULL);
    for (int i = 0; i < MANY; i++)
        d[i] = (kvl_mem_desc_t){(uint64_t)(uintptr_t)(p + (size_t)i * MANY_LEN), MANY_LEN, 0};
    kvl_reg_params_t rp = {.field_mask = KVL_REG_PARAM_KIND, .kind = KVL_MEM_DRAM};
    for (int round = 0; round < 2; round++) {
        kvl_agent_t *a = agent("auto");
        pinned(NULL, h0);
        KT_OK(kvl_mem_register(a, d, MANY, &rp, NULL));
        if (round == 0) {
            /* every one pinned, then all deregistered in one call */
            await(is_pinned, p + (size_t)(MANY - 1) * MANY_LEN, "the last pinned");
            KT_OK(kvl_mem_deregister(a, d, MANY));
        }
        kvl_agent_destroy(a); /* round 1: deregisters what is still queued */
        pinned(NULL, h1);
        printf("%d regions, %s: %ld pinned, %ld unpinned, %ld locked now\n", MANY,
               round ? "agent destroyed at once" : "deregistered in one call",
               h1[H_PINNED] - h0[H_PINNED], h1[H_UNPINNED] - h0[H_UNPINNED], h1[H_LIVE]);
        if (round == 0)
            KT_CHECK(h1[H_PINNED] - h0[H_PINNED] == MANY);
        KT_CHECK(h1[H_PINNED] - h0[H_PINNED] == h1[H_UNPINNED] - h0[H_UNPINNED]);
        KT_CHECK(h1[H_LIVE] == 0);
    }
    free(d);
    free(p);
}

static void modes(void)
{
    char det[2100];
    kvl_agent_t *a = agent("sync");
    unsigned char *p = buf(RLEN);
    reg(a, p, RLEN, det, sizeof(det));
    printf("sync: %s\n", det);
    KT_CHECK(strcmp(det, "host memory pinned with cuMemHostRegister") == 0);
    KT_CHECK(pinned(p, NULL)); /* already, when the call returned */
    dereg(a, p, RLEN);
    KT_CHECK(!pinned(p, NULL));
    kvl_agent_destroy(a);

    a = agent("off");
    reg(a, p, RLEN, det, sizeof(det));
    printf("off: %s\n", det);
    KT_CHECK(strstr(det, "pin_host=off") != NULL);
    dereg(a, p, RLEN);
    kvl_agent_destroy(a);

    /* A failed pin in the background: a warning names the range. */
    KT_CHECK(setenv("KVL_FAKE_CUFILE", "hostreg_fail", 1) == 0);
    long h0[H_N], h1[H_N];
    a = agent("auto");
    pinned(NULL, h0);
    reg(a, p, RLEN, det, sizeof(det));
    for (int i = 0; i < 60000; i++) {
        pinned(NULL, h1);
        pthread_mutex_lock(&log_lock);
        int seen = warned[0] != 0;
        pthread_mutex_unlock(&log_lock);
        if (seen && h1[H_CALLS] - h0[H_CALLS] >= 1)
            break;
        usleep(1000);
    }
    pthread_mutex_lock(&log_lock);
    printf("failed pin: %s\n", warned);
    char want[64];
    snprintf(want, sizeof(want), "cuMemHostRegister(%p, %d) = ", (void *)p, RLEN);
    KT_CHECK(strstr(warned, want) != NULL && strstr(warned, "staged by the driver") != NULL);
    pthread_mutex_unlock(&log_lock);
    dereg(a, p, RLEN);
    KT_CHECK(!pinned(p, NULL));
    kvl_agent_destroy(a);
    KT_CHECK(unsetenv("KVL_FAKE_CUFILE") == 0);

    kvl_agent_config_t cfg = {.field_mask = KVL_AGENT_CFG_BACKENDS, .create_backends = ""};
    KT_OK(kvl_agent_create("cuda-pin-bad", &cfg, &a));
    kvl_param_t bad[] = {{"pin_host", "lazy"}};
    KT_STATUS(kvl_backend_create(a, "cuda", bad, 1, NULL), KVL_ERR_INVALID_ARG);
    printf("bad value: %s\n", kvl_last_error()->what);
    KT_CHECK(strstr(kvl_last_error()->what, "is not one of auto, sync, off") != NULL);
    kvl_agent_destroy(a);
    free(p);
}

int main(void)
{
    const char *b = getenv("KVL_BUILD");
    char lib[600];
    snprintf(lib, sizeof(lib), "%s/tests/libkvl_fake_gpu.so", b && b[0] ? b : ".");
    if (access(lib, R_OK) != 0)
        KT_SKIP("the fake driver %s is not built (%s)", lib, strerror(errno));
    KT_CHECK(setenv("KVL_CUDA_DRIVER", lib, 1) == 0); /* read when kvlane first needs it */
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    KT_CHECK(h != NULL);
    *(void **)&fake_hostreg = dlsym(h, "kvl_fake_gpu_hostreg");
    *(void **)&fake_gate = dlsym(h, "kvl_fake_gpu_gate");
    *(void **)&fake_lock = dlsym(h, "cuMemHostRegister_v2");
    *(void **)&fake_unlock = dlsym(h, "cuMemHostUnregister");
    KT_CHECK(fake_hostreg != NULL && fake_gate != NULL && fake_lock != NULL && fake_unlock);
    kvl_log_set_callback(on_log, NULL);
    background();
    gate();
    foreign();
    many();
    modes();
    printf("test_cuda_pin_fake: ok\n");
    return 0;
}
