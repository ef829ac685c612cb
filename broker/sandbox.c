/* Building the seccomp filter in one function and loading it in another (after crun's seccomp.c).
 *
 * The filter fails safe: a call outside the allow-list traps, and the trap handler decides. A call
 * of the allow-list's [kill] section (exec, ptrace, namespaces, mounts: nothing the broker's own
 * code does) is logged and kills the process. Any other one is a libc path the tests never took
 * (glibc's qsort asking for sysinfo was one): it fails with ENOSYS, as a call the kernel does not
 * have would, and the log names it and the request the broker was serving, so a missed path costs
 * one reply instead of every peer's connection. Either way the call itself never runs, so even a
 * subverted handler grants nothing. */
#include "sandbox.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "macro.h"

/* What the broker is doing, for the trap handler's line. Written only by the broker's one thread,
 * read by the handler on that same thread (the trap interrupts the call, nothing else). */
static struct {
        const char *op; /* NULL: no request (the event loop, a timer, start-up) */
        uint64_t peer, request;
} current;

void sandbox_set_context(const char *op, uint64_t peer, uint64_t request)
{
        current.op = op;
        current.peer = peer;
        current.request = request;
}

void sandbox_clear_context(void)
{
        current.op = NULL;
}

#if HAVE_SECCOMP
#include <seccomp.h>
#include <sys/syscall.h>

#include "seccomp-allow.h"

/* Above every syscall number of x86_64 and aarch64 (both below 500); a call past it is treated as
 * unknown, which kills (sigsys_handler). */
#define MAX_SYSCALL_NR 1024

/* Where the trap handler writes a refused call's result: the register the call returns in. On
 * other architectures every trapped call kills. */
#if defined(__x86_64__)
#define SET_SYSCALL_RESULT(uc, v) ((uc)->uc_mcontext.gregs[REG_RAX] = (greg_t)(v))
#elif defined(__aarch64__)
#define SET_SYSCALL_RESULT(uc, v) ((uc)->uc_mcontext.regs[0] = (unsigned long long)(v))
#endif

/* Resolved before the filter exists: the handler may not allocate. */
static const char *syscall_names[MAX_SYSCALL_NR];
static bool kill_calls[MAX_SYSCALL_NR];
/* Refusals so far, per call and in all: a peer repeating a refused path must not flood the log,
 * so a call's 1st, 2nd, 4th, 8th, ... refusal is logged (each line says how many so far). */
static volatile uint32_t refused_calls[MAX_SYSCALL_NR];
static volatile uint64_t refused_total;

uint64_t sandbox_refused_total(void)
{
        return refused_total;
}

/* On the handler's stack, so small: one trap line is about 200 bytes. */
typedef struct Line {
        char buf[512];
        size_t n;
} Line;

static void put_str(Line *l, const char *s)
{
        while (*s && l->n < sizeof(l->buf) - 1)
                l->buf[l->n++] = *s++;
}

static void put_num(Line *l, uint64_t v, int min_digits)
{
        char tmp[24];
        int i = 0;

        do
                tmp[i++] = (char)('0' + v % 10);
        while ((v /= 10) && i < (int)sizeof(tmp));
        while (i < min_digits)
                tmp[i++] = '0';
        while (i > 0 && l->n < sizeof(l->buf) - 1)
                l->buf[l->n++] = tmp[--i];
}

/* The same UTC timestamp as log.c's, without gmtime_r (not async-signal-safe): civil date from
 * days since the epoch (Howard Hinnant's algorithm). */
static void put_stamp(Line *l)
{
        struct timespec ts;
        int64_t days, z, era, doe, yoe, doy, mp, y, m, d, secs;

        clock_gettime(CLOCK_REALTIME, &ts);
        days = ts.tv_sec / 86400;
        secs = ts.tv_sec % 86400;
        z = days + 719468;
        era = z / 146097;
        doe = z - era * 146097;
        yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
        doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        mp = (5 * doy + 2) / 153;
        d = doy - (153 * mp + 2) / 5 + 1;
        m = mp < 10 ? mp + 3 : mp - 9;
        y = yoe + era * 400 + (m <= 2);
        put_num(l, (uint64_t)y, 4);
        put_str(l, "-");
        put_num(l, (uint64_t)m, 2);
        put_str(l, "-");
        put_num(l, (uint64_t)d, 2);
        put_str(l, "T");
        put_num(l, (uint64_t)(secs / 3600), 2);
        put_str(l, ":");
        put_num(l, (uint64_t)(secs / 60 % 60), 2);
        put_str(l, ":");
        put_num(l, (uint64_t)(secs % 60), 2);
        put_str(l, ".");
        put_num(l, (uint64_t)(ts.tv_nsec / 1000000), 3);
        put_str(l, "Z");
}

/* One field in log.c's two forms: ,"key":"value" (a number without quotes) in JSON, key=value in
 * text. Values are syscall and operation names from fixed tables and numbers: nothing to escape. */
static void put_field(Line *l, const char *key, const char *str, uint64_t num)
{
        bool quote = log_json() && str;

        put_str(l, log_json() ? ",\"" : " ");
        put_str(l, key);
        put_str(l, log_json() ? "\":" : "=");
        if (quote)
                put_str(l, "\"");
        if (str)
                put_str(l, str);
        else
                put_num(l, num, 1);
        if (quote)
                put_str(l, "\"");
}

/* Async-signal-safe: formats by hand and writes once. */
static void log_trap(const char *name, int nr, bool kill, uint32_t count)
{
        const char *msg = kill ? "seccomp: a forbidden system call; the broker is killed"
                               : "seccomp: a system call outside the allow-list was refused (ENOSYS)";
        Line l = { .n = 0 };

        put_str(&l, log_json() ? "{\"ts\":\"" : "");
        put_stamp(&l);
        put_str(&l, log_json() ? "\",\"level\":\"error\",\"msg\":\"" : " error ");
        put_str(&l, msg);
        put_str(&l, log_json() ? "\"" : "");
        put_field(&l, "syscall", name, 0);
        put_field(&l, "nr", NULL, (uint64_t)nr);
        if (!kill)
                put_field(&l, "times", NULL, count);
        if (current.op) {
                put_field(&l, "op", current.op, 0);
                put_field(&l, "peer", NULL, current.peer);
                put_field(&l, "request", NULL, current.request);
        } else {
                put_field(&l, "op", "none", 0);
        }
        put_str(&l, log_json() ? "}\n" : "\n");
        /* Cut short, the line still ends in a newline, so the next log line starts on its own. */
        if (l.n == sizeof(l.buf) - 1)
                l.buf[l.n - 1] = '\n';
        (void)!write(STDERR_FILENO, l.buf, l.n);
}

static void sigsys_handler(int sig, siginfo_t *info, void *uctx)
{
        int nr = info->si_syscall;
        bool known = nr >= 0 && nr < MAX_SYSCALL_NR;
        const char *name = known && syscall_names[nr] ? syscall_names[nr] : "?";
        /* A number past the table was never reviewed: killed, not refused, like the kill
         * section's calls. */
        bool kill = !known || kill_calls[nr];
        uint32_t count = 0;

#ifdef SET_SYSCALL_RESULT
        if (!kill) {
                count = ++refused_calls[nr];
                refused_total++;
                /* count is a power of two: 1, 2, 4, 8, ... */
                if ((count & (count - 1)) == 0)
                        log_trap(name, nr, false, count);
                SET_SYSCALL_RESULT((ucontext_t *)uctx, -ENOSYS);
                return;
        }
#else
        (void)uctx;
        kill = true;
#endif
        log_trap(name, nr, true, count);
        /* With SIGSYS back at its default, the same call traps again and the kernel kills us. */
        signal(sig, SIG_DFL);
        syscall(nr, 0, 0, 0, 0, 0, 0);
        _exit(128 + SIGSYS);
}

static void ctx_release(scmp_filter_ctx *ctx)
{
        if (*ctx)
                seccomp_release(*ctx);
}

static int add_rule(scmp_filter_ctx ctx, const SandboxRule *rule)
{
        struct scmp_arg_cmp cmp[ARRAY_SIZE(rule->conds)];
        uint32_t action = rule->errno_ret ? SCMP_ACT_ERRNO((uint32_t)rule->errno_ret) : SCMP_ACT_ALLOW;
        int nr = seccomp_syscall_resolve_name(rule->name);
        int r;

        if (nr == __NR_SCMP_ERROR)
                return 0; /* not a call on this architecture */
        for (int i = 0; i < rule->n_conds; i++) {
                const SandboxCond *c = &rule->conds[i];

                cmp[i] = c->masked ? SCMP_CMP((unsigned)c->arg, SCMP_CMP_MASKED_EQ, c->mask, c->value)
                                   : SCMP_CMP((unsigned)c->arg, SCMP_CMP_EQ, c->value);
        }
        r = seccomp_rule_add_array(ctx, action, nr, (unsigned)rule->n_conds, cmp);
        if (r < 0)
                log_error("cannot add a seccomp rule", "syscall=%s error=\"%s\"", rule->name, strerror(-r));
        return r;
}

/* Builds the filter, with also_allowed (NULL-terminated names, or NULL) allowed besides the
 * allow-list; the caller loads it. */
static int sandbox_build(SandboxMode m, const char *const *also_allowed, scmp_filter_ctx *ret)
{
        _cleanup_(ctx_release) scmp_filter_ctx ctx = NULL;
        int r;

        /* --seccomp=log: every call runs and the kernel's audit log names those outside the list,
         * for finding what a new deployment needs without breaking it. */
        ctx = seccomp_init(m == SANDBOX_LOG ? SCMP_ACT_LOG : SCMP_ACT_TRAP);
        if (!ctx)
                return -ENOMEM;
        for (size_t i = 0; i < ARRAY_SIZE(sandbox_rules); i++)
                if (sandbox_rules[i].name && (r = add_rule(ctx, &sandbox_rules[i])) < 0)
                        return r;
#if GPUIPC_SANITIZED
        /* A sanitizer's runtime works behind the program's back (LeakSanitizer stops the world with
         * ptrace at exit): those calls are allowed in sanitizer builds only, never in a release. */
        for (size_t i = 0; i < ARRAY_SIZE(sandbox_sanitizer_rules); i++)
                if (sandbox_sanitizer_rules[i].name && (r = add_rule(ctx, &sandbox_sanitizer_rules[i])) < 0)
                        return r;
#endif
        for (size_t i = 0; also_allowed && also_allowed[i]; i++) {
                SandboxRule extra = { .name = also_allowed[i] };
                if ((r = add_rule(ctx, &extra)) < 0)
                        return r;
        }
        *ret = steal_ptr(ctx);
        return 0;
}

int sandbox_apply(SandboxMode m)
{
        return sandbox_apply_with(m, NULL);
}

int sandbox_apply_with(SandboxMode m, const char *const *also_allowed)
{
        _cleanup_(ctx_release) scmp_filter_ctx ctx = NULL;
        struct sigaction sa = { 0 };
        int r;

        if (m == SANDBOX_OFF)
                return 0;
        /* Names and the kill set are filled before the handler is installed and the filter loaded:
         * the handler only reads them. */
        for (int nr = 0; nr < MAX_SYSCALL_NR; nr++)
                if (!syscall_names[nr])
                        syscall_names[nr] = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
        for (size_t i = 0; sandbox_kill_names[i]; i++) {
                int nr = seccomp_syscall_resolve_name(sandbox_kill_names[i]);
                if (nr >= 0 && nr < MAX_SYSCALL_NR)
                        kill_calls[nr] = true;
        }
        sa.sa_sigaction = sigsys_handler;
        sa.sa_flags = SA_SIGINFO;
        if (sigaction(SIGSYS, &sa, NULL) < 0)
                return -errno;
        r = sandbox_build(m, also_allowed, &ctx);
        if (r < 0)
                return r;
        r = seccomp_load(ctx);
        if (r < 0) {
                log_error("cannot load the seccomp filter", "error=\"%s\"", strerror(-r));
                return r;
        }
        return 0;
}

#else

uint64_t sandbox_refused_total(void)
{
        return 0;
}

int sandbox_apply_with(SandboxMode m, const char *const *also_allowed)
{
        (void)also_allowed;
        if (m == SANDBOX_OFF)
                return 0;
        log_error("this broker was built without libseccomp; pass --seccomp=off to run it unsandboxed", NULL);
        return -EOPNOTSUPP;
}

int sandbox_apply(SandboxMode m)
{
        return sandbox_apply_with(m, NULL);
}

#endif

int sandbox_mode_from_name(const char *s, SandboxMode *ret)
{
        if (strcmp(s, "enforce") == 0)
                *ret = SANDBOX_ENFORCE;
        else if (strcmp(s, "log") == 0)
                *ret = SANDBOX_LOG;
        else if (strcmp(s, "off") == 0)
                *ret = SANDBOX_OFF;
        else
                return -EINVAL;
        return 0;
}

const char *sandbox_mode_name(SandboxMode m)
{
        return m == SANDBOX_ENFORCE ? "enforce" : m == SANDBOX_LOG ? "log" : "off";
}
