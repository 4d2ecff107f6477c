/* Built-in backends, registered statically. */
#include <string.h>
#include <strings.h>
#include "internal.h"

extern const kvl_backend_ops_t kvli_shm_ops;

static const kvl_backend_ops_t *const kvli_builtin[] = {
    &kvli_shm_ops,
};

static const char *kvli_names[sizeof(kvli_builtin) / sizeof(kvli_builtin[0]) + 1];
static pthread_once_t kvli_names_once = PTHREAD_ONCE_INIT;

static void kvli_names_init(void)
{
    size_t i;
    for (i = 0; i < sizeof(kvli_builtin) / sizeof(kvli_builtin[0]); i++)
        kvli_names[i] = kvli_builtin[i]->name;
    kvli_names[i] = NULL;
}

const kvl_backend_ops_t *kvli_backend_find(const char *name)
{
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < sizeof(kvli_builtin) / sizeof(kvli_builtin[0]); i++)
        if (strcasecmp(kvli_builtin[i]->name, name) == 0)
            return kvli_builtin[i];
    return NULL;
}

const char *const *kvl_backend_names(void)
{
    pthread_once(&kvli_names_once, kvli_names_init);
    return kvli_names;
}

const kvl_param_t *kvl_backend_params(const char *name)
{
    const kvl_backend_ops_t *ops = kvli_backend_find(name);
    return ops ? ops->params : NULL;
}

kvl_status_t kvl_backend_available(const char *name, char *reason, size_t len)
{
    const kvl_backend_ops_t *ops = kvli_backend_find(name);
    if (reason && len)
        reason[0] = '\0';
    if (ops == NULL) {
        if (reason && len) {
            const char *const *n = kvl_backend_names();
            size_t off = (size_t)snprintf(reason, len, "no backend named '%s' in this build (known:",
                                          name ? name : "(null)");
            for (; *n && off < len; n++)
                off += (size_t)snprintf(reason + off, len - off, " %s", *n);
            if (off < len)
                snprintf(reason + off, len - off, ")");
        }
        return KVL_ERR_NOT_FOUND;
    }
    if (ops->available == NULL)
        return KVL_OK;
    return ops->available(reason, len);
}
