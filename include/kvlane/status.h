/* kvlane: status codes. Every call returns a kvl_status_t. */
#ifndef KVLANE_STATUS_H
#define KVLANE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/*
 * 0 is success, 1 means "still in progress", negative values are errors.
 * Errors are grouped by whose fault they are; the hundreds digit names the
 * group, so kvl_status_group() is a division.
 */
typedef int kvl_status_t;

enum {
    KVL_OK = 0,
    KVL_IN_PROGRESS = 1,

    /* -1xx: the caller used the API wrongly or passed bad values */
    KVL_ERR_INVALID_ARG = -100,   /* NULL, zero length, overflow, bad enum */
    KVL_ERR_NOT_FOUND = -101,     /* unknown agent, region, backend, handle */
    KVL_ERR_IN_USE = -102,        /* region used by an in-flight transfer */
    KVL_ERR_EXISTS = -103,        /* already loaded / already created */
    KVL_ERR_OUT_OF_BOUNDS = -104, /* descriptor outside registered memory */
    KVL_ERR_DEVICE_MISMATCH = -105, /* declared device/kind disagrees with memory */
    KVL_ERR_STATE = -106,         /* call not valid in the object's state */
    KVL_ERR_CANCELED = -107,      /* the transfer was cancelled by the caller */

    /* -2xx: the system refused (kernel, limits, permissions, resources) */
    KVL_ERR_SYSTEM = -200,
    KVL_ERR_NO_MEMORY = -201,
    KVL_ERR_PERMISSION = -202,
    KVL_ERR_TIMEOUT = -203,
    KVL_ERR_NO_DEVICE = -204,

    /* -3xx: the remote side failed or sent something unacceptable */
    KVL_ERR_REMOTE = -300,
    KVL_ERR_REMOTE_DISCONNECT = -301,
    KVL_ERR_REMOTE_REFUSED = -302,
    KVL_ERR_STALE = -303,         /* metadata from an older incarnation/generation */
    KVL_ERR_BAD_METADATA = -304,  /* malformed, truncated, corrupted blob */
    KVL_ERR_REMOTE_FULL = -305,   /* the remote's notification queue is full */

    /* -4xx: not supported here (build, backend, memory kind, hardware) */
    KVL_ERR_UNSUPPORTED = -400,
    KVL_ERR_NO_BACKEND = -401,    /* no backend can serve this memory/peer */

    /* -5xx: a bug in kvlane */
    KVL_ERR_INTERNAL = -500
};

typedef enum {
    KVL_GROUP_OK = 0,
    KVL_GROUP_USAGE = 1,
    KVL_GROUP_SYSTEM = 2,
    KVL_GROUP_REMOTE = 3,
    KVL_GROUP_UNSUPPORTED = 4,
    KVL_GROUP_INTERNAL = 5
} kvl_status_group_t;

/* Which group a status belongs to (KVL_GROUP_OK for 0 and 1). */
kvl_status_group_t kvl_status_group(kvl_status_t status);

/* Constant name, e.g. "KVL_ERR_OUT_OF_BOUNDS"; never NULL. */
const char *kvl_status_name(kvl_status_t status);

/* Short human description; never NULL. */
const char *kvl_status_str(kvl_status_t status);

#ifdef __cplusplus
}
#endif
#endif
