/* Status codes: names, groups and short descriptions. */
#include "internal.h"

static const struct {
    kvl_status_t code;
    const char *name;
    const char *text;
} kvli_status_table[] = {
    {KVL_OK, "KVL_OK", "success"},
    {KVL_IN_PROGRESS, "KVL_IN_PROGRESS", "in progress"},
    {KVL_ERR_INVALID_ARG, "KVL_ERR_INVALID_ARG", "invalid argument"},
    {KVL_ERR_NOT_FOUND, "KVL_ERR_NOT_FOUND", "not found"},
    {KVL_ERR_IN_USE, "KVL_ERR_IN_USE", "in use by an in-flight transfer"},
    {KVL_ERR_EXISTS, "KVL_ERR_EXISTS", "already exists"},
    {KVL_ERR_OUT_OF_BOUNDS, "KVL_ERR_OUT_OF_BOUNDS", "outside registered memory"},
    {KVL_ERR_DEVICE_MISMATCH, "KVL_ERR_DEVICE_MISMATCH", "declared memory kind or device disagrees with the memory"},
    {KVL_ERR_STATE, "KVL_ERR_STATE", "not valid in the current state"},
    {KVL_ERR_CANCELED, "KVL_ERR_CANCELED", "cancelled"},
    {KVL_ERR_SYSTEM, "KVL_ERR_SYSTEM", "system call failed"},
    {KVL_ERR_NO_MEMORY, "KVL_ERR_NO_MEMORY", "out of memory"},
    {KVL_ERR_PERMISSION, "KVL_ERR_PERMISSION", "permission denied"},
    {KVL_ERR_TIMEOUT, "KVL_ERR_TIMEOUT", "timed out"},
    {KVL_ERR_NO_DEVICE, "KVL_ERR_NO_DEVICE", "device not present"},
    {KVL_ERR_REMOTE, "KVL_ERR_REMOTE", "remote agent failed"},
    {KVL_ERR_REMOTE_DISCONNECT, "KVL_ERR_REMOTE_DISCONNECT", "remote agent disconnected"},
    {KVL_ERR_REMOTE_REFUSED, "KVL_ERR_REMOTE_REFUSED", "remote agent refused the request"},
    {KVL_ERR_STALE, "KVL_ERR_STALE", "stale metadata"},
    {KVL_ERR_BAD_METADATA, "KVL_ERR_BAD_METADATA", "malformed metadata"},
    {KVL_ERR_REMOTE_FULL, "KVL_ERR_REMOTE_FULL", "remote agent's notification queue is full"},
    {KVL_ERR_UNSUPPORTED, "KVL_ERR_UNSUPPORTED", "not supported"},
    {KVL_ERR_NO_BACKEND, "KVL_ERR_NO_BACKEND", "no backend can serve this"},
    {KVL_ERR_INTERNAL, "KVL_ERR_INTERNAL", "internal error (a kvlane bug)"},
};

kvl_status_group_t kvl_status_group(kvl_status_t status)
{
    if (status >= 0)
        return KVL_GROUP_OK;
    int g = -(status / 100); /* divide first: -INT_MIN overflows */
    if (g < KVL_GROUP_USAGE || g > KVL_GROUP_INTERNAL)
        return KVL_GROUP_INTERNAL;
    return (kvl_status_group_t)g;
}

const char *kvl_status_name(kvl_status_t status)
{
    for (size_t i = 0; i < sizeof(kvli_status_table) / sizeof(kvli_status_table[0]); i++)
        if (kvli_status_table[i].code == status)
            return kvli_status_table[i].name;
    return "KVL_ERR_UNKNOWN";
}

const char *kvl_status_str(kvl_status_t status)
{
    for (size_t i = 0; i < sizeof(kvli_status_table) / sizeof(kvli_status_table[0]); i++)
        if (kvli_status_table[i].code == status)
            return kvli_status_table[i].text;
    return "unknown status";
}

const char *kvl_version(void)
{
    return "0.1.0";
}
