/* Logging (src/core/log.c): KVL_LOG_LEVEL parsing, level clamping and
 * filtering, the callback and the stderr format. */
#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common/kvltest.h"
#include "core/internal.h"

/* The level a fresh process starts with under KVL_LOG_LEVEL=value (NULL:
 * unset); what it printed to stderr goes to err. The environment is read
 * once per process, so each value gets a child of its own. */
static int level_from_env(const char *value, char *err, size_t cap)
{
    int fds[2];
    KT_CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    KT_CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        if (value)
            setenv("KVL_LOG_LEVEL", value, 1);
        else
            unsetenv("KVL_LOG_LEVEL");
        _exit(kvl_log_get_level() + 1);
    }
    close(fds[1]);
    ssize_t n, got = 0;
    while (got + 1 < (ssize_t)cap && (n = read(fds[0], err + got, cap - 1 - (size_t)got)) > 0)
        got += n;
    err[got] = '\0';
    close(fds[0]);
    int status;
    KT_CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
    return WEXITSTATUS(status) - 1;
}

static void test_env(void)
{
    static const struct {
        const char *value;
        int level;
    } cases[] = {
        {"off", KVL_LOG_OFF},     {"none", KVL_LOG_OFF},    {"OFF", KVL_LOG_OFF},
        {"error", KVL_LOG_ERROR}, {"warn", KVL_LOG_WARN},   {"info", KVL_LOG_INFO},
        {"Debug", KVL_LOG_DEBUG}, {"TRACE", KVL_LOG_TRACE}, {"", KVL_LOG_WARN},
        {NULL, KVL_LOG_WARN},
    };
    char err[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = level_from_env(cases[i].value, err, sizeof(err));
        if (got != cases[i].level)
            fprintf(stderr, "KVL_LOG_LEVEL=%s gave %d\n", cases[i].value, got);
        KT_CHECK(got == cases[i].level && err[0] == '\0');
    }
    /* a value it does not know: the default, and it says so once */
    KT_CHECK(level_from_env("verbose", err, sizeof(err)) == KVL_LOG_WARN);
    KT_CHECK(strcmp(err, "kvlane [warn] core: KVL_LOG_LEVEL='verbose' is not one of "
                         "off|error|warn|info|debug|trace; keeping 'warn'\n") == 0);
    KT_CHECK(level_from_env("warning", err, sizeof(err)) == KVL_LOG_WARN && err[0] != '\0');
}

typedef struct {
    int calls;
    kvl_log_level_t level;
    char component[32];
    char msg[4096];
} seen_t;

static void on_log(kvl_log_level_t level, const char *component, const char *message, void *arg)
{
    seen_t *s = arg;
    s->calls++;
    s->level = level;
    kvli_scopy(s->component, sizeof(s->component), component);
    kvli_scopy(s->msg, sizeof(s->msg), message);
}

static void test_levels_and_callback(void)
{
    seen_t s = {0};
    kvl_log_set_callback(on_log, &s);

    kvl_log_set_level(KVL_LOG_INFO);
    KT_CHECK(kvl_log_get_level() == KVL_LOG_INFO);
    KT_CHECK(kvli_log_enabled(KVL_LOG_ERROR) && kvli_log_enabled(KVL_LOG_INFO));
    KT_CHECK(!kvli_log_enabled(KVL_LOG_DEBUG));
    kvli_log(KVL_LOG_INFO, "shm", "peer %s at pid %d", "p", 42);
    KT_CHECK(s.calls == 1 && s.level == KVL_LOG_INFO);
    KT_CHECK(strcmp(s.component, "shm") == 0 && strcmp(s.msg, "peer p at pid 42") == 0);
    kvli_log(KVL_LOG_DEBUG, "shm", "too detailed");
    kvli_debug("too detailed too");
    KT_CHECK(s.calls == 1);
    kvli_warn("a %s", "warning");
    KT_CHECK(s.calls == 2 && s.level == KVL_LOG_WARN && strcmp(s.component, "core") == 0);

    /* out-of-range levels are clamped */
    kvl_log_set_level((kvl_log_level_t)99);
    KT_CHECK(kvl_log_get_level() == KVL_LOG_TRACE);
    kvli_log(KVL_LOG_TRACE, "tcp", "traced");
    KT_CHECK(s.calls == 3 && s.level == KVL_LOG_TRACE);
    kvli_log((kvl_log_level_t)5, "tcp", "beyond trace"); /* no such level: dropped */
    KT_CHECK(s.calls == 3);
    kvl_log_set_level((kvl_log_level_t)-7);
    KT_CHECK(kvl_log_get_level() == KVL_LOG_OFF);
    /* off means off, errors included */
    kvli_log(KVL_LOG_ERROR, "core", "an error");
    KT_CHECK(s.calls == 3 && !kvli_log_enabled(KVL_LOG_ERROR));
    kvl_log_set_level(KVL_LOG_ERROR);
    kvli_log(KVL_LOG_OFF, "core", "level off is not a message level");
    KT_CHECK(s.calls == 3);

    /* long messages are cut, still terminated */
    char big[3000];
    memset(big, 'm', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    kvli_log(KVL_LOG_ERROR, "core", "%s", big);
    KT_CHECK(s.calls == 4 && strlen(s.msg) == 2047 && s.msg[0] == 'm');
    kvl_log_set_callback(NULL, NULL);
}

/* Without a callback: one line per message on stderr. */
static void test_stderr(void)
{
    int fds[2], saved = dup(2);
    KT_CHECK(pipe(fds) == 0 && saved >= 0);
    fflush(stderr);
    dup2(fds[1], 2);
    kvl_log_set_level(KVL_LOG_DEBUG);
    kvli_log(KVL_LOG_WARN, "tcp", "slow peer %d", 3);
    kvli_log(KVL_LOG_DEBUG, "core", "detail");
    kvli_log(KVL_LOG_TRACE, "core", "not shown");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fds[1]);
    char out[512];
    ssize_t n = read(fds[0], out, sizeof(out) - 1);
    close(fds[0]);
    KT_CHECK(n > 0);
    out[n] = '\0';
    KT_CHECK(strcmp(out, "kvlane [warn] tcp: slow peer 3\nkvlane [debug] core: detail\n") == 0);
    kvl_log_set_level(KVL_LOG_WARN);
}

int main(void)
{
    test_env(); /* first: this process must not have read the environment yet */
    test_levels_and_callback();
    test_stderr();
    printf("test_log: passed\n");
    return 0;
}
