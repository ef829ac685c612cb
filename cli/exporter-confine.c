/* The metrics exporter's confinement; see exporter-confine.h. The filter is built in one function
 * and loaded in another, as the broker's is; a call outside the allow-list traps, and the handler
 * makes it fail with ENOSYS after logging it (async-signal-safe: the names are resolved before the
 * filter exists). */
#include "exporter-confine.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "config.h"

static int scmp_open(const char **why);

/* ---- Landlock: no file, no TCP ---- */

#define FS_V1 ((1ULL << 13) - 1)  /* EXECUTE .. MAKE_SYM */
#define FS_REFER (1ULL << 13)     /* ABI 2 */
#define FS_TRUNCATE (1ULL << 14)  /* ABI 3 */
#define FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */
#define NET_BIND_TCP (1ULL << 0)  /* ABI 4 */
#define NET_CONNECT_TCP (1ULL << 1)

/* The ruleset attribute of ABI 4 and later (linux/landlock.h of older kernels lacks the net field).
 * The size passed with it tells the kernel which layout it is: kernels before ABI 4 are given only
 * the first field, the struct they know. */
struct ruleset_attr {
        uint64_t handled_access_fs;
        uint64_t handled_access_net;
};

/* Handles every access right this kernel knows and grants none: each right the ABI adds is
 * handled only where the kernel knows it (an unknown bit makes the whole ruleset EINVAL), so the
 * exporter is as confined as the kernel can make it, on old kernels too. */
static int landlock_nothing(const char **why)
{
        long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
        struct ruleset_attr attr = { .handled_access_fs = FS_V1 };
        size_t size = sizeof(attr.handled_access_fs);
        int ruleset, r = 0;

        /* No Landlock (an old kernel, or one built without it) is not fatal: seccomp still stands,
         * and refusing to serve would leave a cluster without metrics for a missing second layer. */
        if (abi < 0) {
                fprintf(stderr, "gpuipcctl metrics: landlock is not available (%s); seccomp alone confines the "
                        "exporter\n", strerror(errno));
                return 0;
        }
        if (abi >= 2)
                attr.handled_access_fs |= FS_REFER;
        if (abi >= 3)
                attr.handled_access_fs |= FS_TRUNCATE;
        if (abi >= 4) {
                /* No rule for them: the exporter's socket listens already (cmd-metrics.c binds
                 * it before confining), and accepting on it is neither a bind nor a connect, so
                 * it serves on but can open no other TCP port and reach no TCP address. */
                attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP;
                size = sizeof(attr);
        }
        if (abi >= 5)
                attr.handled_access_fs |= FS_IOCTL_DEV;
        /* Everything handled and no rule: nothing is allowed (but to a sanitizer's runtime, which reads
         * /proc at exit, in sanitizer builds). */
        ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
        if (ruleset >= 0 && GPUIPC_SANITIZED) {
                struct landlock_path_beneath_attr pb = {
                        .allowed_access = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR,
                        .parent_fd = open("/proc", O_PATH | O_CLOEXEC),
                };
                if (pb.parent_fd >= 0) {
                        (void)syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
                        close(pb.parent_fd);
                }
        }
        if (ruleset < 0 || syscall(SYS_landlock_restrict_self, ruleset, 0) < 0) {
                r = -errno;
                *why = "landlock refused the ruleset";
        }
        if (ruleset >= 0)
                close(ruleset);
        return r;
}

/* ---- seccomp ---- */

#if HAVE_SECCOMP
#include <dlfcn.h>
#include <seccomp.h>

#include "gpuipcctl-metrics-allow.h"

/* libseccomp is loaded when the exporter confines itself, not linked, its calls resolved at run time
 * like libmicrohttpd's (http.c): gpuipcctl ships in the client image for application containers,
 * whose other commands need libc alone. */
static struct {
        scmp_filter_ctx (*init)(uint32_t def_action);
        void (*release)(scmp_filter_ctx ctx);
        int (*rule_add_array)(scmp_filter_ctx ctx, uint32_t action, int syscall, unsigned int arg_cnt,
                              const struct scmp_arg_cmp *arg_array);
        int (*load)(const scmp_filter_ctx ctx);
        int (*resolve_name)(const char *name);
        char *(*resolve_num_arch)(uint32_t arch_token, int num);
} scmp;

static int scmp_open(const char **why)
{
        void *h;

        if (scmp.init)
                return 0;
        h = dlopen("libseccomp.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
                *why = "libseccomp.so.2 cannot be loaded (install libseccomp2)";
                return -ENOENT;
        }
        scmp.init = (scmp_filter_ctx (*)(uint32_t))dlsym(h, "seccomp_init");
        scmp.release = (void (*)(scmp_filter_ctx))dlsym(h, "seccomp_release");
        scmp.rule_add_array = (int (*)(scmp_filter_ctx, uint32_t, int, unsigned int,
                                       const struct scmp_arg_cmp *))dlsym(h, "seccomp_rule_add_array");
        scmp.load = (int (*)(const scmp_filter_ctx))dlsym(h, "seccomp_load");
        scmp.resolve_name = (int (*)(const char *))dlsym(h, "seccomp_syscall_resolve_name");
        scmp.resolve_num_arch = (char *(*)(uint32_t, int))dlsym(h, "seccomp_syscall_resolve_num_arch");
        if (!scmp.init || !scmp.release || !scmp.rule_add_array || !scmp.load || !scmp.resolve_name ||
            !scmp.resolve_num_arch) {
                *why = "libseccomp.so.2 lacks a function the exporter needs";
                return -ENOSYS;
        }
        return 0; /* (the handle stays open: the filter's names and the library live as long as we do) */
}

/* Above every syscall number of x86_64 and aarch64 today (both below 500); a call past it is still
 * trapped and refused, only logged as "?". */
#define MAX_SYSCALL_NR 1024

/* Resolved before the filter is loaded: the SIGSYS handler may only read them (libseccomp's
 * lookup allocates, which a signal handler must not). */
static char *syscall_names[MAX_SYSCALL_NR];

static void put_str(char *buf, size_t *n, size_t cap, const char *s)
{
        while (*s && *n < cap)
                buf[(*n)++] = *s++;
}

/* put_str and put_num: what snprintf would do, but async-signal-safe, for the SIGSYS handler. */
static void put_num(char *buf, size_t *n, size_t cap, long v)
{
        char tmp[24];
        int i = 0;

        if (v < 0) {
                put_str(buf, n, cap, "-");
                v = -v;
        }
        do
                tmp[i++] = (char)('0' + v % 10);
        while ((v /= 10) && i < (int)sizeof(tmp));
        while (i > 0 && *n < cap)
                buf[(*n)++] = tmp[--i];
}

/* A call outside the list: one line, and the call fails with ENOSYS. */
static void sigsys_handler(int sig, siginfo_t *info, void *uctx)
{
        int nr = info->si_syscall, saved = errno;
        const char *name = nr >= 0 && nr < MAX_SYSCALL_NR && syscall_names[nr] ? syscall_names[nr] : "?";
        ucontext_t *uc = uctx;
        char line[200];
        size_t n = 0;

        (void)sig;
        put_str(line, &n, sizeof(line), "gpuipcctl metrics: seccomp: a system call outside the allow-list failed "
                                        "with ENOSYS: ");
        put_str(line, &n, sizeof(line), name);
        put_str(line, &n, sizeof(line), " (nr ");
        put_num(line, &n, sizeof(line), nr);
        put_str(line, &n, sizeof(line), ")\n");
        (void)!write(STDERR_FILENO, line, n);
        /* The trapped call returns what the handler leaves in the return register: ENOSYS, which
         * callers (glibc among them) treat as "not supported here" and work around. */
#if defined(__x86_64__)
        uc->uc_mcontext.gregs[REG_RAX] = -ENOSYS;
#elif defined(__aarch64__)
        uc->uc_mcontext.regs[0] = (unsigned long long)-ENOSYS;
#else
#error "the exporter's SIGSYS handler does not know this architecture's return register"
#endif
        /* The write above may have changed errno; the interrupted code sees its own. */
        errno = saved;
}

/* The cleanup of seccomp_confine's filter: every return path frees it (once loaded, the kernel keeps
 * its own copy). */
static void ctx_release(scmp_filter_ctx *ctx)
{
        if (*ctx)
                scmp.release(*ctx);
}

static int add_rule(scmp_filter_ctx ctx, const SandboxRule *rule, uint32_t action)
{
        struct scmp_arg_cmp cmp[sizeof(rule->conds) / sizeof(rule->conds[0])];
        int nr = scmp.resolve_name(rule->name);

        /* One allow-list for every architecture: a name this one lacks (e.g. open on aarch64) is
         * skipped, not an error. */
        if (nr == __NR_SCMP_ERROR)
                return 0;
        if (rule->errno_ret)
                action = SCMP_ACT_ERRNO((uint32_t)rule->errno_ret);
        for (int i = 0; i < rule->n_conds; i++) {
                const SandboxCond *c = &rule->conds[i];

                cmp[i] = c->masked ? SCMP_CMP((unsigned)c->arg, SCMP_CMP_MASKED_EQ, c->mask, c->value)
                                   : SCMP_CMP((unsigned)c->arg, SCMP_CMP_EQ, c->value);
        }
        return scmp.rule_add_array(ctx, action, nr, (unsigned)rule->n_conds, cmp);
}

/* Whether a kill-listed call is one the sanitizer table allows: an allow must win there, or a
 * sanitizer build would be killed by its own runtime. */
static bool in_table(const SandboxRule *table, size_t n, const char *name)
{
        for (size_t i = 0; i < n; i++)
                if (table[i].name && strcmp(table[i].name, name) == 0)
                        return true;
        return false;
}

#define ADD_ALL(ctx, table, action)                                                                         \
        do {                                                                                                \
                for (size_t i_ = 0; i_ < sizeof(table) / sizeof(table[0]); i_++)                            \
                        if (table[i_].name && (r = add_rule(ctx, &table[i_], action)) < 0)                  \
                                return r;                                                                   \
        } while (0)

/* Default TRAP, not KILL: an unexpected call is logged and fails, so a glibc update that uses a
 * new call costs an error message rather than the exporter; the known-dangerous calls
 * (sandbox_kill_names) kill the process outright. */
static int filter_build(scmp_filter_ctx *ret)
{
        scmp_filter_ctx ctx = scmp.init(SCMP_ACT_TRAP);
        int r;

        if (!ctx)
                return -ENOMEM;
        *ret = ctx;
        ADD_ALL(ctx, sandbox_rules, SCMP_ACT_ALLOW);
#if GPUIPC_SANITIZED
        /* A sanitizer's runtime works behind the program's back (LeakSanitizer stops the world with
         * ptrace at exit): sanitizer builds only, and what they need is not killed there. */
        ADD_ALL(ctx, sandbox_sanitizer_rules, SCMP_ACT_ALLOW);
#endif
        for (size_t i = 0; sandbox_kill_names[i]; i++) {
                const SandboxRule k = { .name = sandbox_kill_names[i] };

                if (GPUIPC_SANITIZED && in_table(sandbox_sanitizer_rules,
                                                 sizeof(sandbox_sanitizer_rules) / sizeof(sandbox_sanitizer_rules[0]),
                                                 k.name))
                        continue;
                r = add_rule(ctx, &k, SCMP_ACT_KILL_PROCESS);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Names of every call number are looked up before the filter loads: the SIGSYS handler must name
 * the trapped call without calling into libseccomp (not async-signal-safe, and maybe not allowed). */
static int seccomp_confine(const char **why)
{
        __attribute__((cleanup(ctx_release))) scmp_filter_ctx ctx = NULL;
        struct sigaction sa = { .sa_sigaction = sigsys_handler, .sa_flags = SA_SIGINFO };
        int r = scmp_open(why);

        if (r < 0)
                return r;
        for (int nr = 0; nr < MAX_SYSCALL_NR; nr++)
                if (!syscall_names[nr])
                        syscall_names[nr] = scmp.resolve_num_arch(SCMP_ARCH_NATIVE, nr);
        /* The handler goes in before the filter: the first trapped call may come right after
         * seccomp_load returns. */
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGSYS, &sa, NULL) < 0) {
                *why = "cannot catch SIGSYS";
                return -errno;
        }
        r = filter_build(&ctx);
        if (r < 0) {
                *why = "cannot build the seccomp filter";
                return r;
        }
        r = scmp.load(ctx);
        if (r < 0)
                *why = "cannot load the seccomp filter";
        return r;
}

#else

static int scmp_open(const char **why)
{
        *why = "this gpuipcctl was built without libseccomp";
        return -EOPNOTSUPP;
}

static int seccomp_confine(const char **why)
{
        return scmp_open(why);
}

#endif

int exporter_confine(const char **why)
{
        int r;

        /* Both Landlock and an unprivileged seccomp filter require no_new_privs. */
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
                *why = "cannot set no_new_privs";
                return -errno;
        }
        /* libseccomp first: once Landlock applies, no library can be read any more. */
        r = scmp_open(why);
        /* Landlock before the filter: its system calls are not on the exporter's allow-list
         * (seccomp/gpuipcctl-metrics.allow). */
        if (r == 0)
                r = landlock_nothing(why);
        if (r == 0)
                r = seccomp_confine(why);
        return r;
}
