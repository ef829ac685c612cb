/* The metrics exporter's confinement (cli/exporter-confine.c) bites and fails safe: after
 * exporter_confine(), a call outside its allow-list fails with ENOSYS and one log line naming it
 * (the process goes on), a network socket cannot be made, no file can be opened (in sanitizer
 * builds, whose filter lets open through for the sanitizers, Landlock refuses it), and a call that
 * would give new powers ([kill]: execve, ptrace, unshare) kills the process; what the exporter needs
 * (an AF_UNIX SOCK_SEQPACKET socket, a thread) still works. Every attempt runs in a child of its own.
 * Exit 0, 1 on a failed check, 77 without libseccomp. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "exporter-confine.h"

static int failures;

static void *thread_main(void *arg)
{
        return arg;
}

typedef enum Expect { RETURNS_ENOSYS, SUCCEEDS, KILLED, DENIED_BY_LANDLOCK } Expect;

/* 0: the call did what was expected (child's exit status), else what it did. */
static int attempt(const char *what)
{
        const char *why = "";
        int r;

        if (exporter_confine(&why) < 0) {
                fprintf(stderr, "exporter_confine: %s\n", why);
                return 90;
        }
        if (strcmp(what, "getcwd") == 0) {
                char buf[64];
                r = (int)syscall(SYS_getcwd, buf, sizeof(buf));
        } else if (strcmp(what, "inet-socket") == 0) {
                r = socket(AF_INET, SOCK_STREAM, 0);
        } else if (strcmp(what, "open") == 0) {
                r = open("/etc/hostname", O_RDONLY | O_CLOEXEC);
        } else if (strcmp(what, "unix-socket") == 0) {
                r = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
                if (r >= 0)
                        close(r), r = 0;
        } else if (strcmp(what, "thread") == 0) {
                pthread_t t;
                void *ret;
                r = pthread_create(&t, NULL, thread_main, (void *)7) == 0 && pthread_join(t, &ret) == 0 &&
                    ret == (void *)7 ? 0 : -1;
        } else if (strcmp(what, "execve") == 0) {
                char *argv[] = { "/bin/true", NULL };
                r = execve("/bin/true", argv, argv + 1);
        } else if (strcmp(what, "ptrace") == 0) {
                r = (int)syscall(SYS_ptrace, 0 /* PTRACE_TRACEME */, 0, 0, 0);
        } else if (strcmp(what, "unshare") == 0) {
                r = unshare(CLONE_NEWUSER);
        } else {
                return 91;
        }
        if (r == 0)
                return 0;
        return r < 0 && errno == ENOSYS ? 38 : r < 0 ? 40 + (errno & 31) : 39;
}

static void expect(const char *what, Expect e)
{
        int pipefd[2], status;
        char log[512] = "";
        ssize_t n;
        pid_t pid;

        if (pipe(pipefd) < 0)
                abort();
        pid = fork();
        if (pid == 0) {
                dup2(pipefd[1], STDERR_FILENO);
                close(pipefd[0]);
                _exit(attempt(what));
        }
        close(pipefd[1]);
        n = read(pipefd[0], log, sizeof(log) - 1);
        log[n > 0 ? n : 0] = 0;
        close(pipefd[0]);
        waitpid(pid, &status, 0);
        if (e == KILLED) {
                if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSYS) {
                        printf("FAIL %s: not killed by SIGSYS (status 0x%x)\n", what, status);
                        failures++;
                        return;
                }
        } else if (!WIFEXITED(status) ||
                   WEXITSTATUS(status) != (e == SUCCEEDS ? 0 : e == DENIED_BY_LANDLOCK ? 40 + EACCES : 38)) {
                printf("FAIL %s: exit status 0x%x, expected %s; log: %s\n", what, status,
                       e == SUCCEEDS ? "success" : e == DENIED_BY_LANDLOCK ? "EACCES" : "ENOSYS", log);
                failures++;
                return;
        }
        if (e == RETURNS_ENOSYS && !strstr(log, "seccomp: a system call outside the allow-list failed with ENOSYS")) {
                printf("FAIL %s: no log line names the refused call: '%s'\n", what, log);
                failures++;
                return;
        }
        if (e == SUCCEEDS && strstr(log, "seccomp:")) {
                printf("FAIL %s: it worked, but the filter logged: %s\n", what, log);
                failures++;
                return;
        }
        printf("ok   %s: %s%s", what,
               e == SUCCEEDS             ? "works\n"
               : e == KILLED             ? "killed by SIGSYS\n"
               : e == DENIED_BY_LANDLOCK ? "EACCES\n"
                                         : "",
               e == RETURNS_ENOSYS ? log : "");
}

int main(void)
{
        if (!HAVE_SECCOMP) {
                printf("SKIP: built without libseccomp\n");
                return 77;
        }
        expect("getcwd", RETURNS_ENOSYS);
        expect("inet-socket", RETURNS_ENOSYS);
        /* A sanitizer build's filter lets open through (its runtime reads /proc): Landlock refuses it. */
        expect("open", GPUIPC_SANITIZED ? DENIED_BY_LANDLOCK : RETURNS_ENOSYS);
        expect("unix-socket", SUCCEEDS);
        expect("thread", SUCCEEDS);
        expect("execve", KILLED);
        expect("unshare", KILLED);
        if (!GPUIPC_SANITIZED) /* sanitizer builds let ptrace through: LeakSanitizer needs it */
                expect("ptrace", KILLED);
        return failures ? 1 : 0;
}
