/* gpuipcctl run: starts a command at a PID that no peer of the broker has as its own, and stays as
 * its parent (docs/legacy-ipc.md). CUDA takes a legacy IPC handle whose exporting PID equals the
 * opener's own PID for one of the opener's own, so a cuda-legacy producer and its consumer must not
 * have the same PID, each as its own PID namespace counts. In a pod without shareProcessNamespace
 * every container's first process is PID 1 (and under an init such as tini, PID 2 in each):
 * equal. Wrapping each workload in `gpuipcctl run --` makes them differ whatever the other
 * container does.
 *
 * How: ask the broker for the PIDs its peers have in their own namespaces (every peer, and every
 * cuda-legacy producer), then start children that exit at once until the next PID is acceptable:
 * not 1, not a peer's, and at least a target that depends on this PID namespace (so that two
 * containers started at the same moment rarely pick the same one). The child that gets such a PID
 * execs the command; parent and child decide from the same value (fork's result, getpid()), so no
 * message passes between them. The parent then forwards the usual termination signals, reaps
 * orphans when it is the namespace's init (PID 1: a container's first process), and exits with the
 * command's status (128 + the signal when a signal killed it), like a shell.
 *
 * What it must never do: start the command at a PID it knows a peer to have, leave the command
 * without a parent that forwards signals, or keep a connection to the broker open while the
 * command runs (that would be one more peer, with this process's PID). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"

#define PID_LIMIT (1u << 22) /* the kernel's PID_MAX_LIMIT (64-bit): no PID is this large */
#define TARGET_BASE 64       /* the default target: TARGET_BASE + (this PID namespace's inode mod TARGET_SPREAD) */
#define TARGET_SPREAD 960
#define MAX_FORKS 4096       /* children used up before giving up: far above any default target */
#define PAGE 256

/* Exit codes of its own, those of env(1) and timeout(1): the command's statuses pass through,
 * so run's own failures must not look like a command's usual 1 (usage errors stay 2, as nothing
 * ran). */
enum { RUN_FAILED = 125, RUN_CANNOT_EXEC = 126, RUN_NOT_FOUND = 127 };

/* The signals passed on to the command; SIGCHLD is waited for with them. */
static const int forwarded[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 };

typedef struct Run {
        Ctl *ctl;
        uint8_t *avoid; /* bitmap of PIDs a peer has as its own, PID_LIMIT bits */
        unsigned n_avoided;
        long target;
        bool quiet;
} Run;

static void avoid_pid(Run *run, uint64_t pid)
{
        /* 0: unknown. Out-of-range values are no PID this namespace can hand out. */
        if (pid == 0 || pid >= PID_LIMIT || run->avoid[pid / 8] & (1u << (pid % 8)))
                return;
        run->avoid[pid / 8] |= (uint8_t)(1u << (pid % 8));
        run->n_avoided++;
}

/* A PID the command may have: not 1 (an init's, which processes in other containers often have
 * too), at or past the target, and none a peer or a cuda-legacy producer has as its own. */
static bool acceptable(const Run *run, pid_t pid)
{
        return pid > 1 && pid >= run->target && !(run->avoid[(unsigned)pid / 8] & (1u << ((unsigned)pid % 8)));
}

static void warn(const Run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void warn(const Run *run, const char *fmt, ...)
{
        va_list ap;

        (void)run;
        fputs("gpuipcctl run: warning: ", stderr);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
}

/* Every PID the broker knows a peer to have in its own namespace: each connected peer's (the
 * kernel's where the broker sees it, else the one it declared), and each cuda-legacy producer's
 * (which the policy may show where it hides the peer). Whatever cannot be listed is warned about:
 * the command still starts, at the target. */
static void collect(Run *run)
{
        gpuipc_options_t o = { .struct_size = sizeof(o) };
        gpuipc_peer_info_t *peers = calloc(PAGE, sizeof(*peers));
        gpuipc_buffer_info_t *bufs = calloc(PAGE, sizeof(*bufs));
        gpuipc_t *c = NULL;
        uint64_t cursor = 0;
        int n;

        if (!peers || !bufs) {
                warn(run, "out of memory: the peers' PIDs are not known");
                goto out;
        }
        o.socket_path = run->ctl->socket;
        o.label = "gpuipcctl run";
        o.connect_timeout_ms = ctl_connect_timeout(run->ctl);
        o.no_gpus = 1;
        o.no_reconnect = 1;
        n = gpuipc_connect(&c, &o);
        if (n < 0) {
                warn(run, "cannot reach the broker ([%s] %s): starting at the target PID, not knowing the peers' PIDs",
                     gpuipc_err_name(n), gpuipc_errmsg(NULL));
                c = NULL;
                goto out;
        }
        do {
                n = gpuipc_list_peers(c, &cursor, peers, PAGE);
                for (int i = 0; i < n; i++)
                        avoid_pid(run, peers[i].self_pid);
        } while (n > 0 && cursor);
        if (n < 0)
                warn(run, "listing the peers: [%s] %s", gpuipc_err_name(n), gpuipc_errmsg(c));
        cursor = 0;
        do {
                n = gpuipc_list_buffers(c, NULL, &cursor, bufs, PAGE);
                for (int i = 0; i < n; i++)
                        if (bufs[i].kind == GPUIPC_KIND_CUDA_LEGACY)
                                avoid_pid(run, bufs[i].self_pid);
        } while (n > 0 && cursor);
        if (n < 0)
                warn(run, "listing the buffers: [%s] %s", gpuipc_err_name(n), gpuipc_errmsg(c));
out:
        /* Closed before the first fork: the command must not inherit the connection, and this
         * process must not stay a peer of the broker while the command runs. */
        gpuipc_close(c);
        free(peers);
        free(bufs);
}

/* The default target, from this PID namespace's identity: two containers of one pod started at
 * the same moment get different targets (unless their namespaces' inodes agree modulo the spread). */
static long default_target(void)
{
        struct stat st;

        if (stat("/proc/self/ns/pid", &st) < 0)
                return TARGET_BASE;
        return TARGET_BASE + (long)(st.st_ino % TARGET_SPREAD);
}

/* The child, right after vfork: it shares the parent's memory until it execs or exits, so it only
 * reads, makes system calls and formats on its own stack. A PID that will not do: gone at once. */
__attribute__((noreturn)) static void child(const Run *run, char **argv, const sigset_t *old)
{
        char msg[512];
        ssize_t w;
        int e, n;

        /* _exit, not exit: in the parent's memory (vfork), exit would run the parent's atexit
         * handlers and flush its stdio buffers. */
        if (!acceptable(run, getpid()))
                _exit(0);
        /* The command starts with the mask gpuipcctl was started with, not the set the parent
         * blocks to wait on. */
        sigprocmask(SIG_SETMASK, old, NULL);
        execvp(argv[0], argv);
        e = errno;
        n = snprintf(msg, sizeof(msg), "gpuipcctl run: cannot run %s: %s\n", argv[0], strerror(e));
        w = write(STDERR_FILENO, msg, n > 0 && (size_t)n < sizeof(msg) ? (size_t)n : strlen(msg));
        (void)w; /* nowhere to report a failed report */
        _exit(e == ENOENT ? RUN_NOT_FOUND : RUN_CANNOT_EXEC);
}

/* Creates children until one gets an acceptable PID; that one runs the command. vfork, not fork:
 * a child that exits at once costs a fork's page-table copy for nothing (a thousand PIDs may have to
 * go, and fork took 6 ms a child on a busy 2-core machine, vfork 0.13 ms), while vfork copies nothing. Returns the
 * command's PID, or -1 after saying why. */
static pid_t start_command(Run *run, char **argv, const sigset_t *old)
{
        pid_t pid = 0;

        fflush(NULL);
        for (int n = 0; n < MAX_FORKS; n++) {
                pid = vfork();
                if (pid < 0) {
                        fprintf(stderr, "gpuipcctl run: vfork: %s\n", strerror(errno));
                        return -1;
                }
                if (pid == 0)
                        child(run, argv, old);
                if (acceptable(run, pid))
                        return pid;
                /* Reaped at once: up to MAX_FORKS rejected children must not linger as zombies. */
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                        ;
        }
        fprintf(stderr, "gpuipcctl run: no acceptable PID after %d children (the last was %ld, the target %ld): "
                "use a lower --min-pid\n", MAX_FORKS, (long)pid, run->target);
        return -1;
}

/* The shell's convention, so run is transparent to whoever waits for it: a command killed by a
 * signal exits 128 + the signal. */
static int exit_code(int status)
{
        if (WIFSIGNALED(status))
                return 128 + WTERMSIG(status);
        return WEXITSTATUS(status);
}

/* Reaps what has ended: the command, and as PID 1 any orphan the kernel gave us. Returns the
 * command's exit code once it ended, else -1. */
static int reap(pid_t child, bool init)
{
        int status, code = -1;
        pid_t p;

        /* Until none is left: pending SIGCHLDs merge into one, which may stand for several. */
        while ((p = waitpid(init ? -1 : child, &status, WNOHANG)) > 0 || (p < 0 && errno == EINTR))
                if (p == child)
                        code = exit_code(status);
        return code;
}

/* The parent's life once the command runs: signals in, the command's status out. */
static int supervise(pid_t child, const sigset_t *wait_set)
{
        bool init = getpid() == 1;
        siginfo_t info;
        int sig, code;

        for (;;) {
                sig = sigwaitinfo(wait_set, &info);
                if (sig < 0) {
                        if (errno == EINTR)
                                continue;
                        /* Cannot happen with a valid set; never leave the command parentless. */
                        waitpid(child, &code, 0);
                        return exit_code(code);
                }
                if (sig == SIGCHLD) {
                        if ((code = reap(child, init)) >= 0)
                                return code;
                        continue;
                }
                /* A terminal's ^C or ^\ goes to its whole foreground process group, the command
                 * included: passing it on would deliver it twice. */
                if ((sig == SIGINT || sig == SIGQUIT) && info.si_code == SI_KERNEL && getpgid(child) == getpgrp())
                        continue;
                kill(child, sig);
        }
}

int cmd_run(Ctl *ctl, int argc, char **argv)
{
        Run run = { .ctl = ctl, .target = -1 };
        sigset_t wait_set, old;
        long v, pid_max = PID_LIMIT;
        char **cmd;
        pid_t child;
        FILE *f;
        int c, r;

        /* Options end at the command's name (the table's command runs_command): its own options
         * are not ours, with or without the "--" the synopsis writes. */
        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                switch (c) {
                case 'q': run.quiet = true; break;
                case CTL_OPT_MIN_PID:
                        if (ctl_parse_int(ctl, "--min-pid", optarg, 2, PID_LIMIT - 1, &v))
                                return CTL_USAGE;
                        run.target = v;
                        break;
                }
        }
        if (c < 0)
                return r;
        if (optind >= argc)
                return ctl_usage(ctl, "no command given");
        cmd = &argv[optind];
        /* pid_max bounds every PID the kernel hands out: a --min-pid at or above it could never be
         * reached, and finding that out would cost MAX_FORKS children. */
        if ((f = fopen("/proc/sys/kernel/pid_max", "r"))) {
                if (fscanf(f, "%ld", &v) == 1 && v > 1)
                        pid_max = v;
                fclose(f);
        }
        if (run.target >= pid_max)
                return ctl_usage(ctl, "--min-pid %ld: no PID reaches it here (pid_max is %ld)", run.target, pid_max);
        if (run.target < 0)
                run.target = default_target();

        run.avoid = calloc(PID_LIMIT / 8, 1);
        if (!run.avoid) {
                fprintf(stderr, "gpuipcctl run: out of memory\n");
                return RUN_FAILED;
        }
        collect(&run);

        /* The signals are blocked before the first fork and waited for with sigwaitinfo: none is
         * lost between starting the command and waiting, and blocked signals reach even a PID 1,
         * which the kernel otherwise spares every signal it has no handler for. SIGCHLD's
         * disposition is reset: ignored (inherited from whoever started us), the kernel would
         * reap the command itself and its status would be lost. */
        signal(SIGCHLD, SIG_DFL);
        sigemptyset(&wait_set);
        for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++)
                sigaddset(&wait_set, forwarded[i]);
        sigaddset(&wait_set, SIGCHLD);
        sigprocmask(SIG_BLOCK, &wait_set, &old);

        child = start_command(&run, cmd, &old);
        free(run.avoid);
        if (child < 0) {
                sigprocmask(SIG_SETMASK, &old, NULL);
                return RUN_FAILED;
        }
        if (!run.quiet)
                fprintf(stderr, "gpuipcctl run: %s runs as PID %ld (target %ld, %u peer PID(s) avoided)\n", cmd[0],
                        (long)child, run.target, run.n_avoided);
        return supervise(child, &wait_set);
}
