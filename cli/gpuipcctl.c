/* gpuipcctl: the operator's tool. Global options, then one subcommand; this file holds the command
 * table with every help text, and what all subcommands share: connecting, reporting a failure, and
 * usage errors.
 *
 * What it must never do: print anything but one JSON document on stdout with --json (a failure is
 * {"error", "message"}, and only when the command printed nothing yet), or let an exit code blur
 * the three cases scripts and probes tell apart: 1 failed, 2 usage, 3 no broker. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ctl.h"
#include "json.h"

#define PATTERNS "counter (each 8-byte word holds its index), byte:0xAB or random:SEED"

static const CtlCommand commands[] = {
        { "ping", cmd_ping, "[--timeout MS]", "exit 0 when the broker answers (a readiness probe)",
          "Exits 0 when the broker answers a ping: a readiness or startup probe.\n\n"
          "  -t, --timeout MS    how long to wait for the broker (the same as the global --timeout)\n" },
        { "ls", cmd_ls, "[--prefix P]", "list buffers, then rings",
          "Lists buffers in every state: id, name, generation, kind, size, state, references, and the producer's\n"
          "uid and pid (\"held\": broker-held; \"orphaned\": its producer is gone). Then, if there are any, the\n"
          "rings as `gpuipcctl rings` shows them. With --json: the buffers' array only (rings --json lists rings).\n\n"
          "  -p, --prefix P      only buffers (and rings) whose name starts with P\n" },
        { "stat", cmd_stat, "NAME | --id N | --ring NAME", "show one buffer and who holds it, or one ring",
          "Shows one buffer and the peers holding references to it. NAME finds the live buffer published under\n"
          "it, or else the ring of that name; --id finds any buffer by its broker id. A ring is shown with each\n"
          "taken seat: its state, its member, its position and how many frames it lags behind the head.\n\n"
          "  -i, --id N          the buffer's broker id (as ls shows it)\n"
          "  -r, --ring          NAME is a ring's (rings and buffers have names of their own)\n" },
        { "rings", cmd_rings, "[--prefix P]", "list rings and how far their members lag",
          "Lists rings: mode, slots and their kind and size, seats taken of all, the head (the newest frame;\n"
          "\"?\": the control page could not be read), the slowest seated member's lag in frames (\"-\": none\n"
          "seated), and the producer's uid and pid (\"setting-up\": not every part is registered yet). Head and\n"
          "lag come from the ring's shared memory as its producer and members wrote it; `stat NAME` shows the\n"
          "seats.\n\n"
          "  -p, --prefix P      only rings whose name starts with P\n" },
        { "peers", cmd_peers, "", "list connected peers",
          "Lists the connected peers: pid and uid from the kernel (pid 0: outside the broker's PID namespace),\n"
          "gid, PID namespace, label, buffers owned, references, subscriptions, waits and declared GPUs.\n" },
        { "stats", cmd_stats, "", "show the broker's counters",
          "Prints every counter, gauge and histogram series of the broker, one per line (docs/protocol.md,\n"
          "\"stats\", names them).\n" },
        { "metrics", cmd_metrics, "[--listen ADDR:PORT [--no-sandbox]]",
          "the statistics for Prometheus, once or served over HTTP",
          "Prints the broker's statistics, and per ring its head, lag, seats taken and slots, in the Prometheus\n"
          "text format (version 0.0.4). With --listen it serves them instead, until SIGTERM or SIGINT: GET\n"
          "/metrics asks the broker for every scrape, waiting at most --timeout (gpuipc_up says whether it\n"
          "answered in time; if not, the last good sample comes with it), GET /healthz answers at once: 200\n"
          "while the broker answered the exporter's last question, 503 otherwise. Once it listens, it runs\n"
          "confined (no_new_privs, Landlock, a seccomp filter).\n"
          "The broker itself never opens a network socket; run this next to it (port 9470 by convention).\n\n"
          "  -l, --listen ADDR:PORT   serve HTTP here: 0.0.0.0:9470, 127.0.0.1:9470, [::]:9470, or :9470 for\n"
          "                           every address; port 0 picks a free one (printed at start)\n"
          "      --no-sandbox         serve unconfined (for debugging)\n" },
        { "publish", cmd_publish,
          "--name N --size BYTES [--kind K] [--device N] [--fill PATTERN] [--writable] [--broker-held] "
          "[--retire-after N]",
          "publish a buffer and hold it until it drains",
          "Allocates a buffer, fills it with a pattern, publishes it and holds it until it was retired (by\n"
          "gpuipcctl retire, or --retire-after) and drained, or until SIGTERM or SIGINT. Through a broker\n"
          "restart it reconnects and publishes the buffer again under the same id.\n\n"
          "  -n, --name N           the name to publish under\n"
          "  -s, --size BYTES       bytes, or with K, M, G or T (powers of 1024; KiB and KB mean the same);\n"
          "                         memfd buffers must fit in the memory available\n"
          "  -k, --kind K           memfd (default), cuda-vmm or cuda-legacy\n"
          "  -d, --device N         the CUDA device ordinal (CUDA kinds; default 0)\n"
          "  -f, --fill PATTERN     " PATTERNS "; default counter\n"
          "  -w, --writable         consumers may map it writable\n"
          "  -b, --broker-held      the memory outlives this process until retired and drained (memfd, cuda-vmm)\n"
          "  -r, --retire-after N   retire it after N attaches\n" },
        { "attach", cmd_attach, "--name N [--verify PATTERN] [--timeout MS] [--hold MS|-1] [--device N]",
          "attach a buffer, check it, hold it, release it",
          "Attaches the buffer published under a name (waiting for it to appear), optionally checks every byte\n"
          "against a pattern, keeps the reference for a while, and releases it. Exit 1 when a byte differs or\n"
          "the buffer was revoked. While it holds, a broker restart is survived: it reconnects and reclaims\n"
          "the reference.\n\n"
          "  -n, --name N           the name to attach\n"
          "  -v, --verify PATTERN   check every byte: " PATTERNS "\n"
          "  -t, --timeout MS       how long to wait for a publish (default 0: it must be there; -1: forever)\n"
          "  -H, --hold MS          keep the reference this long before releasing it (-1: until SIGTERM or\n"
          "                         SIGINT, a long-running consumer)\n"
          "  -d, --device N         map CUDA buffers onto this device ordinal\n" },
        { "retire", cmd_retire, "NAME | --id N", "retire a buffer",
          "Retires a buffer: no new attaches; its producer hears drained after the last release. Allowed to\n"
          "its producer, to peers of the producer's uid once it is gone, and to a policy admin.\n\n"
          "  -i, --id N          the buffer's broker id instead of a name\n" },
        { "watch", cmd_watch, "[--prefix P]", "print events as they happen",
          "Prints events about buffers as they happen (published, retired, revoked, drained), one per line,\n"
          "until interrupted. After a broker restart it reconnects and says so (reconnected); events meanwhile\n"
          "are missed.\n\n"
          "  -p, --prefix P      only names starting with P\n" },
        { "group", cmd_group, "--name G --members N [--timeout MS]", "join a rendezvous group",
          "Joins a rendezvous group and waits until N members joined (exit 0), or until the earliest member's\n"
          "deadline passed (exit 1).\n\n"
          "  -n, --name G        the group\n"
          "  -m, --members N     how many members complete it (1 to 4096)\n"
          "  -t, --timeout MS    how long to wait (default 30000)\n" },
        { "doctor", cmd_doctor, "", "check the socket, broker, PID namespace and GPUs",
          "Checks what a gpuipc client needs and gives each check its verdict (ok, FAIL, or ?? when it cannot\n"
          "be told): the socket, the broker, the PID namespace, the CUDA driver and every visible GPU (virtual\n"
          "memory management, POSIX-fd export, fences, MIG). Every check runs, whatever the others found.\n"
          "Exit 0: all passed; 1: a problem; 3: no broker answered.\n" },
};

static void usage(FILE *f)
{
        fprintf(f, "Usage: gpuipcctl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]\n\n"
                   "  -s, --socket PATH   the broker's socket (default: $GPUIPC_SOCKET or %s)\n"
                   "  -j, --json          machine-readable output: one JSON document (watch and publish: one per\n"
                   "                      line); a failure prints {\"error\": NAME, \"message\": TEXT} instead\n"
                   "  -t, --timeout MS    how long to wait for the broker to accept and greet us (default 5000)\n"
                   "  -h, --help          this text; `gpuipcctl COMMAND --help` describes a command\n"
                   "  -V, --version       gpuipcctl's and libgpuipc's versions\n\n"
                   "Commands:\n",
                GPUIPC_DEFAULT_SOCKET);
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
        fprintf(f, "\nPatterns: " PATTERNS "\n"
                   "Exit codes: 0 ok, 1 failed (or the data did not verify), 2 usage, 3 no broker\n");
}

int ctl_help(const Ctl *ctl)
{
        const CtlCommand *cmd = ctl->cmd;

        printf("Usage: gpuipcctl [GLOBAL OPTIONS] %s%s%s\n\n%s", cmd->name, cmd->args[0] ? " " : "", cmd->args,
               cmd->help);
        /* A help text without options of its own still gets the options paragraph for --help. */
        printf("%s  -h, --help          this text\n\nGlobal options (before the command): see gpuipcctl --help.\n",
               strstr(cmd->help, "\n\n") ? "" : "\n");
        return CTL_OK;
}

/* With --json, a failure is a document too, unless the command's document is already out. */
static void json_error(Ctl *ctl, const char *name, const char *message)
{
        Json j;

        if (!ctl->json || ctl->printed)
                return;
        json_begin(&j, stdout, '{');
        json_key(&j, "error");
        json_cstr(&j, name);
        json_key(&j, "message");
        json_cstr(&j, message);
        json_end(&j, '}');
        putchar('\n');
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
        fprintf(stderr, "gpuipcctl%s%s: %s\n", name[0] ? " " : "", name, msg);
        if (name[0])
                fprintf(stderr, "Usage: gpuipcctl %s %s\nTry 'gpuipcctl %s --help'.\n", name, ctl->cmd->args, name);
        json_error(ctl, "usage", msg);
        return CTL_USAGE;
}

int ctl_bad_option(Ctl *ctl, int argc, char **argv, int c)
{
        const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "?";

        if (c == ':')
                return ctl_usage(ctl, "option '%s' needs a value", arg);
        if (optopt && optopt != '?')
                return ctl_usage(ctl, "unknown option '-%c'", optopt);
        return ctl_usage(ctl, "unknown option '%s'", arg);
}

int ctl_connect(Ctl *ctl, bool probe_gpus)
{
        gpuipc_options_t o = { .struct_size = sizeof(o) };
        int r;

        if (ctl->c)
                return 0;
        o.socket_path = ctl->socket;
        o.label = "gpuipcctl";
        o.connect_timeout_ms = ctl->timeout_ms;
        o.no_gpus = !probe_gpus;
        o.no_reconnect = !ctl->reconnect;
        r = gpuipc_connect(&ctl->c, &o);
        if (r < 0) {
                fprintf(stderr, "gpuipcctl %s: cannot reach the broker: [%s] %s\n", ctl->cmd->name,
                        gpuipc_err_name(r), gpuipc_errmsg(NULL));
                json_error(ctl, gpuipc_err_name(r), gpuipc_errmsg(NULL));
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
        char message[2048];

        /* The error's name first: scripts can match it, people can search for it. The broker's
         * message says what happened; the library's text, how to fix it. */
        if (detail[0])
                snprintf(message, sizeof(message), "%s: %s", what, detail);
        else
                snprintf(message, sizeof(message), "%s: %s", what, gpuipc_strerror(err));
        fprintf(stderr, "gpuipcctl %s: %s: [%s] %s\n", ctl->cmd->name, what, gpuipc_err_name(err),
                detail[0] ? detail : gpuipc_strerror(err));
        if (detail[0])
                fprintf(stderr, "  hint: %s\n", gpuipc_strerror(err));
        json_error(ctl, gpuipc_err_name(err), message);
        return err == GPUIPC_E_NO_BROKER || err == GPUIPC_E_DISCONNECTED ? CTL_NO_BROKER : CTL_FAILED;
}

int ctl_error(Ctl *ctl, const char *name, const char *fmt, ...)
{
        char msg[1024];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "gpuipcctl %s: %s\n", ctl->cmd->name, msg);
        json_error(ctl, name, msg);
        return CTL_FAILED;
}

static int print_version(void)
{
        /* gpuipcctl uses the shared library: the one loaded may be another release. */
        printf("gpuipcctl %s\nlibgpuipc %s\n", GPUIPC_VERSION, gpuipc_version());
        return CTL_OK;
}

int main(int argc, char **argv)
{
        static const struct option longopts[] = {
                { "socket", required_argument, NULL, 's' },
                { "json", no_argument, NULL, 'j' },
                { "timeout", required_argument, NULL, 't' },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, 'V' },
                {}
        };
        static const CtlCommand global = { "", NULL, "", "", "" };
        Ctl ctl = { .timeout_ms = 5000, .cmd = &global };
        long v;
        int c, r;

        opterr = 0; /* our own messages name the option */
        /* '+': stop at the first non-option, which is the subcommand. */
        while ((c = getopt_long(argc, argv, "+:s:jt:hV", longopts, NULL)) >= 0) {
                switch (c) {
                case 's':
                        ctl.socket = optarg;
                        break;
                case 'j':
                        ctl.json = true;
                        break;
                case 't':
                        if (ctl_parse_int(&ctl, "--timeout", optarg, 0, INT32_MAX, &v))
                                return CTL_USAGE;
                        ctl.timeout_ms = (int)v;
                        break;
                case 'h':
                        usage(stdout);
                        return CTL_OK;
                case 'V':
                        return print_version();
                default:
                        ctl_bad_option(&ctl, argc, argv, c);
                        fprintf(stderr, "Try 'gpuipcctl --help'.\n");
                        return CTL_USAGE;
                }
        }
        if (optind >= argc) {
                usage(stderr);
                return CTL_USAGE;
        }
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
                if (strcmp(argv[optind], commands[i].name) != 0)
                        continue;
                ctl.cmd = &commands[i];
                argc -= optind;
                argv += optind;
                optind = 0; /* each subcommand parses its own options (0 makes glibc start afresh) */
                r = commands[i].fn(&ctl, argc, argv);
                gpuipc_close(ctl.c);
                return r;
        }
        fprintf(stderr, "gpuipcctl: unknown command '%s'\n", argv[optind]);
        usage(stderr);
        return CTL_USAGE;
}
