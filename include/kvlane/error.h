/* kvlane: structured errors. */
#ifndef KVLANE_ERROR_H
#define KVLANE_ERROR_H

#include <stddef.h>
#include <stdint.h>
#include <kvlane/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVL_ERROR_MAX_CAUSES 16
#define KVL_NAME_MAX 64

/* One cause of an error: typically one backend's or one region's reason. */
typedef struct kvl_error_cause {
    kvl_status_t code;
    int sys_errno;                 /* errno of the failed system call, 0 if none */
    char backend[KVL_NAME_MAX];    /* "" when not about a backend */
    int device;                    /* -1 when not about a device */
    char what[1024];               /* the exact call that failed and its result */
    char hint[1024];               /* what to check or do */
} kvl_error_cause_t;

/*
 * A failure, filled once by the function that decided it and passed up
 * unchanged. All strings are NUL terminated; empty when not applicable.
 */
typedef struct kvl_error {
    kvl_status_t code;
    int sys_errno;
    char backend[KVL_NAME_MAX];
    int device;                    /* -1 when not about a device */
    char agent[KVL_NAME_MAX];      /* remote agent involved, "" if none */
    char region[128];              /* region/descriptor involved, "" if none */
    char what[1024];               /* sized so that no diagnosis is cut */
    char hint[1024];
    unsigned n_causes;
    unsigned n_causes_dropped;     /* causes beyond KVL_ERROR_MAX_CAUSES */
    kvl_error_cause_t causes[KVL_ERROR_MAX_CAUSES];
} kvl_error_t;

/*
 * The last error of the calling thread (any agent). Never NULL; code is
 * KVL_OK when the thread has seen no failure. Valid until the thread's next
 * kvlane call.
 */
const kvl_error_t *kvl_last_error(void);

/* Clear the calling thread's last error. */
void kvl_error_clear(void);

/*
 * Render an error as readable, multi-line text (no trailing newline).
 * Writes at most len bytes including the NUL; returns the length the full
 * text needs (like snprintf). err may be NULL (renders the thread's last).
 */
size_t kvl_error_render(const kvl_error_t *err, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
