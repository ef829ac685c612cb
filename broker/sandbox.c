/* Building the seccomp filter in one function and loading it in another (after crun's seccomp.c).
 * Enforcement traps instead of killing outright, so the broker can log which call it was; the
 * trap handler then lets the kernel kill the process with SIGSYS. */
#include "sandbox.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "macro.h"

#if HAVE_SECCOMP
#include <seccomp.h>
#include <sys/syscall.h>

#include "seccomp-allow.h"

#define MAX_SYSCALL_NR 1024

/* Names for the trap handler, resolved before the filter exists: the handler may not allocate. */
static char *syscall_names[MAX_SYSCALL_NR];

static void put_str(char *buf, size_t *n, size_t cap, const char *s)
{
        while (*s && *n < cap)
                buf[(*n)++] = *s++;
}

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

/* Async-signal-safe: formats by hand and writes once. */
static void sigsys_handler(int sig, siginfo_t *info, void *uctx)
{
        int nr = info->si_syscall;
        const char *name = nr >= 0 && nr < MAX_SYSCALL_NR && syscall_names[nr] ? syscall_names[nr] : "?";
        char line[256];
        size_t n = 0;

        (void)uctx;
        put_str(line, &n, sizeof(line), log_json() ? "{\"level\":\"error\",\"msg\":\"seccomp: a system call outside "
                                                     "the allow-list; the broker is killed\",\"syscall\":\""
                                                   : "error seccomp: a system call outside the allow-list; the "
                                                     "broker is killed syscall=");
        put_str(line, &n, sizeof(line), name);
        put_str(line, &n, sizeof(line), log_json() ? "\",\"nr\":\"" : " nr=");
        put_num(line, &n, sizeof(line), nr);
        put_str(line, &n, sizeof(line), log_json() ? "\"}\n" : "\n");
        (void)!write(STDERR_FILENO, line, n);
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

/* Builds the filter; the caller loads it. */
static int sandbox_build(SandboxMode m, scmp_filter_ctx *ret)
{
        _cleanup_(ctx_release) scmp_filter_ctx ctx = NULL;
        int r;

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
        *ret = steal_ptr(ctx);
        return 0;
}

int sandbox_apply(SandboxMode m)
{
        _cleanup_(ctx_release) scmp_filter_ctx ctx = NULL;
        struct sigaction sa = { 0 };
        int r;

        if (m == SANDBOX_OFF)
                return 0;
        for (int nr = 0; nr < MAX_SYSCALL_NR; nr++)
                if (!syscall_names[nr])
                        syscall_names[nr] = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
        sa.sa_sigaction = sigsys_handler;
        sa.sa_flags = SA_SIGINFO;
        if (sigaction(SIGSYS, &sa, NULL) < 0)
                return -errno;
        r = sandbox_build(m, &ctx);
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

int sandbox_apply(SandboxMode m)
{
        if (m == SANDBOX_OFF)
                return 0;
        log_error("this broker was built without libseccomp; pass --seccomp=off to run it unsandboxed", NULL);
        return -EOPNOTSUPP;
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
