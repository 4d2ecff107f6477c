/* kvlane: logging. */
#ifndef KVLANE_LOG_H
#define KVLANE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVL_LOG_OFF = -1,
    KVL_LOG_ERROR = 0,
    KVL_LOG_WARN = 1,
    KVL_LOG_INFO = 2,
    KVL_LOG_DEBUG = 3,
    KVL_LOG_TRACE = 4
} kvl_log_level_t;

/*
 * Receives every message at or above the level. component is e.g. "core",
 * "shm". The message has no trailing newline. Called from any kvlane
 * thread, so it must be thread-safe.
 */
typedef void (*kvl_log_cb_t)(kvl_log_level_t level, const char *component,
                             const char *message, void *arg);

/*
 * The level starts from the environment variable KVL_LOG_LEVEL
 * (off|error|warn|info|debug|trace, default warn). Messages go to stderr
 * until a callback is installed; cb NULL restores stderr.
 */
void kvl_log_set_level(kvl_log_level_t level);
kvl_log_level_t kvl_log_get_level(void);
void kvl_log_set_callback(kvl_log_cb_t cb, void *arg);

#ifdef __cplusplus
}
#endif
#endif
