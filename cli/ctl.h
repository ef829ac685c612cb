/* gpuipcctl: what the subcommands share: the global options, the broker connection, exit codes,
 * help texts, and value parsing whose errors name the value. gpuipcctl is a client of libgpuipc's
 * public API (gpuipc.h) and of nothing else in the tree: it must never include the library's
 * internals or the protocol, so that it links against the installed libgpuipc.so.0. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "clock.h"
#include "gpuipc.h"
#include "json.h"
#include "table.h"

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
        bool timeout_given;    /* --timeout was given: wait that long, even for a socket not there yet */
        gpuipc_t *c;
        /* The connection survives a broker restart (the library's default): for the commands that
         * hold something or wait (publish, attach --hold, watch, metrics --listen). A one-shot
         * command reports on the one broker it asked instead (a listing's pages, an exit code). */
        bool reconnect;
        const CtlCommand *cmd; /* the subcommand running */
        bool printed;          /* a document (or line) went to stdout already */
} Ctl;

/* What completes an option's value or a command's operand in the shell completions. */
typedef enum CtlValue {
        CTL_VALUE_NONE,    /* a flag (no value), or no operand */
        CTL_VALUE_ANY,     /* free text or a number: nothing to offer */
        CTL_VALUE_FILE,    /* a path */
        CTL_VALUE_KIND,    /* memfd, cuda-vmm, cuda-legacy */
        CTL_VALUE_PATTERN, /* counter, byte:0x.., random:.. */
        CTL_VALUE_NAME,    /* a buffer's or ring's name: asked of the broker */
        CTL_VALUE_SHELL,   /* bash, zsh, fish */
} CtlValue;

/* Option ids for options without a letter (ids of options with one are the letter). */
enum {
        CTL_OPT_NAME = 256, /* --name N: the deprecated spelling of the NAME operand */
        CTL_OPT_SIZE,
        CTL_OPT_WAIT,
        CTL_OPT_RETIRE_AFTER,
        CTL_OPT_NO_SANDBOX,
        CTL_OPT_MIN_PID,
        CTL_OPT_CHUNK,
        CTL_OPT_EVENT,
        CTL_OPT_UID,
        CTL_OPT_RESULT,
        CTL_OPT_FOLLOW,
};

/* One option of a command or of gpuipcctl itself. The command's table is what parses its options,
 * what its --help lists and what the shell completions offer, so the three never disagree. */
typedef struct CtlOption {
        int id;             /* what ctl_next_option returns: the letter, or a CTL_OPT_* */
        const char *name;   /* the long name without "--" (NULL: a letter only) */
        char letter;        /* the short option, or 0 */
        const char *arg;    /* the value's placeholder ("MS"), or NULL for a flag */
        CtlValue value;     /* what completes the value */
        const char *help;   /* for --help; '\n' starts a continuation line */
        const char *instead; /* set: a deprecated spelling, still accepted with a note naming this */
} CtlOption;

struct CtlCommand {
        const char *name;
        int (*fn)(Ctl *ctl, int argc, char **argv);
        const char *args;    /* the synopsis after the name */
        const char *summary; /* one line for `gpuipcctl --help` (NULL: an internal command, not listed) */
        const char *help;    /* what `gpuipcctl NAME --help` says before the options */
        const CtlOption *options; /* ends with an entry whose id is 0; -h/--help is implied */
        CtlValue operand;    /* what its one positional argument is, if any */
        bool runs_command;   /* its operands are a command line (run): its options end at the first one */
};

/* The command table and gpuipcctl's own options (gpuipcctl.c), for the completions. */
extern const CtlCommand ctl_commands[];
extern const size_t ctl_n_commands;
extern const CtlOption ctl_global_options[];

/* The next option of the running command from its table: the option's id; 0 after the last
 * option (optind then indexes the operands); -1 when the command must return *ret_exit now
 * (--help printed: CTL_OK; a bad option: CTL_USAGE). A deprecated spelling prints a note to stderr
 * and returns the id of the option it stands for. The global options --socket, --json and
 * --timeout are taken after the command's name too (where the command has no option of that
 * name or letter) and applied to ctl, never returned. */
int ctl_next_option(Ctl *ctl, int argc, char **argv, int *ret_exit);

/* The socket path the library will use: --socket, then $GPUIPC_SOCKET, then the default. */
const char *ctl_socket_path(const Ctl *ctl);

/* How long a connect may wait for the broker: --timeout's value, or the default of 5000; but 0 when
 * the socket path does not exist and no --timeout was given, so that a mistyped path fails at once
 * instead of after 5 s of waiting for a socket that will never appear. */
int ctl_connect_timeout(const Ctl *ctl);

/* Applies global option id ('s', 'j' or 't') with its value to ctl, wherever it was given. 0, or
 * -1 after reporting a bad value (usage). */
int ctl_global_option(Ctl *ctl, int id, const char *value);

/* The command's one operand (NAME) into *name, which a deprecated --name may have set already.
 * CTL_CONTINUE, or CTL_USAGE after saying what was wrong (two names, or a missing one when
 * required). */
int ctl_operand(Ctl *ctl, int argc, char **argv, bool required, const char **name);

/* A deprecated spelling was used: one line on stderr naming what to write instead. */
void ctl_deprecated(Ctl *ctl, const char *used, const char *instead);

/* The "  -p, --prefix P    text" lines of an option table, for --help. */
void ctl_print_options(FILE *f, const CtlOption *options);


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


/* Bytes as "1.5 GiB". */
void ctl_human_size(uint64_t n, char *buf, size_t cap);

/* A paged listing of the broker's (buffers, peers, rings): how to fetch a page and how to show one
 * record, as a JSON object and as a table row. */
typedef struct CtlListing {
        size_t record_size;
        int page;                /* records asked for per request */
        /* The next page from the library into page: how many records, or the library's error. */
        int (*fetch)(Ctl *ctl, const char *prefix, uint64_t *cursor, void *page, int cap);
        void (*json)(Json *o, const void *record);
        const char *const *headers;
        const char *align;       /* per column: 'l' or 'r' */
        void (*row)(Table *t, const void *record);
} CtlListing;

/* Every record under prefix (NULL: all): one JSON array with --json, else one table. The first page
 * comes before any output, so a refusal is an error document of its own. after_table: the table
 * follows another (ls's rings after its buffers): an empty line first, and nothing at all without
 * records. 0, or the library's error (the caller reports it). */
int ctl_list(Ctl *ctl, const CtlListing *l, const char *prefix, bool after_table);

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
int cmd_run(Ctl *ctl, int argc, char **argv);
int cmd_weights(Ctl *ctl, int argc, char **argv);
int cmd_audit(Ctl *ctl, int argc, char **argv);
int cmd_completion(Ctl *ctl, int argc, char **argv);
int cmd_complete_names(Ctl *ctl, int argc, char **argv);

/* cmd-rings.c for ls and stat: the rings' table after the buffers' (nothing without rings), and one
 * ring with its seats (a table, or the JSON document). 0, or the library's error (nothing printed). */
int ctl_ls_rings(Ctl *ctl, const char *prefix);
int ctl_stat_ring(Ctl *ctl, const char *name);
