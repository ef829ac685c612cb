/* gpuipcctl: the operator's tool. Global options, then one subcommand. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ctl.h"

static const struct {
        const char *name;
        int (*fn)(Ctl *ctl, int argc, char **argv);
        const char *help;
} commands[] = {
        { "ping", cmd_ping, "exit 0 when the broker answers (a readiness probe)" },
        { "ls", cmd_ls, "list buffers [--prefix P]" },
        { "stat", cmd_stat, "show one buffer and who holds it: NAME or --id N" },
        { "peers", cmd_peers, "list connected peers" },
        { "stats", cmd_stats, "show the broker's counters" },
        { "metrics", cmd_metrics, "the counters in Prometheus text format" },
        { "publish", cmd_publish, "publish a buffer and hold it: --name N --size BYTES --kind K --fill PATTERN" },
        { "attach", cmd_attach, "attach a buffer: --name N [--verify PATTERN] [--timeout MS] [--hold MS|-1]" },
        { "retire", cmd_retire, "retire a buffer: NAME or --id N" },
        { "watch", cmd_watch, "print events as they happen [--prefix P]" },
        { "group", cmd_group, "join a rendezvous group: --name G --members N [--timeout MS]" },
        { "doctor", cmd_doctor, "check the socket, PID namespaces and GPUs, with a verdict for each" },
};

static void usage(FILE *f)
{
        fprintf(f, "Usage: gpuipcctl [--socket PATH] [--json] [--timeout MS] COMMAND [ARGS]\n\n"
                   "  -s, --socket PATH   the broker's socket (default: $GPUIPC_SOCKET or %s)\n"
                   "  -j, --json          machine-readable output\n"
                   "  -t, --timeout MS    how long to wait for the broker (default 5000)\n\n"
                   "Commands:\n",
                GPUIPC_DEFAULT_SOCKET);
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
        fprintf(f, "\nPatterns: counter (each 8-byte word holds its index), byte:0xAB, random:SEED\n"
                   "Exit codes: 0 ok, 1 failed (or data did not verify), 2 usage, 3 no broker\n");
}

int ctl_parse_int(const char *s, long min, long max, long *ret)
{
        char *end;
        long v;

        errno = 0;
        v = strtol(s, &end, 0);
        if (errno || end == s || *end || v < min || v > max)
                return -EINVAL;
        *ret = v;
        return 0;
}

int ctl_parse_size(const char *s, uint64_t *ret)
{
        unsigned long long v;
        char *end;
        unsigned shift = 0;

        errno = 0;
        v = strtoull(s, &end, 0);
        if (errno || end == s || s[0] == '-')
                return -EINVAL;
        switch (*end) {
        case 'K': case 'k': shift = 10; end++; break;
        case 'M': case 'm': shift = 20; end++; break;
        case 'G': case 'g': shift = 30; end++; break;
        }
        if (*end == 'i')
                end++;
        if (*end == 'B')
                end++;
        if (*end || v == 0 || v > (UINT64_MAX >> shift))
                return -EINVAL;
        *ret = (uint64_t)v << shift;
        return 0;
}

int ctl_connect(Ctl *ctl, bool probe_gpus)
{
        gpuipc_options_t o = { 0 };
        int r;

        if (ctl->c)
                return 0;
        o.socket_path = ctl->socket;
        o.label = "gpuipcctl";
        o.connect_timeout_ms = ctl->timeout_ms;
        o.no_gpus = !probe_gpus;
        r = gpuipc_connect(&ctl->c, &o);
        if (r < 0) {
                fprintf(stderr, "gpuipcctl: cannot reach the broker: %s\n", gpuipc_errmsg(NULL));
                return r == GPUIPC_E_NO_BROKER || r == -EACCES ? CTL_NO_BROKER : CTL_FAILED;
        }
        return 0;
}

int ctl_fail(Ctl *ctl, const char *what, int err)
{
        const char *detail = ctl->c ? gpuipc_errmsg(ctl->c) : "";
        char status[40] = "";

        /* The broker's status name first: scripts can match it, people can search for it. */
        if (err <= -1001 && err >= -1099)
                snprintf(status, sizeof(status), "[%s] ", proto_status_name((unsigned)(-err - 1000)));
        fprintf(stderr, "gpuipcctl: %s: %s%s%s%s\n", what, status, detail[0] ? detail : gpuipc_strerror(err),
                detail[0] ? "\n  hint: " : "", detail[0] ? gpuipc_strerror(err) : "");
        return CTL_FAILED;
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
        Ctl ctl = { .timeout_ms = 5000 };
        long v;
        int c, r;

        /* '+': stop at the first non-option, which is the subcommand. */
        while ((c = getopt_long(argc, argv, "+s:jt:hV", longopts, NULL)) >= 0) {
                switch (c) {
                case 's':
                        ctl.socket = optarg;
                        break;
                case 'j':
                        ctl.json = true;
                        break;
                case 't':
                        if (ctl_parse_int(optarg, 0, INT32_MAX, &v) < 0) {
                                fprintf(stderr, "gpuipcctl: --timeout needs milliseconds\n");
                                return CTL_USAGE;
                        }
                        ctl.timeout_ms = (int)v;
                        break;
                case 'h':
                        usage(stdout);
                        return CTL_OK;
                case 'V':
                        printf("gpuipcctl %s\n", GPUIPC_VERSION);
                        return CTL_OK;
                default:
                        usage(stderr);
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
