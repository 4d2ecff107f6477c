/* kvlane command-line tool. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <kvlane/kvlane.h>
#include "cli.h"

static void kvl_cli_usage(FILE *f)
{
    fprintf(f,
            "usage: kvlane <command> [options]\n"
            "\n"
            "commands:\n"
            "  demo       a prefill process writes a KV cache into a decode process, which\n"
            "             verifies every byte (kvlane demo --help)\n"
            "  doctor     preflight checks and smoke tests before the engine starts\n"
            "             (kvlane doctor --help)\n"
            "  bench      throughput and latency per backend, block size and pattern\n"
            "             (kvlane bench --help)\n"
            "  backends   list the backends of this build and whether they can run here\n"
            "  version    print the version\n");
}

static int kvl_cli_backends(void)
{
    for (const char *const *n = kvl_backend_names(); *n; n++) {
        char reason[512];
        kvl_status_t st = kvl_backend_available(*n, reason, sizeof(reason));
        printf("%-6s %s%s%s\n", *n, st == KVL_OK ? "available" : "unavailable",
               reason[0] ? ": " : "", reason);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        kvl_cli_usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "demo") == 0)
        return kvl_cli_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return kvl_cli_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "doctor") == 0)
        return kvl_cli_doctor(argc - 1, argv + 1);
    if (strcmp(cmd, "backends") == 0)
        return kvl_cli_backends();
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kvlane %s\n", kvl_version());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        kvl_cli_usage(stdout);
        return 0;
    }
    fprintf(stderr, "kvlane: unknown command '%s'\n", cmd);
    kvl_cli_usage(stderr);
    return 2;
}
