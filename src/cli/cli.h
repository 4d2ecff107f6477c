/* kvlane command-line tool: subcommands. */
#ifndef KVL_CLI_H
#define KVL_CLI_H

#include <stddef.h>
#include <stdint.h>

int kvl_cli_demo(int argc, char **argv);
int kvl_cli_doctor(int argc, char **argv);
int kvl_cli_bench(int argc, char **argv);

/* Helpers shared by subcommands (cli_util.c). */
int kvl_cli_parse_size(const char *s, uint64_t *out);
/* A comma-separated list split in place into buf (cap bytes): at most max
 * items, none empty; the count, or -1 with why ("has an empty entry", ...)
 * for a list that cannot be read whole. */
int kvl_cli_split(const char *s, char *buf, size_t cap, char **items, int max, char *why,
                  size_t wlen);
/* A plain decimal of digits only, at most `most` (a port, a device
 * ordinal): no sign, space, suffix or wrap. 0 ok, -1 refused. */
int kvl_cli_parse_uint(const char *s, uint64_t most, uint64_t *out);
void kvl_cli_print_error(const char *what);
int kvl_cli_write_all(int fd, const void *buf, size_t len);
/* Read exactly len bytes within timeout_ms; 0 ok, -1 error/timeout. */
int kvl_cli_read_all(int fd, void *buf, size_t len, int timeout_ms);
double kvl_cli_now(void);
/* qsort comparison of doubles, ascending. */
int kvl_cli_cmp_double(const void *a, const void *b);
/* GPU memory through the CUDA driver loaded at run time (cli_gpu.c); -1 with
 * why filled when there is no driver or GPU. */
int kvl_cli_gpu_alloc(int dev, size_t size, uint64_t *ptr_p, char *why, size_t len);
void kvl_cli_gpu_free(int dev, uint64_t ptr);
int kvl_cli_gpu_copy(int dev, int to_gpu, uint64_t gpu, void *host, size_t size, char *why,
                     size_t len);

#endif
