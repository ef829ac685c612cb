/* gpuipcctl: what the subcommands share: the global options, the broker connection, exit codes,
 * help texts, and value parsing whose errors name the value. gpuipcctl is a client of libgpuipc's
 * public API (gpuipc.h) and of nothing else in the tree: it must never include the library's
 * internals or the protocol, so that it links against the installed libgpuipc.so.0. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gpuipc.h"

/* Exit codes (documented in `gpuipcctl --help` and the man page). */
enum {
        CTL_CONTINUE = -1, /* (internal) options parsed: go on */
        CTL_OK = 0,
        CTL_FAILED = 1,    /* the operation failed or the data did not verify */
        CTL_USAGE = 2,     /* a bad option or value; nothing was done */
        CTL_NO_BROKER = 3, /* nothing answered on the socket */
};

typedef struct CtlCommand CtlCommand;

typedef struct Ctl {
        const char *socket;
        bool json;
        int timeout_ms;
        gpuipc_t *c;
        /* The connection survives a broker restart (the library's default): for the commands that
         * hold something or wait (publish, attach --hold, watch, metrics --listen). A one-shot
         * command reports on the one broker it asked instead (a listing's pages, an exit code). */
        bool reconnect;
        const CtlCommand *cmd; /* the subcommand running */
        bool printed;          /* a document (or line) went to stdout already */
} Ctl;

struct CtlCommand {
        const char *name;
        int (*fn)(Ctl *ctl, int argc, char **argv);
        const char *args;    /* the synopsis after the name */
        const char *summary; /* one line for `gpuipcctl --help` */
        const char *help;    /* what `gpuipcctl NAME --help` adds: the description and each option */
};

/* Every subcommand accepts -h/--help: add this to its long options and CTL_HELP_SHORT to its
 * short ones, and answer 'h' with ctl_help(). */
#define CTL_HELP_OPTION { "help", no_argument, NULL, 'h' }

/* Prints the running subcommand's help to stdout. Returns CTL_OK. */
int ctl_help(const Ctl *ctl);

/* A usage error of the running subcommand: prints "gpuipcctl CMD: <message>", its synopsis and
 * where to find more. Returns CTL_USAGE. */
int ctl_usage(Ctl *ctl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* getopt returned '?' or ':' (opterr is off): names the option that was wrong. Returns CTL_USAGE. */
int ctl_bad_option(Ctl *ctl, int argc, char **argv, int optopt_value);

/* Connects (once); prints why it could not. 0 or a CTL_* exit code. */
int ctl_connect(Ctl *ctl, bool probe_gpus);

/* A failed call: prints "gpuipcctl CMD: what: [err-name] <broker's message or the error text>" to
 * stderr (and, with --json, an error document to stdout when none was printed yet). Returns
 * CTL_FAILED, or CTL_NO_BROKER when the broker is unreachable. */
int ctl_fail(Ctl *ctl, const char *what, int err);
/* The same with the detail given (instead of the broker's message for the last call). */
int ctl_fail_detail(Ctl *ctl, const char *what, int err, const char *detail);

/* A failure found here, not by the library: prints "gpuipcctl CMD: <message>" (and, with --json,
 * {"error": name, "message": ...}). Returns CTL_FAILED. */
int ctl_error(Ctl *ctl, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Value parsing: 0, or CTL_USAGE after printing an error that names the option and the value. */
int ctl_parse_size(Ctl *ctl, const char *opt, const char *s, uint64_t *ret);
int ctl_parse_int(Ctl *ctl, const char *opt, const char *s, long min, long max, long *ret);
int ctl_parse_kind(Ctl *ctl, const char *opt, const char *s, gpuipc_kind_t *ret);

/* Milliseconds on a monotonic clock. */
uint64_t ctl_now_ms(void);

/* Bytes as "1.5 GiB". */
void ctl_human_size(uint64_t n, char *buf, size_t cap);

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
int cmd_rings(Ctl *ctl, int argc, char **argv);

/* cmd-rings.c for ls and stat: the rings' table after the buffers' (nothing without rings), and one
 * ring with its seats (a table, or the JSON document). 0, or the library's error (nothing printed). */
int ctl_ls_rings(Ctl *ctl, const char *prefix);
int ctl_stat_ring(Ctl *ctl, const char *name);
