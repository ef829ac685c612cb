/* gpuipc-broker: parses flags, binds the socket (or takes an inherited one), drops privileges,
 * loads the seccomp filter and runs the server. What it must never do: run the loop unconfined,
 * or confine before what needs more than the runtime allow-list is done (binding, privileges, the
 * policy file and its inotify watch, the loop's handles): the order below is the security model. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <malloc.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "audit.h"
#include "clock.h"
#include "config.h"
#include "fair.h"
#include "hmap.h"
#include "landlock.h"
#include "broker-limits.h"
#include "budget.h"
#include "log.h"
#include "macro.h"
#include "policy.h"
#include "policywatch.h"
#include "privs.h"
#include "proto.h"
#include "sandbox.h"
#include "sdnotify.h"
#include "server.h"
#include "sockpath.h"

/* A policy is a few dozen rules; a megabyte bounds what a wrong path (a log, a device image) can
 * make the broker read and parse at start and on every reload. */
#define POLICY_MAX_BYTES (1u << 20)

typedef struct Options {
        const char *socket_path;
        int listen_fd;
        mode_t socket_mode;
        const char *socket_group;
        const char *user, *group;
        const char *policy_path;
        SandboxMode seccomp;
        bool log_json;
        LogLevel log_level;
        bool audit;
        uint32_t audit_rate;
        Limits limits;
        uint32_t restart_grace_ms;
        bool cpu_limit_set;       /* --cpu-limit given: the cgroup's quota is not looked at */
        uint32_t cpu_limit_milli; /* 0: none */
} Options;

/* The smallest budget a flag may set: below it a handful of connections would fill it. */
#define MEMORY_BUDGET_MIN (1u << 20)

/* After a restart, how long holders of the old broker have to come back and reclaim what they hold
 * before buffers they held may drain (docs/design.md "Broker restarts"): longer than a consumer
 * that does not watch gpuipc_fd() takes between two calls. */
#define RESTART_GRACE_MS_DEFAULT 10000

/* The --max-* flags: each sets one field of Limits (broker-limits.h) to a number from 1 to
 * 2^32 - 1. One table serves parsing and --help, so a new limit is one line here. */
static const struct LimitFlag {
        const char *name;
        size_t offset; /* of the uint32_t it sets in Limits */
        const char *help;
} limit_flags[] = {
        { "max-connections", offsetof(Limits, connections), "" },
        { "max-connections-per-uid", offsetof(Limits, connections_per_uid), "" },
        { "max-buffers-per-uid", offsetof(Limits, buffers_per_uid), "" },
        { "max-fds-per-uid", offsetof(Limits, fds_per_uid), "" },
        { "max-refs-per-peer", offsetof(Limits, refs_per_peer), "" },
        { "max-waits-per-peer", offsetof(Limits, waits_per_peer), "" },
        { "max-subs-per-peer", offsetof(Limits, subs_per_peer), "" },
        { "max-claims-per-uid", offsetof(Limits, claims_per_uid), "pending reclaims of a uid's peers " },
        { "max-claims", offsetof(Limits, claims), "pending reclaims of all peers " },
        { "max-queued-bytes", offsetof(Limits, queued_bytes), "" },
        { "max-queued-fds", offsetof(Limits, queued_fds), "" },
        { "max-timeout-ms", offsetof(Limits, max_timeout_ms), "longest wait a peer may ask for " },
};

/* Every Limits field the table names is a uint32_t (the offsets are offsetof's, so a field that
 * moves keeps its flag); a field of another type must not be listed here. */
static uint32_t *limit_field(Limits *l, const struct LimitFlag *flag)
{
        return (uint32_t *)((char *)l + flag->offset);
}

static void usage(FILE *f)
{
        Limits defaults = LIMITS_DEFAULT;

        fprintf(f,
                "Usage: gpuipc-broker [OPTIONS]\n"
                "Brokers GPU and host buffers between processes over a Unix socket.\n\n"
                "  -s, --socket PATH            socket to create (default: $GPUIPC_SOCKET or %s)\n"
                "      --listen-fd N            serve an inherited, bound and listening socket instead (socket\n"
                "                               activation, LISTEN_FDS, needs neither this nor --socket)\n"
                "      --socket-mode MODE       permissions of the socket file, octal (default 0660)\n"
                "      --socket-group GROUP     group of the socket file (name or number)\n"
                "  -u, --user USER              when started as root, switch to this user after binding\n"
                "  -g, --group GROUP            ... and this group (default: the user's group)\n"
                "      --seccomp MODE           enforce (default), log or off\n"
                "  -p, --policy FILE            authorization rules (docs/security.md); SIGHUP reloads\n"
                "      --log-format FORMAT      text (default) or json\n"
                "      --log-level LEVEL        debug, info (default), warn or error\n"
                "      --audit on|off           the audit trail: a record per publish, attach, release, retire,\n"
                "                               refusal and departure, whatever the log level (default on)\n"
                "      --audit-rate N           audit records a second at most, a uid a quarter of them (default\n"
                "                               %u)\n",
                GPUIPC_DEFAULT_SOCKET, AUDIT_RATE_DEFAULT);
        for (size_t i = 0; i < ARRAY_SIZE(limit_flags); i++) {
                char flag[64];

                snprintf(flag, sizeof(flag), "%s N", limit_flags[i].name);
                fprintf(f, "      --%-31s%s(default %u)\n", flag, limit_flags[i].help,
                        *limit_field(&defaults, &limit_flags[i]));
        }
        fprintf(f,
                "      --memory-budget BYTES    memory for everything peers make the broker keep (suffix K, M or\n"
                "                               G; default: half the cgroup's memory.max, else a quarter of RAM)\n"
                "      --memory-budget-per-uid BYTES  one uid's share of it (default: a quarter of the budget)\n"
                "      --cpu-limit CPUS         CPU the broker keeps its use under, slowing the peers that use the\n"
                "                               most (250m or 0.25; none: no limit; default: the cgroup's quota)\n"
                "      --max-held-memory-per-uid BYTES  broker-held memory (loaded weights) a uid may have\n"
                "                               registered (suffix K, M or G; default: no limit)\n"
                "      --restart-grace-ms N     after a restart, how long reconnecting holders may reclaim\n"
                "                               before buffers they held drain (default %u; 0: no grace)\n"
                "  -V, --version\n"
                "  -h, --help\n",
                RESTART_GRACE_MS_DEFAULT);
}

enum {
        OPT_LISTEN_FD = 256,
        OPT_SOCKET_MODE,
        OPT_SOCKET_GROUP,
        OPT_SECCOMP,
        OPT_LOG_FORMAT,
        OPT_LOG_LEVEL,
        OPT_AUDIT,
        OPT_AUDIT_RATE,
        OPT_RESTART_GRACE,
        OPT_MEMORY_BUDGET,
        OPT_MEMORY_PER_UID,
        OPT_CPU_LIMIT,
        OPT_MAX_HELD_MEMORY,
        OPT_LIMIT = 512, /* OPT_LIMIT + i: limit_flags[i] */
};

/* strtoull accepts "-1" as 2^64 - 1: a leading '-' is refused explicitly, and so is anything
 * after the digits, so "10s" is not read as 10. */
static int parse_uint(const char *s, unsigned base, uint64_t max, uint64_t *ret)
{
        char *end;
        unsigned long long v;

        errno = 0;
        v = strtoull(s, &end, (int)base);
        if (errno || end == s || *end || v > max || s[0] == '-')
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_limit(const char *name, const char *s, uint32_t *ret)
{
        uint64_t v;

        /* 0 would mean "nothing allowed" for a limit, which no one means: refused, not clamped. */
        if (parse_uint(s, 10, UINT32_MAX, &v) < 0 || v == 0) {
                fprintf(stderr, "gpuipc-broker: --%s needs a number from 1 to %u, not '%s'\n", name, UINT32_MAX, s);
                return -EINVAL;
        }
        *ret = (uint32_t)v;
        return 0;
}

static int parse_memory(const char *name, const char *s, uint64_t *ret)
{
        if (budget_parse_size(s, ret) < 0 || *ret < MEMORY_BUDGET_MIN) {
                fprintf(stderr,
                        "gpuipc-broker: --%s needs a size of at least 1M (bytes, or with K, M or G), not '%s'\n",
                        name, s);
                return -EINVAL;
        }
        return 0;
}

static int parse_socket_mode(const char *s, mode_t *ret)
{
        uint64_t v;

        if (parse_uint(s, 8, 0777, &v) < 0) {
                fprintf(stderr, "gpuipc-broker: --socket-mode needs an octal mode like 0660, not '%s'\n", s);
                return -EINVAL;
        }
        /* Connecting needs write access: a mode that gives read and write to nobody starts a broker
         * no peer can reach. */
        if ((v & 0600) != 0600 && (v & 060) != 060 && (v & 06) != 06) {
                fprintf(stderr, "gpuipc-broker: --socket-mode %s lets no peer connect: give read and write to the "
                        "owner, the group or others (e.g. 0660)\n", s);
                return -EINVAL;
        }
        *ret = (mode_t)v;
        return 0;
}

static int parse_args(int argc, char **argv, Options *o)
{
        static const struct option base_opts[] = {
                { "socket", required_argument, NULL, 's' },
                { "listen-fd", required_argument, NULL, OPT_LISTEN_FD },
                { "socket-mode", required_argument, NULL, OPT_SOCKET_MODE },
                { "socket-group", required_argument, NULL, OPT_SOCKET_GROUP },
                { "user", required_argument, NULL, 'u' },
                { "group", required_argument, NULL, 'g' },
                { "seccomp", required_argument, NULL, OPT_SECCOMP },
                { "policy", required_argument, NULL, 'p' },
                { "log-format", required_argument, NULL, OPT_LOG_FORMAT },
                { "log-level", required_argument, NULL, OPT_LOG_LEVEL },
                { "audit", required_argument, NULL, OPT_AUDIT },
                { "audit-rate", required_argument, NULL, OPT_AUDIT_RATE },
                { "restart-grace-ms", required_argument, NULL, OPT_RESTART_GRACE },
                { "memory-budget", required_argument, NULL, OPT_MEMORY_BUDGET },
                { "memory-budget-per-uid", required_argument, NULL, OPT_MEMORY_PER_UID },
                { "cpu-limit", required_argument, NULL, OPT_CPU_LIMIT },
                { "max-held-memory-per-uid", required_argument, NULL, OPT_MAX_HELD_MEMORY },
                { "version", no_argument, NULL, 'V' },
                { "help", no_argument, NULL, 'h' },
        };
        struct option longopts[ARRAY_SIZE(base_opts) + ARRAY_SIZE(limit_flags) + 1] = { 0 };
        uint64_t v;
        int c;

        memcpy(longopts, base_opts, sizeof(base_opts));
        for (size_t i = 0; i < ARRAY_SIZE(limit_flags); i++)
                longopts[ARRAY_SIZE(base_opts) + i] =
                        (struct option){ limit_flags[i].name, required_argument, NULL, OPT_LIMIT + (int)i };
        while ((c = getopt_long(argc, argv, "s:u:g:p:Vh", longopts, NULL)) >= 0) {
                if (c >= OPT_LIMIT && c < OPT_LIMIT + (int)ARRAY_SIZE(limit_flags)) {
                        const struct LimitFlag *flag = &limit_flags[c - OPT_LIMIT];

                        if (parse_limit(flag->name, optarg, limit_field(&o->limits, flag)) < 0)
                                return -EINVAL;
                        continue;
                }
                switch (c) {
                case 's':
                        if (!*optarg) {
                                fprintf(stderr, "gpuipc-broker: --socket needs a path, not an empty string\n");
                                return -EINVAL;
                        }
                        o->socket_path = optarg;
                        break;
                case OPT_LISTEN_FD:
                        /* 0 to 2 are stdin, stdout and stderr: never a listening socket. */
                        if (parse_uint(optarg, 10, INT32_MAX, &v) < 0 || v < 3) {
                                fprintf(stderr, "gpuipc-broker: --listen-fd needs an fd number of 3 or more\n");
                                return -EINVAL;
                        }
                        o->listen_fd = (int)v;
                        break;
                case OPT_SOCKET_MODE:
                        if (parse_socket_mode(optarg, &o->socket_mode) < 0)
                                return -EINVAL;
                        break;
                case OPT_SOCKET_GROUP:
                        o->socket_group = optarg;
                        break;
                case 'u':
                        o->user = optarg;
                        break;
                case 'g':
                        o->group = optarg;
                        break;
                case OPT_SECCOMP:
                        if (sandbox_mode_from_name(optarg, &o->seccomp) < 0) {
                                fprintf(stderr, "gpuipc-broker: --seccomp is enforce, log or off\n");
                                return -EINVAL;
                        }
                        break;
                case 'p':
                        o->policy_path = optarg;
                        break;
                case OPT_LOG_FORMAT:
                        if (strcmp(optarg, "json") && strcmp(optarg, "text")) {
                                fprintf(stderr, "gpuipc-broker: --log-format is text or json\n");
                                return -EINVAL;
                        }
                        o->log_json = strcmp(optarg, "json") == 0;
                        break;
                case OPT_LOG_LEVEL:
                        if (log_level_from_name(optarg, &o->log_level) < 0) {
                                fprintf(stderr, "gpuipc-broker: --log-level is debug, info, warn or error\n");
                                return -EINVAL;
                        }
                        break;
                case OPT_AUDIT:
                        if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                                fprintf(stderr, "gpuipc-broker: --audit is on or off\n");
                                return -EINVAL;
                        }
                        o->audit = strcmp(optarg, "on") == 0;
                        break;
                case OPT_AUDIT_RATE:
                        if (parse_uint(optarg, 10, AUDIT_RATE_MAX, &v) < 0 || v == 0) {
                                fprintf(stderr, "gpuipc-broker: --audit-rate needs a number from 1 to %u, not '%s'\n",
                                        AUDIT_RATE_MAX, optarg);
                                return -EINVAL;
                        }
                        o->audit_rate = (uint32_t)v;
                        break;
                case OPT_RESTART_GRACE: {
                        uint64_t grace;

                        /* A day at most: a longer grace would keep drained buffers' memory pinned
                         * for a holder that is not coming back. */
                        if (parse_uint(optarg, 10, 24u * 3600u * 1000u, &grace) < 0) {
                                fprintf(stderr, "gpuipc-broker: --restart-grace-ms needs a number from 0 to 86400000, "
                                        "not '%s'\n", optarg);
                                return -EINVAL;
                        }
                        o->restart_grace_ms = (uint32_t)grace;
                        break;
                }
                case OPT_MAX_HELD_MEMORY:
                        if (parse_memory("max-held-memory-per-uid", optarg, &o->limits.held_memory_per_uid) < 0)
                                return -EINVAL;
                        break;
                case OPT_MEMORY_BUDGET:
                case OPT_MEMORY_PER_UID:
                        if (parse_memory(c == OPT_MEMORY_BUDGET ? "memory-budget" : "memory-budget-per-uid", optarg,
                                         c == OPT_MEMORY_BUDGET ? &o->limits.memory_budget
                                                                : &o->limits.memory_per_uid) < 0)
                                return -EINVAL;
                        break;
                case OPT_CPU_LIMIT:
                        if (fair_parse_cpu_limit(optarg, &o->cpu_limit_milli) < 0) {
                                fprintf(stderr, "gpuipc-broker: --cpu-limit is thousandths of a CPU (250m), CPUs "
                                        "(0.25, 2) or none, at most 1000 CPUs, not '%s'\n", optarg);
                                return -EINVAL;
                        }
                        o->cpu_limit_set = true;
                        break;
                case 'V':
                        /* What a bug report needs: the release, the wire protocol, the sandbox built in. */
                        printf("gpuipc-broker %s\nprotocol %d\nseccomp filter %s\n", GPUIPC_VERSION, PROTO_VERSION,
                               HAVE_SECCOMP ? "built in" : "not built (no libseccomp at build time)");
                        exit(EXIT_SUCCESS);
                case 'h':
                        usage(stdout);
                        exit(EXIT_SUCCESS);
                default:
                        usage(stderr);
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "gpuipc-broker: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        return 0;
}

/* Reads and parses the policy file; logs what is wrong and where. Only a regular file is read:
 * opening a FIFO would block the broker (at start, or every peer on SIGHUP) until someone writes. */
static int load_policy(const char *path, Policy **ret)
{
        _cleanup_free_ char *text = NULL;
        _cleanup_close_ int fd = -1;
        struct stat st;
        char err[256];
        size_t len = 0;
        int r;

        /* O_NONBLOCK: opening a FIFO does not wait for a writer; O_NOCTTY: a tty named by mistake
         * does not become the broker's controlling terminal. */
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0) {
                r = -errno;
                log_error("cannot open the policy file", "path=%s error=\"%s\"", path, strerror(errno));
                return r;
        }
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
                log_error("the policy file is not a regular file", "path=%s", path);
                return -EINVAL;
        }
        /* One buffer of the limit, read until EOF: st_size is not trusted (a file may grow while it
         * is read, and /proc-like files report 0). */
        text = malloc(POLICY_MAX_BYTES);
        if (!text)
                return -ENOMEM;
        for (;;) {
                ssize_t n = read(fd, text + len, POLICY_MAX_BYTES - len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        log_error("cannot read the policy file", "path=%s error=\"%s\"", path, strerror(errno));
                        return r;
                }
                if (n == 0)
                        break;
                len += (size_t)n;
                if (len == POLICY_MAX_BYTES) {
                        log_error("the policy file is too large", "path=%s limit_bytes=%u", path, POLICY_MAX_BYTES);
                        return -EFBIG;
                }
        }
        r = policy_parse(text, len, ret, err, sizeof(err));
        if (r < 0) {
                log_error("the policy file is invalid", "path=%s error=\"%s\"", path,
                          r == -EINVAL ? err : strerror(-r));
                return r;
        }
        /* Legal, and maybe meant (a lock-down), but far more often a ConfigMap that lost its key. */
        if (policy_rule_count(*ret) == 0)
                log_warn("the policy file has no rules: every publish, attach, subscribe and group join is denied",
                         "path=%s", path);
        return 0;
}

static int reload_policy(void *userdata, Policy **ret)
{
        const char *path = userdata;

        if (!path) {
                *ret = NULL;
                return 0;
        }
        return load_policy(path, ret);
}

/* Every fd the broker sends stays charged to its uid until the peer reads it (the kernel's unix
 * in-flight accounting), and both that and the broker's own fd table are bounded by the soft
 * RLIMIT_NOFILE: take all the hard limit allows. Returns the soft limit now in force. */
static rlim_t raise_fd_limit(void)
{
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return 0;
        if (rl.rlim_cur < rl.rlim_max) {
                rlim_t was = rl.rlim_cur;

                rl.rlim_cur = rl.rlim_max;
                if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
                        log_warn("cannot raise the fd limit", "soft=%llu hard=%llu error=\"%s\"",
                                 (unsigned long long)was, (unsigned long long)rl.rlim_max, strerror(errno));
                        return was;
                }
        }
        return rl.rlim_cur;
}

/* Reads a small text file (a /proc or cgroup file) into buf. 0 or -errno. */
static int read_text(const char *path, char *buf, size_t cap)
{
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        ssize_t n;

        if (fd < 0)
                return -errno;
        n = read(fd, buf, cap - 1);
        if (n < 0)
                return -errno;
        buf[n] = 0;
        return 0;
}

/* The memory limit of the broker's cgroup (v2): the lowest memory.max from its own cgroup up to the
 * root of what this mount namespace shows. UINT64_MAX when there is none (cgroup v1, no limit, no
 * /sys/fs/cgroup). Read once at start, before Landlock closes /sys. */
static uint64_t cgroup_memory_limit(void)
{
        char text[4096], path[PATH_MAX], file[PATH_MAX + 64];
        uint64_t limit = UINT64_MAX, v;

        if (read_text("/proc/self/cgroup", text, sizeof(text)) < 0 ||
            budget_parse_cgroup(text, path, sizeof(path)) < 0)
                return UINT64_MAX;
        for (;;) {
                char *slash;

                snprintf(file, sizeof(file), "/sys/fs/cgroup%s/memory.max", strcmp(path, "/") ? path : "");
                if (read_text(file, text, sizeof(text)) == 0 && budget_parse_memory_max(text, &v) == 0)
                        limit = MIN(limit, v);
                slash = strrchr(path, '/');
                if (!slash || slash == path)
                        break;
                *slash = 0;
        }
        return limit;
}

/* The CPU quota of the broker's cgroup, in thousandths of a CPU: the lowest from its own cgroup up
 * to the root of what this mount namespace shows, under cgroup v2 (cpu.max) and v1 (the cpu
 * controller's cpu.cfs_quota_us). 0 when there is none. Read once at start, before Landlock. */
static uint32_t cgroup_cpu_limit(void)
{
        char text[4096], path[PATH_MAX], file[PATH_MAX + 64], period[64];
        uint32_t limit = 0, v;
        bool v2;

        if (read_text("/proc/self/cgroup", text, sizeof(text)) < 0)
                return 0;
        v2 = fair_parse_cgroup_v1(text, "cpu", path, sizeof(path)) < 0;
        if (v2 && budget_parse_cgroup(text, path, sizeof(path)) < 0)
                return 0;
        for (;;) {
                const char *at = strcmp(path, "/") ? path : "";
                char *slash;
                int r;

                if (v2) {
                        snprintf(file, sizeof(file), "/sys/fs/cgroup%s/cpu.max", at);
                        r = read_text(file, text, sizeof(text)) < 0 ? -1 : fair_parse_cpu_max(text, &v);
                } else {
                        snprintf(file, sizeof(file), "/sys/fs/cgroup/cpu%s/cpu.cfs_period_us", at);
                        r = read_text(file, period, sizeof(period));
                        snprintf(file, sizeof(file), "/sys/fs/cgroup/cpu%s/cpu.cfs_quota_us", at);
                        if (r == 0)
                                r = read_text(file, text, sizeof(text)) < 0 ? -1 : fair_parse_cfs(text, period, &v);
                }
                if (r == 0 && v && (!limit || v < limit))
                        limit = v;
                slash = strrchr(path, '/');
                if (!slash || slash == path)
                        break;
                *slash = 0;
        }
        return limit;
}

/* The CPU limit a flag did not set: the cgroup's. Says which is in force. */
static void cpu_limit_setup(Options *o)
{
        if (!o->cpu_limit_set)
                o->cpu_limit_milli = cgroup_cpu_limit();
        log_info("cpu limit", "millicpus=%u source=%s", o->cpu_limit_milli, o->cpu_limit_set ? "flag" : "cgroup");
}

/* Fills in the budget a flag did not set: from the container's limit (budget_default), and a uid's
 * share. Says where it came from. */
static void memory_budget_setup(Limits *l)
{
        uint64_t cgroup = UINT64_MAX, phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
        const char *source = "flag";

        if (!l->memory_budget) {
                cgroup = cgroup_memory_limit();
                l->memory_budget = budget_default(cgroup, phys);
                source = cgroup != UINT64_MAX ? "cgroup" : "ram";
        }
        if (!l->memory_per_uid)
                l->memory_per_uid = budget_default_share(l->memory_budget);
        if (l->memory_per_uid > l->memory_budget) {
                log_warn("--memory-budget-per-uid is larger than the budget; a uid may take all of it",
                         "per_uid=%llu budget=%llu", (unsigned long long)l->memory_per_uid,
                         (unsigned long long)l->memory_budget);
                l->memory_per_uid = l->memory_budget;
        }
        log_info("memory budget", "budget=%llu per_uid=%llu source=%s cgroup_limit=%llu",
                 (unsigned long long)l->memory_budget, (unsigned long long)l->memory_per_uid, source,
                 cgroup == UINT64_MAX ? 0ULL : (unsigned long long)cgroup);
}

/* getrandom without GRND_NONBLOCK: at early boot it waits for the entropy pool rather than hand
 * out guessable ids. */
static uint64_t random_u64(void)
{
        uint64_t v = 0;

        while (getrandom(&v, sizeof(v), 0) < 0 && errno == EINTR)
                ;
        return v ? v : 1;
}

/* Names are chosen by peers: an unseeded hash would let one pick names that all land in one
 * bucket and turn every lookup into a list walk. */
static void seed_hashes(void)
{
        uint8_t key[16] = { 0 };

        while (getrandom(key, sizeof(key), 0) < 0 && errno == EINTR)
                ;
        hash_seed(key);
}

/* Where generations start counting: above every generation a broker that read the wall clock gave
 * (microseconds since 1970, below 2^52 until the year 2112), so that holds survive an upgrade from
 * one, and 142 years of uptime below 2^53, so that JSON tools keep them exact as they keep ids. */
#define GENERATION_BASE (UINT64_C(1) << 52)

/* Generations start at the time since boot in microseconds (CLOCK_BOOTTIME), so that a restarted
 * broker's generations lie above its predecessor's (which published far fewer than one buffer per
 * microsecond) however the wall clock was set in between: that clock never steps. A boot is all
 * the order has to span, since no memory, and so no hold, outlives one (docs/design.md "Broker
 * restarts"). */
static uint64_t first_generation(void)
{
        return GENERATION_BASE + clock_ns(CLOCK_BOOTTIME) / 1000;
}

/* Which socket to serve: the one systemd passed (socket activation), else --listen-fd, --socket,
 * $GPUIPC_SOCKET or the default path. False, said in the log, when they contradict each other. */
static bool pick_socket(Options *o)
{
        int activated, r;

        r = sdnotify_listen_fd(&activated);
        if (r < 0)
                return false;
        if (r > 0) {
                /* A path or fd given too would leave which one is served to chance. */
                if (o->socket_path || o->listen_fd >= 0) {
                        log_error("systemd passed a listening socket and --socket or --listen-fd names another; "
                                  "drop the option (socket activation) or the .socket unit", NULL);
                        return false;
                }
                o->listen_fd = activated;
        }
        if (!o->socket_path && o->listen_fd < 0) {
                o->socket_path = getenv("GPUIPC_SOCKET");
                if (o->socket_path && !*o->socket_path) {
                        log_error("GPUIPC_SOCKET is set but empty; unset it for the default socket, or give a path",
                                  NULL);
                        return false;
                }
        }
        if (!o->socket_path)
                o->socket_path = GPUIPC_DEFAULT_SOCKET;
        return true;
}

/* What the process is set up with before anything else runs: signals, the allocator, the memory
 * budget, hash seeds and the fd limit. Returns the fd limit in force. */
static rlim_t tune_process(Limits *limits)
{
        rlim_t fd_limit;

        /* A peer that closes its end must cost an EPIPE, not the broker. */
        signal(SIGPIPE, SIG_IGN);
        /* Fixed thresholds: glibc would otherwise raise both after large frees, keeping the memory of
         * peers that left in the heap. Large blocks come from mmap and go back when freed. */
        mallopt(M_TRIM_THRESHOLD, 128 * 1024);
        mallopt(M_MMAP_THRESHOLD, 256 * 1024);
        /* Once before the filter: the first malloc_trim sets glibc's allocator up, which asks for
         * random bytes (getrandom, outside the allow-list). Under a sanitizer nothing else uses
         * glibc's allocator before the server loop's first trim. */
        malloc_trim(0);
        memory_budget_setup(limits);
        seed_hashes();
        fd_limit = raise_fd_limit();
        /* Each peer may leave --max-queued-fds fds unread, and the kernel charges all of them to the
         * broker's uid up to this limit: beyond it, fds to peers that do read would have to wait. */
        if ((uint64_t)limits->connections * limits->queued_fds > fd_limit)
                log_warn("peers that do not read could hold every fd the kernel lets the broker have in flight; "
                         "raise the hard RLIMIT_NOFILE or lower --max-connections or --max-queued-fds",
                         "fd_limit=%llu max_connections=%u max_queued_fds=%u", (unsigned long long)fd_limit,
                         limits->connections, limits->queued_fds);
        return fd_limit;
}

/* The listening socket: the inherited one (--listen-fd, socket activation), or one bound at the
 * socket path. -1 once the failure is logged. */
static int open_listener(const Options *o, const Privs *privs)
{
        int fd;

        if (o->listen_fd >= 0) {
                fd = sockpath_adopt(o->listen_fd);
                if (fd >= 0)
                        log_info("serving an inherited socket", "fd=%d", fd);
                return fd < 0 ? -1 : fd;
        }
        fd = sockpath_listen(o->socket_path, o->socket_mode, privs->socket_gid,
                             privs->switch_user ? privs->uid : geteuid());
        if (fd >= 0)
                log_info("listening", "socket=%s mode=%04o", o->socket_path, (unsigned)o->socket_mode);
        return fd < 0 ? -1 : fd;
}

/* Locks the process down once everything that needs more than the allow-list is done (libuv starts
 * no threads of its own for what we use). Landlock first: its own system calls are not on the
 * runtime allow-list. 0, or <0 once logged. */
static int confine(const Options *o)
{
        int r;

        if (o->seccomp != SANDBOX_OFF) {
                r = landlock_confine(o->listen_fd < 0 ? o->socket_path : NULL, o->policy_path);
                if (r < 0 && r != -EOPNOTSUPP)
                        return r;
        }
        return sandbox_apply(o->seccomp);
}

int main(int argc, char **argv)
{
        Options o = {
                .listen_fd = -1,
                .socket_mode = 0660,
                .seccomp = SANDBOX_ENFORCE,
                .log_level = LOG_INFO,
                .audit = true,
                .audit_rate = AUDIT_RATE_DEFAULT,
                .limits = LIMITS_DEFAULT,
                .restart_grace_ms = RESTART_GRACE_MS_DEFAULT,
        };
        ServerConfig cfg = { 0 };
        Server *server = NULL;
        Policy *policy = NULL;
        rlim_t fd_limit;
        Privs privs;
        int fd, r, notify_fd;

        if (parse_args(argc, argv, &o) < 0)
                return 2;
        log_setup(o.log_json, o.log_level);
        audit_setup(o.audit, o.audit_rate);
        if (!pick_socket(&o))
                return 2;
        fd_limit = tune_process(&o.limits);
        cpu_limit_setup(&o);
        r = privs_resolve(o.user, o.group, o.socket_group, &privs);
        if (r < 0)
                return 2;
        if (o.policy_path && load_policy(o.policy_path, &policy) < 0)
                return 2;
        fd = open_listener(&o, &privs);
        if (fd < 0)
                return 1;

        /* Privileges go once the socket is bound (a path under /run may need root) and the policy is
         * read, before anything a peer sends is parsed. */
        r = privs_drop(&privs);
        if (r < 0)
                return 1;

        cfg.listen_fd = fd;
        cfg.limits = o.limits;
        cfg.epoch = random_u64();
        cfg.id_seed = random_u64();
        cfg.first_generation = first_generation();
        cfg.restart_grace_ms = o.restart_grace_ms;
        cfg.cpu_limit_milli = o.cpu_limit_milli;
        cfg.policy = policy;
        cfg.reload_policy = reload_policy;
        cfg.reload_userdata = (void *)o.policy_path;
        /* A policy replaced on disk (a ConfigMap update, an edit) takes effect like SIGHUP. */
        if (o.policy_path && policy_watch_new(&cfg.policy_watch, o.policy_path) < 0)
                return 1;
        r = server_new(&server, &cfg);
        if (r < 0) {
                log_error("cannot start the event loop", "error=\"%s\"", strerror(-r));
                policy_watch_free(cfg.policy_watch);
                return 1;
        }

        /* Connected now, while socket(2) and connect(2) are allowed; the notification itself is a
         * sendto(2) that never blocks, sent once the filter is loaded, just before the loop accepts. */
        notify_fd = sdnotify_open();
        if (confine(&o) < 0) {
                server_free(server);
                return 1;
        }
        log_info("ready", "version=%s seccomp=%s policy=%s rules=%zu fd_limit=%llu", GPUIPC_VERSION,
                 sandbox_mode_name(o.seccomp), o.policy_path ? o.policy_path : "default", policy_rule_count(policy),
                 (unsigned long long)fd_limit);
        /* Type=notify: the unit is active (and units ordered after it start) only now. */
        sdnotify_send(notify_fd, "READY=1\nSTATUS=serving");
        server_run(server);
        sdnotify_send(notify_fd, "STOPPING=1");
        if (notify_fd >= 0)
                close(notify_fd);
        server_free(server);
        /* Only a socket we made is removed: an inherited one belongs to systemd (or whoever passed
         * it), which may hand it to the next instance. */
        if (o.listen_fd < 0)
                sockpath_unlink(o.socket_path);
        log_info("stopped", NULL);
        return 0;
}
