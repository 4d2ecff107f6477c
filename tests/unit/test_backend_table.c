/* The backend table (src/core/backend_table.c): built-in backends, names,
 * lookups, parameters, availability reasons, probes, and module loading
 * (KVL_MODULE_PATH first; a file that is not a kvlane module is explained). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "core/internal.h"

static void test_builtins_and_names(void)
{
    const char *const *names = kvl_backend_names();
    size_t nb = 0;
    while (kvli_backend_builtin(nb) != NULL)
        nb++;
    KT_CHECK(nb >= 1 && strcmp(kvli_backend_builtin(0)->name, "shm") == 0);
    /* built-ins first, in their order, then the loadable modules */
    for (size_t i = 0; i < nb; i++) {
        const kvl_backend_ops_t *ops = kvli_backend_builtin(i);
        KT_CHECK(names[i] != NULL && strcmp(names[i], ops->name) == 0);
        KT_CHECK(ops->abi_version == KVL_BACKEND_ABI_VERSION);
        KT_CHECK(ops->size == sizeof(kvl_backend_ops_t));
        KT_CHECK(ops->close && ops->mem_reg && ops->xfer_post && ops->notif_send);
        KT_CHECK(kvli_backend_find(ops->name) == ops);
    }
    KT_CHECK(names[nb] != NULL && strcmp(names[nb], "ucx") == 0 && names[nb + 1] == NULL);
    KT_CHECK(kvl_backend_names() == names);

    KT_CHECK(kvli_backend_find("SHM") == kvli_backend_builtin(0));
    KT_CHECK(kvli_backend_find(NULL) == NULL);
    KT_CHECK(kvli_backend_find("") == NULL);
    KT_CHECK(kvli_backend_find("shm ") == NULL);
    KT_CHECK(kvli_backend_find("nope") == NULL);
}

static void test_params(void)
{
    const kvl_param_t *p = kvl_backend_params("shm");
    int found = 0;
    KT_CHECK(p != NULL);
    for (; p->key; p++)
        if (strcmp(p->key, "allow_uids") == 0)
            found = strcmp(p->value, "self") == 0;
    KT_CHECK(found);
    KT_CHECK(kvl_backend_params("Shm") == kvl_backend_params("shm"));
    KT_CHECK(kvl_backend_params("nope") == NULL && kvl_backend_params(NULL) == NULL);
}

static void test_available(void)
{
    char reason[512], want[512];
    memset(reason, 'x', sizeof(reason));
    KT_CHECK(kvl_backend_available("shm", reason, sizeof(reason)) == KVL_OK);
    KT_CHECK(reason[0] == '\0'); /* cleared when there is nothing to say */

    /* an unknown name: every name this build knows */
    snprintf(want, sizeof(want), "no backend named 'nope' in this build (known:");
    for (const char *const *n = kvl_backend_names(); *n; n++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), " %s", *n);
    strcat(want, ")");
    KT_CHECK(kvl_backend_available("nope", reason, sizeof(reason)) == KVL_ERR_NOT_FOUND);
    KT_CHECK(strcmp(reason, want) == 0);
    KT_CHECK(kvl_backend_available(NULL, reason, sizeof(reason)) == KVL_ERR_NOT_FOUND);
    KT_CHECK(strstr(reason, "no backend named '(null)'") == reason);
    /* bounded like snprintf */
    char small[10];
    KT_CHECK(kvl_backend_available("nope", small, sizeof(small)) == KVL_ERR_NOT_FOUND);
    KT_CHECK(strcmp(small, "no backen") == 0);
    KT_CHECK(kvl_backend_available("nope", small, 1) == KVL_ERR_NOT_FOUND && small[0] == '\0');
    KT_CHECK(kvl_backend_available("nope", NULL, 0) == KVL_ERR_NOT_FOUND);

    /* the ucx module: loaded from this build tree, or why not */
    const kvl_backend_ops_t *ucx = kvli_backend_find("ucx");
    kvl_status_t st = kvl_backend_available("ucx", reason, sizeof(reason));
    if (ucx != NULL) {
        KT_CHECK(strcmp(ucx->name, "ucx") == 0 && ucx->abi_version == KVL_BACKEND_ABI_VERSION);
        KT_CHECK(kvli_backend_find("UCX") == ucx);
        printf("ucx module loaded (available: %s)\n", kvl_status_name(st));
    } else {
        KT_CHECK(st == KVL_ERR_UNSUPPORTED && strstr(reason, "libkvlane-ucx.so") != NULL);
        printf("ucx module absent: %s\n", reason);
    }
}

static int g_probe_calls, g_probe_bad;
static void on_check(void *arg, const char *check, int status, const char *observed,
                     const char *hint)
{
    (void)observed;
    g_probe_calls++;
    if (arg != &g_probe_calls || check == NULL || check[0] == '\0' || status < 0 || status > 2 ||
        hint == NULL)
        g_probe_bad++;
}

static void test_probe(void)
{
    KT_CHECK(kvl_backend_probe("nope", on_check, NULL, KVL_MEM_DRAM, -1, 0) == KVL_ERR_NOT_FOUND);
    KT_CHECK(kvl_backend_probe("shm", NULL, NULL, KVL_MEM_DRAM, -1, 0) == KVL_ERR_NOT_FOUND);
    const kvl_backend_ops_t *shm = kvli_backend_find("shm");
    if (shm->probe == NULL)
        KT_CHECK(kvl_backend_probe("shm", on_check, &g_probe_calls, KVL_MEM_DRAM, -1, 0) ==
                 KVL_ERR_UNSUPPORTED);
    for (size_t i = 0; kvli_backend_builtin(i); i++) {
        const kvl_backend_ops_t *ops = kvli_backend_builtin(i);
        if (ops->probe == NULL)
            continue;
        g_probe_calls = g_probe_bad = 0;
        KT_OK(kvl_backend_probe(ops->name, on_check, &g_probe_calls, KVL_MEM_VRAM, 0, 1 << 20));
        KT_CHECK(g_probe_calls > 0 && g_probe_bad == 0);
        printf("probe %s: %d checks\n", ops->name, g_probe_calls);
    }
}

/* In a fresh child (modules are looked up once per process): what
 * kvl_backend_available("ucx") says with KVL_MODULE_PATH=path. */
static kvl_status_t ucx_with_path(const char *path, char *reason, size_t cap)
{
    int fds[2];
    KT_CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        char r[512];
        setenv("KVL_MODULE_PATH", path, 1);
        kvl_status_t st = kvl_backend_available("ucx", r, sizeof(r));
        if (write(fds[1], &st, sizeof(st)) < 0 || write(fds[1], r, strlen(r) + 1) < 0)
            _exit(99);
        _exit(0);
    }
    close(fds[1]);
    kvl_status_t st = KVL_ERR_INTERNAL;
    KT_CHECK(read(fds[0], &st, sizeof(st)) == (ssize_t)sizeof(st));
    ssize_t n = read(fds[0], reason, cap - 1);
    close(fds[0]);
    reason[n > 0 ? n : 0] = '\0';
    int status;
    KT_CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return st;
}

static void test_module_path(void)
{
    char dir[] = "/tmp/kvl-modpath-XXXXXX", sub[600], mod[700], reason[512];
    KT_CHECK(mkdtemp(dir) != NULL);
    snprintf(sub, sizeof(sub), "%s/bad", dir);
    KT_CHECK(mkdir(sub, 0700) == 0);

    /* not a shared object at all */
    snprintf(mod, sizeof(mod), "%s/libkvlane-ucx.so", sub);
    FILE *f = fopen(mod, "w");
    KT_CHECK(f != NULL);
    fputs("not an ELF file\n", f);
    fclose(f);
    char path[1400];
    snprintf(path, sizeof(path), "%s/empty:%s", dir, sub); /* the first has no module */
    KT_CHECK(ucx_with_path(path, reason, sizeof(reason)) == KVL_ERR_UNSUPPORTED);
    KT_CHECK(strstr(reason, "module ") == reason && strstr(reason, mod) != NULL);
    KT_CHECK(strstr(reason, "could not be loaded") != NULL);
    unlink(mod);

    /* a shared object that is not a kvlane module (the C library) */
    Dl_info info;
    KT_CHECK(dladdr((void *)&dladdr, &info) != 0 && info.dli_fname != NULL);
    KT_CHECK(symlink(info.dli_fname, mod) == 0);
    KT_CHECK(ucx_with_path(sub, reason, sizeof(reason)) == KVL_ERR_UNSUPPORTED);
    KT_CHECK(strstr(reason, "has no kvl_backend_module_v1 entry point (not a kvlane module?)"));
    unlink(mod);
    rmdir(sub);
    rmdir(dir);
}

int main(void)
{
    test_module_path(); /* first: its children must find no module looked up yet */
    test_builtins_and_names();
    test_params();
    test_available();
    test_probe();
    printf("test_backend_table: passed\n");
    return 0;
}
