/* The symbolic name of an errno value ("EPERM"), for messages that quote the
 * exact failed call. */
#ifndef KVLI_ERRNAME_H
#define KVLI_ERRNAME_H

const char *kvli_errno_name(int e);

#endif
