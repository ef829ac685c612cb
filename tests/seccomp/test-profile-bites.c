/* Proves the shipped Kubernetes profile (seccomp/gpuipc-broker.json) bites: its rules, loaded with
 * libseccomp the way OCI runtimes load them (entries ORed, conditions ANDed), refuse network
 * sockets (AF_INET, UDP, AF_INET6, AF_NETLINK), new namespaces through clone and unshare, answer
 * clone3 with ENOSYS, and refuse calls the broker never makes, while what the broker and its probe
 * need (an AF_UNIX SOCK_SEQPACKET socket, a thread-style clone, fork) still works.
 *
 * Usage: test-profile-bites RULES, where RULES is profile_rules.py's translation of the profile.
 * Every attempt runs in a child of its own with the filter loaded. Exit 0, 1 on a failed check, 77
 * without libseccomp. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"

#if HAVE_SECCOMP
#include <linux/netlink.h>
#include <netinet/in.h>
#include <seccomp.h>

#define MAX_CONDS 6

static const char *rules_path;
static int failures;

static int op_of(const char *s, enum scmp_compare *ret)
{
        static const struct {
                const char *name;
                enum scmp_compare op;
        } ops[] = {
                { "SCMP_CMP_NE", SCMP_CMP_NE }, { "SCMP_CMP_LT", SCMP_CMP_LT }, { "SCMP_CMP_LE", SCMP_CMP_LE },
                { "SCMP_CMP_EQ", SCMP_CMP_EQ }, { "SCMP_CMP_GE", SCMP_CMP_GE }, { "SCMP_CMP_GT", SCMP_CMP_GT },
                { "SCMP_CMP_MASKED_EQ", SCMP_CMP_MASKED_EQ },
        };

        for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
                if (strcmp(ops[i].name, s) == 0) {
                        *ret = ops[i].op;
                        return 0;
                }
        }
        return -EINVAL;
}

static uint32_t action_of(const char *s, int err)
{
        if (strcmp(s, "ALLOW") == 0)
                return SCMP_ACT_ALLOW;
        if (strcmp(s, "ERRNO") == 0)
                return SCMP_ACT_ERRNO((uint32_t)err);
        if (strcmp(s, "LOG") == 0)
                return SCMP_ACT_LOG;
        if (strcmp(s, "TRAP") == 0)
                return SCMP_ACT_TRAP;
        return SCMP_ACT_KILL_PROCESS;
}

/* Builds the profile's filter from the rules file; NULL (and a message) if it cannot. */
static scmp_filter_ctx load_rules(void)
{
        char line[1024], action[16];
        scmp_filter_ctx ctx = NULL;
        FILE *f = fopen(rules_path, "re");
        int err;

        if (!f || !fgets(line, sizeof(line), f) || sscanf(line, "default %15s %d", action, &err) != 2) {
                fprintf(stderr, "cannot read the default action from %s\n", rules_path);
                goto fail;
        }
        ctx = seccomp_init(action_of(action, err));
        if (!ctx)
                goto fail;
        while (fgets(line, sizeof(line), f)) {
                struct scmp_arg_cmp cmp[MAX_CONDS];
                char name[64], *p = line;
                int n, used, nr;

                if (sscanf(p, "rule %15s %d %63s %d%n", action, &err, name, &n, &used) != 4 || n < 0 ||
                    n > MAX_CONDS) {
                        fprintf(stderr, "bad rule: %s", line);
                        goto fail;
                }
                p += used;
                for (int i = 0; i < n; i++) {
                        char op[32];
                        unsigned arg;
                        unsigned long long a, b;

                        if (sscanf(p, " %u %31s %llu %llu%n", &arg, op, &a, &b, &used) != 4 ||
                            op_of(op, &cmp[i].op) < 0) {
                                fprintf(stderr, "bad condition in: %s", line);
                                goto fail;
                        }
                        p += used;
                        cmp[i].arg = arg;
                        cmp[i].datum_a = a;
                        cmp[i].datum_b = b;
                }
                nr = seccomp_syscall_resolve_name(name);
                if (nr == __NR_SCMP_ERROR)
                        continue; /* unknown on this architecture, as a runtime would skip it */
                if (seccomp_rule_add_array(ctx, action_of(action, err), nr, (unsigned)n, cmp) < 0) {
                        fprintf(stderr, "libseccomp refuses the rule: %s", line);
                        goto fail;
                }
        }
        fclose(f);
        return ctx;
fail:
        if (f)
                fclose(f);
        if (ctx)
                seccomp_release(ctx);
        return NULL;
}

typedef long (*Attempt)(void);

/* Runs attempt under the profile in a child: its result, or -errno, comes back as the exit code
 * (0 success, 100 + errno a refusal, 99 the filter could not be loaded). */
static int run_confined(Attempt attempt)
{
        pid_t pid = fork();
        int status;

        if (pid < 0)
                exit(1);
        if (pid == 0) {
                scmp_filter_ctx ctx = load_rules();
                long r;

                if (!ctx || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || seccomp_load(ctx) < 0)
                        _exit(99);
                r = attempt();
                _exit(r >= 0 ? 0 : (int)(100 + -r));
        }
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
                return -1;
        return WEXITSTATUS(status);
}

static void expect(const char *what, Attempt attempt, int want_errno)
{
        int code = run_confined(attempt);
        int want = want_errno ? 100 + want_errno : 0;

        if (code == want) {
                printf("ok   %s\n", what);
                return;
        }
        failures++;
        if (code == 99)
                printf("FAIL %s: the profile could not be loaded\n", what);
        else if (code == 0)
                printf("FAIL %s: it succeeded under the profile\n", what);
        else if (code > 100)
                printf("FAIL %s: failed with %s, expected %s\n", what, strerror(code - 100),
                       want_errno ? strerror(want_errno) : "success");
        else
                printf("FAIL %s: the child ended with %d\n", what, code);
}

static long result(long r)
{
        return r < 0 ? -errno : r;
}

static long open_socket(int domain, int type, int protocol)
{
        int fd = socket(domain, type, protocol);

        if (fd < 0)
                return -errno;
        close(fd);
        return 0;
}

static long unix_seqpacket(void)
{
        return open_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
}
static long unix_stream(void)
{
        return open_socket(AF_UNIX, SOCK_STREAM, 0);
}
static long inet_tcp(void)
{
        return open_socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
}
static long inet_udp(void)
{
        return open_socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP);
}
static long inet6_tcp(void)
{
        return open_socket(AF_INET6, SOCK_STREAM, 0);
}
static long netlink_route(void)
{
        return open_socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
}

/* A raw clone(2) with these flags; a child that appears exits at once. */
static long raw_clone(unsigned long flags)
{
        long pid = syscall(SYS_clone, flags | SIGCHLD, NULL, NULL, NULL, 0);

        if (pid == 0)
                _exit(0);
        if (pid < 0)
                return -errno;
        waitpid((pid_t)pid, NULL, 0);
        return 0;
}

static long clone_plain(void)
{
        return raw_clone(0);
}
static long clone_newuser(void)
{
        return raw_clone(CLONE_NEWUSER);
}
static long clone_newnet(void)
{
        return raw_clone(CLONE_NEWNET);
}
static long clone_newns(void)
{
        return raw_clone(CLONE_NEWNS);
}
static long clone_newpid(void)
{
        return raw_clone(CLONE_NEWPID);
}
static long clone_all_three(void)
{
        return raw_clone(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS);
}
static long clone3_call(void)
{
        return result(syscall(SYS_clone3, NULL, 0));
}
static long unshare_user(void)
{
        return result(unshare(CLONE_NEWUSER));
}
static long ptrace_call(void)
{
        return result(syscall(SYS_ptrace, 0 /* PTRACE_TRACEME */, 0, 0, 0));
}
static long mount_call(void)
{
        return result(syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, NULL));
}

int main(int argc, char **argv)
{
        if (argc != 2) {
                fprintf(stderr, "usage: %s RULES\n", argv[0]);
                return 2;
        }
        rules_path = argv[1];
        /* What the broker and gpuipcctl ping need. */
        expect("socket(AF_UNIX, SOCK_SEQPACKET) is allowed", unix_seqpacket, 0);
        expect("fork (clone without namespace flags) is allowed", clone_plain, 0);
        /* Network sockets, of every family the issue named. */
        expect("socket(AF_INET, SOCK_STREAM) is refused", inet_tcp, EPERM);
        expect("socket(AF_INET, SOCK_DGRAM) (UDP) is refused", inet_udp, EPERM);
        expect("socket(AF_INET6) is refused", inet6_tcp, EPERM);
        expect("socket(AF_NETLINK) is refused", netlink_route, EPERM);
        expect("socket(AF_UNIX, SOCK_STREAM) is refused (only SEQPACKET)", unix_stream, EPERM);
        /* New namespaces. */
        expect("clone(CLONE_NEWUSER) is refused", clone_newuser, EPERM);
        expect("clone(CLONE_NEWNET) is refused", clone_newnet, EPERM);
        expect("clone(CLONE_NEWNS) is refused", clone_newns, EPERM);
        expect("clone(CLONE_NEWPID) is refused", clone_newpid, EPERM);
        expect("clone(CLONE_NEWUSER|CLONE_NEWNET|CLONE_NEWNS) is refused", clone_all_three, EPERM);
        expect("clone3 is answered ENOSYS (callers fall back to clone)", clone3_call, ENOSYS);
        expect("unshare(CLONE_NEWUSER) is refused", unshare_user, EPERM);
        /* A sample of what the broker never does. */
        expect("ptrace is refused", ptrace_call, EPERM);
        expect("mount is refused", mount_call, EPERM);
        printf(failures ? "%d checks failed\n" : "all checks passed\n", failures);
        return failures ? 1 : 0;
}

#else

int main(void)
{
        printf("built without libseccomp: skipped\n");
        return 77;
}

#endif
