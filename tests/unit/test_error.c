/* Rendering errors: errno is formatted once (issue 17, item 8). */
#include <errno.h>
#include <string.h>
#include "common/kvltest.h"

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void render(kvl_status_t code, int e, const char *what, char *out, size_t cap)
{
    kvl_error_t err;
    memset(&err, 0, sizeof(err));
    err.code = code;
    err.sys_errno = e;
    err.device = -1;
    snprintf(err.what, sizeof(err.what), "%s", what);
    kvl_error_render(&err, out, cap);
    printf("%s\n", out);
}

int main(void)
{
    char out[2048];
    /* The message quotes the errno: no second copy. */
    render(KVL_ERR_SYSTEM, ENOENT, "open(/nope) = -1 ENOENT (No such file or directory)", out,
           sizeof(out));
    KT_CHECK(count(out, "No such file or directory") == 1);
    KT_CHECK(strstr(out, "errno 2") == NULL);
    /* Only the text quoted: still once. */
    render(KVL_ERR_SYSTEM, ECONNRESET, "recv(): Connection reset by peer", out, sizeof(out));
    KT_CHECK(count(out, "Connection reset by peer") == 1);
    /* Not quoted: appended once, with its number. */
    render(KVL_ERR_SYSTEM, EACCES, "cannot open the socket", out, sizeof(out));
    KT_CHECK(count(out, "Permission denied") == 1 && strstr(out, "(errno 13: ") != NULL);
    /* No errno: nothing appended, and no device claimed. */
    render(KVL_ERR_REMOTE_DISCONNECT, 0, "recv(reply) = 0 (connection closed by the peer)", out,
           sizeof(out));
    KT_CHECK(strstr(out, "errno") == NULL && strstr(out, "device") == NULL);
    printf("test_error: passed\n");
    return 0;
}
