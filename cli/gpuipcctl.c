/* gpuipcctl: the operator's tool. Global options, then one subcommand; this file holds the command
 * table with every help text, and what all subcommands share: connecting, reporting a failure, and
 * usage errors.
 *
 * What it must never do: print anything but one JSON document on stdout with --json (a failure is
 * {"error", "message"} there instead of a line on stderr, unless the command's document is out
 * already), or let an exit code blur the three cases scripts and probes tell apart: 1 failed,
 * 2 usage, 3 no broker. Deprecation notes for old spellings go to stderr in either case. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "ctl.h"
#include "json.h"

#define PATTERNS "counter (each 8-byte word holds its index), byte:0xAB or random:SEED"

/* ---- the option tables: parsing, --help and the shell completions all read these ---- */

/* Letters: one meaning in the whole tool (-s is --socket, -t --timeout, wherever they appear); an
 * option another command spells with the same letter gets none. A command's object is its operand
 * (NAME), never an option. docs/man/gpuipcctl.1.scd states the rule. */
const CtlOption ctl_global_options[] = {
        { 's', "socket", 's', "PATH", CTL_VALUE_FILE,
          "the broker's socket (default: $GPUIPC_SOCKET or " GPUIPC_DEFAULT_SOCKET ")" },
        { 'j', "json", 'j', NULL, CTL_VALUE_NONE,
          "machine-readable output: one JSON document (watch and publish: one per\n"
          "line); a failure prints {\"error\": NAME, \"message\": TEXT} on stdout instead\n"
          "of the text on stderr" },
        { 't', "timeout", 't', "MS", CTL_VALUE_ANY,
          "how long to wait for the broker to accept and greet us (default 5000);\n"
          "without it, a socket path that does not exist fails at once" },
        { 'h', "help", 'h', NULL, CTL_VALUE_NONE, "this text; `gpuipcctl COMMAND --help` describes a command" },
        { 'V', "version", 'V', NULL, CTL_VALUE_NONE, "gpuipcctl's and libgpuipc's versions" },
        { 0 }
};

/* The NAME operand's old spelling (publish, attach, group). */
#define NAME_DEPRECATED { CTL_OPT_NAME, "name", 'n', "N", CTL_VALUE_NAME, "", \
        "give the name as the argument (gpuipcctl COMMAND NAME)" }

static const CtlOption ping_options[] = {
        { 't', "timeout", 't', "MS", CTL_VALUE_ANY,
          "the global --timeout, written after the command as probes usually are" },
        { 0 }
};

static const CtlOption prefix_options[] = {
        { 'p', "prefix", 'p', "P", CTL_VALUE_ANY, "only names that start with P" },
        { 0 }
};

static const CtlOption stat_options[] = {
        { 'i', "id", 'i', "N", CTL_VALUE_ANY, "the buffer's broker id (as ls shows it) instead of a NAME" },
        { 'r', "ring", 'r', NULL, CTL_VALUE_NONE, "NAME is a ring's (rings and buffers have names of their own)" },
        { 0 }
};

static const CtlOption retire_options[] = {
        { 'i', "id", 'i', "N", CTL_VALUE_ANY, "the buffer's broker id instead of a NAME" },
        { 0 }
};

static const CtlOption metrics_options[] = {
        { 'l', "listen", 'l', "ADDR:PORT", CTL_VALUE_ANY,
          "serve HTTP here: 0.0.0.0:9470, 127.0.0.1:9470, [::]:9470, or :9470 for\n"
          "every address; port 0 picks a free one (printed at start)" },
        { CTL_OPT_NO_SANDBOX, "no-sandbox", 0, NULL, CTL_VALUE_NONE, "serve unconfined (for debugging)" },
        { 0 }
};

static const CtlOption publish_options[] = {
        { CTL_OPT_SIZE, "size", 0, "BYTES", CTL_VALUE_ANY,
          "bytes, or with K, M, G or T (powers of 1024; KiB and KB mean the same);\n"
          "memfd buffers must fit in the memory available" },
        { 'k', "kind", 'k', "K", CTL_VALUE_KIND, "memfd (default), cuda-vmm or cuda-legacy" },
        { 'd', "device", 'd', "N", CTL_VALUE_ANY, "the CUDA device ordinal (CUDA kinds; default 0)" },
        { 'f', "fill", 'f', "PATTERN", CTL_VALUE_PATTERN, PATTERNS "; default counter" },
        { 'w', "writable", 'w', NULL, CTL_VALUE_NONE, "consumers may map it writable" },
        { 'b', "broker-held", 'b', NULL, CTL_VALUE_NONE,
          "the memory outlives this process until retired and drained (memfd,\n"
          "cuda-vmm)" },
        { CTL_OPT_RETIRE_AFTER, "retire-after", 0, "N", CTL_VALUE_ANY, "retire it after N attaches" },
        NAME_DEPRECATED,
        { CTL_OPT_SIZE, NULL, 's', "BYTES", CTL_VALUE_ANY, "", "write --size (-s is --socket everywhere else)" },
        { CTL_OPT_RETIRE_AFTER, NULL, 'r', "N", CTL_VALUE_ANY, "", "write --retire-after (-r is stat's --ring)" },
        { 0 }
};

static const CtlOption attach_options[] = {
        { 'v', "verify", 'v', "PATTERN", CTL_VALUE_PATTERN, "check every byte: " PATTERNS },
        { CTL_OPT_WAIT, "wait", 0, "MS", CTL_VALUE_ANY,
          "how long to wait for a publish (default 0: it must be there; -1: forever)" },
        { 'H', "hold", 'H', "MS", CTL_VALUE_ANY,
          "keep the reference this long before releasing it (-1: until SIGTERM or\n"
          "SIGINT, a long-running consumer)" },
        { 'd', "device", 'd', "N", CTL_VALUE_ANY, "map CUDA buffers onto this device ordinal" },
        NAME_DEPRECATED,
        { CTL_OPT_WAIT, "timeout", 't', "MS", CTL_VALUE_ANY, "",
          "write --wait (--timeout is the connect timeout everywhere else)" },
        { 0 }
};

static const CtlOption run_options[] = {
        { CTL_OPT_MIN_PID, "min-pid", 0, "N", CTL_VALUE_ANY,
          "start at PID N or above (default: 64 plus this PID namespace's inode\n"
          "modulo 960, so that containers started together rarely collide)" },
        { 'q', "quiet", 'q', NULL, CTL_VALUE_NONE, "do not say which PID the command got" },
        { 0 }
};

static const CtlOption group_options[] = {
        { 'm', "members", 'm', "N", CTL_VALUE_ANY, "how many members complete it (1 to 4096)" },
        { CTL_OPT_WAIT, "wait", 0, "MS", CTL_VALUE_ANY, "how long to wait for them (default 30000)" },
        NAME_DEPRECATED,
        { CTL_OPT_WAIT, "timeout", 't', "MS", CTL_VALUE_ANY, "",
          "write --wait (--timeout is the connect timeout everywhere else)" },
        { 0 }
};

/* weights' subcommands have tables of their own (cmd-weights.c); this one is what the completions
 * offer after `weights`. */
static const CtlOption weights_options[] = {
        { 'k', "kind", 'k', "K", CTL_VALUE_KIND, "load, serve: cuda-vmm (default) or memfd" },
        { 'd', "device", 'd', "N", CTL_VALUE_ANY, "load, serve: the CUDA device ordinal" },
        { CTL_OPT_CHUNK, "chunk", 0, "BYTES", CTL_VALUE_ANY, "load, serve: bytes read at once" },
        { 'p', "prefix", 'p', "P", CTL_VALUE_ANY, "ls: only names that start with P" },
        { 0 }
};

/* No letters: -r is stat's --ring and -f publish's --fill (one meaning per letter in the tool). */
static const CtlOption audit_options[] = {
        { CTL_OPT_EVENT, "event", 0, "E", CTL_VALUE_ANY,
          "only records of this event (publish, attach, retire, peer-gone, ...);\n"
          "given again, of any of them" },
        { CTL_OPT_RESULT, "result", 0, "R", CTL_VALUE_ANY, "only records with this result (ok, denied, quota, ...)" },
        { CTL_OPT_UID, "uid", 0, "N", CTL_VALUE_ANY, "only records of peers with this uid" },
        { CTL_OPT_FOLLOW, "follow", 0, NULL, CTL_VALUE_NONE,
          "at the end of FILE, wait for more, as tail -f does (until SIGINT or\n"
          "SIGTERM); a pipe is read until its writer ends anyway" },
        { 0 }
};

const CtlCommand ctl_commands[] = {
        { "ping", cmd_ping, "[--timeout MS]", "exit 0 when the broker answers (a readiness probe)",
          "Exits 0 when the broker answers a ping: a readiness or startup probe.", ping_options, CTL_VALUE_NONE },
        { "ls", cmd_ls, "[--prefix P]", "list buffers, then rings",
          "Lists buffers in every state: id, name, generation, kind, size, state, references, and the producer's\n"
          "uid and pid (\"held\": broker-held; \"orphaned\": its producer is gone). Then, if there are any, the\n"
          "rings as `gpuipcctl rings` shows them. With --json: the buffers' array only (rings --json lists rings).",
          prefix_options, CTL_VALUE_NONE },
        { "stat", cmd_stat, "NAME | --id N | --ring NAME", "show one buffer and who holds it, or one ring",
          "Shows one buffer and the peers holding references to it. NAME finds the live buffer published under\n"
          "it, or else the ring of that name; --id finds any buffer by its broker id. A ring is shown with each\n"
          "taken seat: its state, its member, its position and how many frames it lags behind the head.",
          stat_options, CTL_VALUE_NAME },
        { "rings", cmd_rings, "[--prefix P]", "list rings and how far their members lag",
          "Lists rings: mode, slots and their kind and size, seats taken of all, the head (the newest frame;\n"
          "\"?\": the control page could not be read), the slowest seated member's lag in frames (\"-\": none\n"
          "seated), and the producer's uid and pid (\"setting-up\": not every part is registered yet). Head and\n"
          "lag come from the ring's shared memory as its producer and members wrote it; `stat NAME` shows the\n"
          "seats.", prefix_options, CTL_VALUE_NONE },
        { "peers", cmd_peers, "", "list connected peers",
          "Lists the connected peers: pid and uid from the kernel (pid 0: outside the broker's PID namespace),\n"
          "the PID each has in its own PID namespace (SELF-PID: the kernel's where the broker sees the peer,\n"
          "else what it declared; cuda-legacy producer and consumer must differ in it), gid, PID namespace,\n"
          "label, buffers owned, references, subscriptions, waits and declared GPUs. With --json also each\n"
          "peer's declared /dev/shm (shm_dev, shm_ino: IPC-event fences need the same).", NULL,
          CTL_VALUE_NONE },
        { "stats", cmd_stats, "", "show the broker's counters",
          "Prints every counter, gauge and histogram series of the broker, one per line (docs/protocol.md,\n"
          "\"stats\", names them).", NULL, CTL_VALUE_NONE },
        { "metrics", cmd_metrics, "[--listen ADDR:PORT [--no-sandbox]]",
          "the statistics for Prometheus, once or served over HTTP",
          "Prints the broker's statistics, and per ring its head, lag, seats taken and slots, in the Prometheus\n"
          "text format (version 0.0.4). With --listen it serves them instead, until SIGTERM or SIGINT: GET\n"
          "/metrics asks the broker for every scrape, waiting at most --timeout (gpuipc_up says whether it\n"
          "answered in time; if not, the last good sample comes with it), GET /healthz answers at once: 200\n"
          "while the broker answered the exporter's last question, 503 otherwise. Once it listens, it runs\n"
          "confined (no_new_privs, Landlock, a seccomp filter).\n"
          "The broker itself never opens a network socket; run this next to it (port 9470 by convention).",
          metrics_options, CTL_VALUE_NONE },
        { "publish", cmd_publish,
          "NAME --size BYTES [--kind K] [--device N] [--fill PATTERN] [--writable] [--broker-held] "
          "[--retire-after N]",
          "publish a buffer and hold it until it drains",
          "Allocates a buffer, fills it with a pattern, publishes it under NAME and holds it until it was retired\n"
          "(by gpuipcctl retire, or --retire-after) and drained, or until SIGTERM or SIGINT. Through a broker\n"
          "restart it reconnects and publishes the buffer again under the same id.",
          publish_options, CTL_VALUE_NAME },
        { "attach", cmd_attach, "NAME [--verify PATTERN] [--wait MS] [--hold MS|-1] [--device N]",
          "attach a buffer, check it, hold it, release it",
          "Attaches the buffer published under NAME (waiting for it to appear), optionally checks every byte\n"
          "against a pattern, keeps the reference for a while, and releases it. Exit 1 when a byte differs or\n"
          "the buffer was revoked. While it holds, a broker restart is survived: it reconnects and reclaims\n"
          "the reference.", attach_options, CTL_VALUE_NAME },
        { "retire", cmd_retire, "NAME | --id N", "retire a buffer",
          "Retires a buffer: no new attaches; its producer hears drained after the last release. Allowed to\n"
          "its producer, to peers of the producer's uid once it is gone, and to a policy admin.", retire_options,
          CTL_VALUE_NAME },
        { "watch", cmd_watch, "[--prefix P]", "print events as they happen",
          "Prints events about buffers as they happen (published, retired, revoked, drained), one per line,\n"
          "until interrupted. After a broker restart it reconnects and says so (reconnected); events meanwhile\n"
          "are missed.", prefix_options, CTL_VALUE_NONE },
        { "group", cmd_group, "NAME --members N [--wait MS]", "join a rendezvous group",
          "Joins the rendezvous group NAME and waits until N members joined (exit 0), or until the earliest\n"
          "member's deadline passed (exit 1).", group_options, CTL_VALUE_NAME },
        { "doctor", cmd_doctor, "", "check the socket, broker, PIDs, /dev/shm and GPUs",
          "Checks what a gpuipc client needs and gives each check its verdict (ok, FAIL, ?? when it cannot be\n"
          "told, -- when it does not apply here, such as the GPU checks on a host without one, or warn when\n"
          "nothing fails yet but a usual setup would): the socket, the broker, the PID namespace, this\n"
          "process's PID in it (FAIL when a cuda-legacy producer or holder the broker knows has the same PID,\n"
          "each in its own namespace; warn as PID 1), its /dev/shm (and the peers that declared another: IPC\n"
          "events need the same), the CUDA driver and every visible GPU (virtual memory management, POSIX-fd\n"
          "export, fences, MIG). Every check runs, whatever the others found.\n"
          "Exit 0: no check failed; 1: a problem; 3: no broker answered.", NULL, CTL_VALUE_NONE },
        { "run", cmd_run, "[--min-pid N] [--quiet] -- CMD [ARGS...]",
          "run a command at a PID no peer has (cuda-legacy across containers)",
          "Starts CMD at a PID that no peer of the broker has as its own PID (each as its own PID namespace\n"
          "counts), that is not 1, and that is at least the target (--min-pid): CUDA refuses a legacy IPC\n"
          "handle between two processes with the same PID (both PID 1 of their containers, say), whatever the\n"
          "namespaces. Use it as a container's command. It stays as CMD's parent (the container's init:\n"
          "orphans are reaped), passes SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on, and exits\n"
          "with CMD's status (128 + N when signal N killed it). Without a broker it warns and still runs CMD\n"
          "at the target. Exit 125: no PID could be had (nothing ran); 126: CMD cannot be run; 127: not found.",
          run_options, CTL_VALUE_ANY, true },
        { "weights", cmd_weights, "load|serve NAME FILE... | ls | drop NAME",
          "keep a safetensors checkpoint resident for engines",
          "Weights that outlive every process: `weights load NAME FILE...` reads a safetensors checkpoint\n"
          "straight into one broker-held cuda-vmm (or memfd) buffer that attach_state_dict(NAME) reads, and\n"
          "exits; `weights serve` does the same and stays as its producer, so that a broker restart loses\n"
          "nothing; `weights ls` lists them and their versions; `weights drop NAME` retires them (freed once\n"
          "their holders released). `gpuipcctl weights SUBCOMMAND --help` describes each.",
          weights_options, CTL_VALUE_ANY },
        { "audit", cmd_audit, "[FILE|-] [--event E]... [--result R] [--uid N] [--follow]",
          "show the broker's audit trail from its log",
          "Reads the broker's log lines (as --log-format json writes them) from FILE or stdin (\"-\", the default),\n"
          "keeps the audit records (docs/operations.md, \"The audit trail\") that match every filter given, and\n"
          "prints one line per record: time, event, result, uid, pid, peer, name, kind and bytes (then buffer,\n"
          "refs, buffers or count where the record has them). With --json it prints the records as the broker\n"
          "wrote them, one per line. Lines that are not JSON objects, and lines over 64 KiB, are skipped; how\n"
          "many goes to stderr at the end. It needs no broker: e.g.\n"
          "  kubectl logs -f POD -c gpuipc-broker | gpuipcctl audit --result denied\n"
          "  journalctl -fu gpuipc-broker -o cat | gpuipcctl audit --event attach",
          audit_options, CTL_VALUE_FILE },
        { "completion", cmd_completion, "bash | zsh | fish", "print the shell completion script",
          "Prints the completion script for a shell: commands, options, kinds and patterns, and buffer and ring\n"
          "names asked of the broker. `meson install` installs all three; to try one at once:\n"
          "  source <(gpuipcctl completion bash)", NULL, CTL_VALUE_SHELL },
        /* For the completion scripts: the names of buffers and rings under a prefix, one per line. */
        { "__complete-names", cmd_complete_names, "[PREFIX]", NULL, "", NULL, CTL_VALUE_ANY },
};
const size_t ctl_n_commands = sizeof(ctl_commands) / sizeof(ctl_commands[0]);

/* What ctl->cmd is before a command is found: an empty name, so the shared reporting code never
 * needs a NULL check and --help prints the tool's usage. */
static const CtlCommand global = { "", NULL, "", "", "", ctl_global_options, CTL_VALUE_NONE };

/* The tool's usage, from the command table, so a new command is listed without touching this;
 * commands without a summary (internal ones, such as __complete-names) are left out. The exit codes
 * are part of the contract scripts rely on, so they are printed here, where people look first. */
static void usage(FILE *f)
{
        fprintf(f, "Usage: gpuipcctl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]\n"
                   "(--socket, --json and --timeout may also follow the command: gpuipcctl ls --json)\n\n");
        ctl_print_options(f, ctl_global_options);
        fprintf(f, "\nCommands:\n");
        for (size_t i = 0; i < ctl_n_commands; i++)
                if (ctl_commands[i].summary)
                        fprintf(f, "  %-10s %s\n", ctl_commands[i].name, ctl_commands[i].summary);
        fprintf(f, "\nPatterns: " PATTERNS "\n"
                   "Exit codes: 0 ok, 1 failed (or the data did not verify), 2 usage, 3 no broker\n");
}

/* --help goes to stdout and exits 0 (it was asked for); usage errors go to stderr and exit 2. */
int ctl_help(const Ctl *ctl)
{
        const CtlCommand *cmd = ctl->cmd;

        if (!cmd->name[0]) {
                usage(stdout);
                return CTL_OK;
        }
        printf("Usage: gpuipcctl [GLOBAL OPTIONS] %s%s%s\n\n%s\n\n", cmd->name, cmd->args[0] ? " " : "", cmd->args,
               cmd->help);
        ctl_print_options(stdout, cmd->options);
        printf("\nGlobal options (--socket, --json, --timeout; before or after the command): see gpuipcctl --help.\n");
        return CTL_OK;
}

/* A failure, reported once: with --json as the error document on stdout instead of the text on
 * stderr, unless the command's document is out already (then stderr is all that is left). text is
 * the whole stderr line (without "gpuipcctl CMD: "), message the document's, hint optional. */
static void report(Ctl *ctl, const char *name, const char *text, const char *message, const char *hint)
{
        const char *cmd = ctl->cmd ? ctl->cmd->name : "";
        Json j;

        if (!ctl->json || ctl->printed) {
                fprintf(stderr, "gpuipcctl%s%s: %s\n", cmd[0] ? " " : "", cmd, text);
                if (hint && hint[0])
                        fprintf(stderr, "  hint: %s\n", hint);
                return;
        }
        /* "error" is the stable name the man page promises (for a library failure, the one in
         * brackets on stderr), what scripts match; "message" and "hint" are for people. */
        json_begin(&j, stdout, '{');
        json_kstr(&j, "error", name);
        json_kstr(&j, "message", message);
        if (hint && hint[0])
                json_kstr(&j, "hint", hint);
        json_end(&j, '}');
        putchar('\n');
        fflush(stdout);
        ctl->printed = true;
}

int ctl_usage(Ctl *ctl, const char *fmt, ...)
{
        const char *name = ctl->cmd ? ctl->cmd->name : "";
        char msg[512];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        report(ctl, "usage", msg, msg, NULL);
        /* The usage lines are for people; with --json the error document is all that goes out. */
        if (ctl->json)
                return CTL_USAGE;
        if (name[0])
                fprintf(stderr, "Usage: gpuipcctl %s %s\nTry 'gpuipcctl %s --help'.\n", name, ctl->cmd->args, name);
        else
                fprintf(stderr, "Try 'gpuipcctl --help'.\n");
        return CTL_USAGE;
}

int ctl_bad_option(Ctl *ctl, int argc, char **argv, int c)
{
        /* getopt has moved past the offending word: it is argv[optind - 1] (bounds checked, since
         * optind is getopt's state, not ours). */
        const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "?";

        if (c == ':')
                return ctl_usage(ctl, "option '%s' needs a value", arg);
        /* glibc leaves optopt 0 for an unknown long option: then the whole word is named. */
        if (optopt && optopt != '?')
                return ctl_usage(ctl, "unknown option '-%c'", optopt);
        return ctl_usage(ctl, "unknown option '%s'", arg);
}

/* --socket, then GPUIPC_SOCKET, then the default: the order the library follows, so that the path
 * gpuipcctl reports (doctor, error hints) is the one it connects to. */
const char *ctl_socket_path(const Ctl *ctl)
{
        const char *p = ctl->socket;

        if (!p || !*p)
                p = getenv("GPUIPC_SOCKET");
        return p && *p ? p : GPUIPC_DEFAULT_SOCKET;
}

int ctl_connect_timeout(const Ctl *ctl)
{
        struct stat st;

        /* The wait is for a broker that is starting: its socket exists, or cannot be looked at
         * from here. A socket that is not there at all fails at once unless --timeout asks to
         * wait for it, so a script learns "no broker" without waiting 5 seconds. */
        if (ctl->timeout_given || stat(ctl_socket_path(ctl), &st) == 0 || errno != ENOENT)
                return ctl->timeout_ms;
        return 0;
}

int ctl_connect(Ctl *ctl, bool probe_gpus)
{
        gpuipc_options_t o = { .struct_size = sizeof(o) };
        char text[2048];
        int r;

        /* One connection per run, whichever code asks first: everything a command prints
         * comes from the one broker it reached. */
        if (ctl->c)
                return 0;
        o.socket_path = ctl->socket;
        o.label = "gpuipcctl";
        o.connect_timeout_ms = ctl_connect_timeout(ctl);
        o.no_gpus = !probe_gpus;
        /* One-shot commands fail fast on a lost broker (a script sees exit 3 at once); only the
         * holding ones (publish, attach --hold, watch) ask to ride out a restart. */
        o.no_reconnect = !ctl->reconnect;
        r = gpuipc_connect(&ctl->c, &o);
        if (r < 0) {
                const char *hint = o.connect_timeout_ms == 0 && ctl->timeout_ms > 0
                                           ? "the socket does not exist; give --timeout MS to wait for it to appear"
                                           : NULL;

                snprintf(text, sizeof(text), "cannot reach the broker: [%s] %s", gpuipc_err_name(r),
                         gpuipc_errmsg(NULL));
                report(ctl, gpuipc_err_name(r), text, gpuipc_errmsg(NULL), hint);
                ctl->c = NULL;
                /* A socket we may not open or a broker that never greets us is, to a readiness
                 * probe, the same as none: exit 3, not 1. */
                return r == GPUIPC_E_NO_BROKER || r == -EACCES || r == GPUIPC_E_TIMEOUT ? CTL_NO_BROKER : CTL_FAILED;
        }
        return 0;
}

int ctl_fail(Ctl *ctl, const char *what, int err)
{
        return ctl_fail_detail(ctl, what, err, ctl->c ? gpuipc_errmsg(ctl->c) : "");
}

int ctl_fail_detail(Ctl *ctl, const char *what, int err, const char *detail)
{
        char message[2048], text[2100];

        /* The error's name first: scripts can match it, people can search for it. The broker's
         * message says what happened; the library's text, how to fix it (the hint). */
        snprintf(message, sizeof(message), "%s: %s", what, detail[0] ? detail : gpuipc_strerror(err));
        snprintf(text, sizeof(text), "%s: [%s] %s", what, gpuipc_err_name(err),
                 detail[0] ? detail : gpuipc_strerror(err));
        report(ctl, gpuipc_err_name(err), text, message, detail[0] ? gpuipc_strerror(err) : NULL);
        /* A broker lost mid-command is "no broker" (3) too: a probe retries it, unlike a refusal. */
        return err == GPUIPC_E_NO_BROKER || err == GPUIPC_E_DISCONNECTED ? CTL_NO_BROKER : CTL_FAILED;
}

/* A failure gpuipcctl finds itself (not the library): name is the error document's "error", which
 * scripts match, so it is one of the library's names where one fits ("no-memory", "invalid"). */
int ctl_error(Ctl *ctl, const char *name, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        report(ctl, name, msg, msg, NULL);
        return CTL_FAILED;
}

static int print_version(const Ctl *ctl)
{
        /* gpuipcctl uses the shared library: the one loaded may be another release. Written raw:
         * both are the project's own version numbers, with nothing to escape. */
        if (ctl->json)
                printf("{\"gpuipcctl\":\"%s\",\"libgpuipc\":\"%s\"}\n", GPUIPC_VERSION, gpuipc_version());
        else
                printf("gpuipcctl %s\nlibgpuipc %s\n", GPUIPC_VERSION, gpuipc_version());
        return CTL_OK;
}

/* Whether word spells an option of table that takes a value (--name, --name=V needs no skip, -x). */
static bool takes_value(const CtlOption *table, const char *word)
{
        for (const CtlOption *o = table; table && o->id; o++) {
                if (!o->arg)
                        continue;
                if ((o->name && word[1] == '-' && strcmp(word + 2, o->name) == 0) ||
                    (o->letter && word[1] == o->letter && word[2] == 0))
                        return true;
        }
        return false;
}

/* Whether --json (or -j) is among the global options, before the command or after it. A scan ahead
 * of getopt, which has to know the value-taking options to skip their values: a socket path that is
 * literally "--json" is a value, not the flag. It ends at "--", and for run at the command it runs
 * (whose own --json is not ours). */
static bool json_requested(int argc, char **argv)
{
        const CtlCommand *cmd = NULL;

        for (int i = 1; i < argc; i++) {
                const char *w = argv[i];

                if (strcmp(w, "--") == 0)
                        break;
                /* A lone "-" is an operand (weights load's standard input), not an option. */
                if (w[0] != '-' || w[1] == 0) {
                        if (cmd) {
                                if (cmd->runs_command)
                                        break;
                                continue; /* an operand */
                        }
                        for (size_t k = 0; k < ctl_n_commands && !cmd; k++)
                                if (strcmp(w, ctl_commands[k].name) == 0)
                                        cmd = &ctl_commands[k];
                                /* An unknown command: what follows cannot be read without its
                                 * table, and main refuses the command anyway. */
                        if (!cmd)
                                break;
                        continue;
                }
                if (cmd && takes_value(cmd->options, w)) {
                        i++; /* the command's option's value */
                        continue;
                }
                if (strcmp(w, "--json") == 0 || strcmp(w, "-j") == 0)
                        return true;
                if (strcmp(w, "--socket") == 0 || strcmp(w, "-s") == 0 || strcmp(w, "--timeout") == 0 ||
                    strcmp(w, "-t") == 0)
                        i++; /* its value */
        }
        return false;
}

/* Global options, wherever they stand: called by ctl_next_option both before the command and among
 * the command's own options, so "gpuipcctl ls --json" works as "gpuipcctl --json ls" does. */
int ctl_global_option(Ctl *ctl, int id, const char *value)
{
        long v;

        switch (id) {
        case 's': ctl->socket = value; break;
        case 'j': ctl->json = true; break;
        case 't':
                /* 0 is allowed: the connect does not wait, as for a socket that does not exist. */
                if (ctl_parse_int(ctl, "--timeout", value, 0, INT32_MAX, &v))
                        return -1;
                ctl->timeout_ms = (int)v;
                ctl->timeout_given = true;
                break;
        }
        return 0;
}

int main(int argc, char **argv)
{
        Ctl ctl = { .timeout_ms = 5000, .cmd = &global };
        bool help = false, version = false;
        int c, r;

        opterr = 0; /* our own messages name the option */
        /* --json first: a bad option before it gets its error document too. Then every global
         * option is read before any is acted on: -V --json is a JSON document as well. */
        ctl.json = json_requested(argc, argv);
        while ((c = ctl_next_option(&ctl, argc, argv, &r)) > 0) {
                switch (c) {
                case 'h': help = true; break;
                case 'V': version = true; break;
                default:
                        if (ctl_global_option(&ctl, c, optarg) < 0)
                                return CTL_USAGE;
                }
        }
        if (c < 0)
                return r;
        if (help)
                return ctl_help(&ctl);
        if (version)
                return print_version(&ctl);
        if (optind >= argc) {
                /* With --json the error document alone goes out: the usage text is for people. */
                if (!ctl.json)
                        usage(stderr);
                return ctl_usage(&ctl, "no command given");
        }
        for (size_t i = 0; i < ctl_n_commands; i++) {
                if (strcmp(argv[optind], ctl_commands[i].name) != 0)
                        continue;
                ctl.cmd = &ctl_commands[i];
                argc -= optind;
                argv += optind;
                optind = 0; /* each subcommand parses its own options (0 makes glibc start afresh) */
                r = ctl_commands[i].fn(&ctl, argc, argv);
                /* Closing releases whatever the command still held (and NULL is fine): nothing
                 * is left registered for a broker to clean up after a dead connection. */
                gpuipc_close(ctl.c);
                return r;
        }
        return ctl_usage(&ctl, "unknown command '%s'", argv[optind]);
}
