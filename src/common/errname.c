/* errno names for messages; see errname.h. */
#include <string.h>
#include "errname.h"

const char *kvli_errno_name(int e)
{
    const char *n = strerrorname_np(e);
    return n ? n : "errno";
}
