/* gpuipcctl: shared state of the subcommands. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "gpuipc.h"
#include "internal.h"

/* Exit codes (documented in `gpuipcctl --help`). */
enum {
        CTL_OK = 0,
        CTL_FAILED = 1,      /* the operation failed or the data did not verify */
        CTL_USAGE = 2,
        CTL_NO_BROKER = 3,   /* nothing answered on the socket */
};

typedef struct Ctl {
        const char *socket;
        bool json;
        int timeout_ms;
        gpuipc_t *c;
} Ctl;

/* Connects (once); prints why it could not. 0 or a CTL_* exit code. */
int ctl_connect(Ctl *ctl, bool probe_gpus);

/* Prints "gpuipcctl: what: <error text>: <broker's message>" to stderr and returns CTL_FAILED. */
int ctl_fail(Ctl *ctl, const char *what, int err);

/* Parses "4096", "64K", "2M", "1G" (binary multiples). 0 or -EINVAL. */
int ctl_parse_size(const char *s, uint64_t *ret);
int ctl_parse_int(const char *s, long min, long max, long *ret);

/* Subcommands: argc/argv start at the subcommand's own name. */
int cmd_ping(Ctl *ctl, int argc, char **argv);
int cmd_ls(Ctl *ctl, int argc, char **argv);
int cmd_stat(Ctl *ctl, int argc, char **argv);
int cmd_peers(Ctl *ctl, int argc, char **argv);
int cmd_stats(Ctl *ctl, int argc, char **argv);
int cmd_metrics(Ctl *ctl, int argc, char **argv);
int cmd_publish(Ctl *ctl, int argc, char **argv);
int cmd_attach(Ctl *ctl, int argc, char **argv);
int cmd_retire(Ctl *ctl, int argc, char **argv);
int cmd_watch(Ctl *ctl, int argc, char **argv);
int cmd_group(Ctl *ctl, int argc, char **argv);
int cmd_doctor(Ctl *ctl, int argc, char **argv);
