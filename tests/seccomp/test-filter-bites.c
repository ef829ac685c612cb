/* Proves the broker's sandbox bites and fails safe: under the same Landlock rules and seccomp
 * filter the broker loads, a call of the [kill] section (execve, ptrace, unshare) kills the process
 * with SIGSYS and the log names it; any other call outside the allow-list (socket(AF_INET),
 * memfd_create, sysinfo) fails with ENOSYS, the process goes on, and the log names the call and the
 * request being served (rate-limited, counted); opening a file outside the allowed paths is
 * refused, while what the broker needs still works. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "landlock.h"
#include "log.h"
#include "sandbox.h"

static char dir[] = "/tmp/gpuipc-sandbox-XXXXXX";
static bool json_log;
static char sock_path[256], log_path[256], outside[256];

typedef int (*Attempt)(void);

/* Runs attempt in a child confined like the broker; returns its wait status. The child's stderr
 * (where the broker logs the trapped call) goes to log_path. */
static int run_confined(Attempt attempt)
{
        pid_t pid = fork();
        int status;

        CHECK(pid >= 0);
        if (pid == 0) {
                int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
                if (fd < 0 || dup2(fd, STDERR_FILENO) < 0)
                        _exit(90);
                log_setup(json_log, LOG_WARN);
                if (landlock_confine(sock_path, NULL) < 0)
                        _exit(91);
                if (sandbox_apply(SANDBOX_ENFORCE) < 0)
                        _exit(92);
                _exit(attempt());
        }
        CHECK(waitpid(pid, &status, 0) == pid);
        return status;
}

static bool log_mentions(const char *what)
{
        char buf[4096] = "";
        FILE *f = fopen(log_path, "re");
        size_t n;

        CHECK(f);
        n = fread(buf, 1, sizeof(buf) - 1, f);
        buf[n] = 0;
        fclose(f);
        return strstr(buf, what) != NULL;
}

static int try_execve(void)
{
        char *argv[] = { "true", NULL };
        execve("/bin/true", argv, NULL);
        return 10; /* not killed: the filter did not bite */
}

static int try_ptrace(void)
{
        ptrace(PTRACE_TRACEME, 0, NULL, NULL);
        return 10;
}

static int try_unshare(void)
{
        unshare(CLONE_NEWUSER);
        return 10;
}

/* Refused, not killed: the call fails with ENOSYS while a request is named, and the process goes
 * on to make allowed calls. */
static int try_inet_socket(void)
{
        int fd;

        sandbox_set_context("stat", 7, 9);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        sandbox_clear_context();
        if (fd >= 0)
                return 10;
        if (errno != ENOSYS)
                return 11;
        return sandbox_refused_total() == 1 && getpid() > 0 ? 0 : 12;
}

/* glibc's qsort asked for this once its array passed 1 KiB (the crash of issue 18). */
static int try_sysinfo(void)
{
        struct sysinfo si;

        if (sysinfo(&si) == 0)
                return 10;
        return errno == ENOSYS ? 0 : 11;
}

/* A peer repeating a refused path: every call fails, the log gets the 1st, 2nd, 4th and 8th. */
static int try_memfd_repeatedly(void)
{
        for (int i = 0; i < 10; i++) {
                int fd = memfd_create("x", MFD_CLOEXEC);
                if (fd >= 0)
                        return 10;
                if (errno != ENOSYS)
                        return 11;
        }
        return sandbox_refused_total() == 10 ? 0 : 12;
}

static int try_open_outside(void)
{
        int fd = open(outside, O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
                return 10;
        return errno == EACCES ? 0 : 11;
}

static int try_create_in_socket_dir(void)
{
        char path[300];
        int fd;

        snprintf(path, sizeof(path), "%s/new-file", dir);
        fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0)
                return 10;
        return errno == EACCES ? 0 : 11;
}

static int try_proc_and_unlink(void)
{
        char buf[256];
        int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);

        if (fd < 0 || read(fd, buf, sizeof(buf)) <= 0)
                return 20;
        close(fd);
        return unlink(sock_path) == 0 ? 0 : 23;
}

static unsigned log_count(const char *what)
{
        char buf[8192] = "";
        FILE *f = fopen(log_path, "re");
        unsigned n = 0;

        CHECK(f);
        buf[fread(buf, 1, sizeof(buf) - 1, f)] = 0;
        fclose(f);
        for (const char *p = buf; (p = strstr(p, what)); p++)
                n++;
        return n;
}

static void check_killed(Attempt attempt, const char *logged)
{
        int st = run_confined(attempt);
        CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS, "not killed by SIGSYS (status %#x)", st);
        CHECK(log_mentions(logged));
        CHECK(log_mentions("forbidden system call"));
}

/* The [kill] section: calls no path of the broker makes. */
static void test_forbidden_calls_kill(void)
{
        check_killed(try_execve, "syscall=execve");
        /* LeakSanitizer's tracer needs ptrace: sanitizer builds allow it ([sanitizer]). */
        if (!GPUIPC_SANITIZED)
                check_killed(try_ptrace, "syscall=ptrace");
        check_killed(try_unshare, "syscall=unshare");
}

/* Anything else outside the allow-list fails with ENOSYS and is logged with the request. */
static void test_unexpected_calls_refused(void)
{
        int st = run_confined(try_inet_socket);

        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "socket(AF_INET): status %#x", st);
        CHECK(log_mentions("was refused (ENOSYS) syscall=socket"));
        CHECK(log_mentions("op=stat peer=7 request=9"));
        st = run_confined(try_sysinfo);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sysinfo: status %#x", st);
        CHECK(log_mentions("syscall=sysinfo"));
        CHECK(log_mentions("op=none"));
        st = run_confined(try_memfd_repeatedly);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "memfd_create: status %#x", st);
        CHECK_EQ(log_count("syscall=memfd_create"), 4);
        CHECK(log_mentions("times=8"));
        CHECK(!log_mentions("times=9"));
}

/* The JSON form of the same line, as an operator's log pipeline reads it. */
static void test_refusal_logged_as_json(void)
{
        int st;

        json_log = true;
        st = run_confined(try_inet_socket);
        json_log = false;
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
        CHECK(log_mentions("\"level\":\"error\""));
        CHECK(log_mentions("\"syscall\":\"socket\",\"nr\":41,\"times\":1,\"op\":\"stat\",\"peer\":7,"
                           "\"request\":9}"));
}

static void test_files_refused(void)
{
        int st = run_confined(try_open_outside);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        st = run_confined(try_create_in_socket_dir);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_allowed_still_work(void)
{
        int st = run_confined(try_proc_and_unlink);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void)
{
        int fd;

        if (!HAVE_SECCOMP) {
                fprintf(stderr, "built without libseccomp: skipped\n");
                return 77;
        }
        CHECK(mkdtemp(dir));
        snprintf(sock_path, sizeof(sock_path), "%s/s.sock", dir);
        snprintf(log_path, sizeof(log_path), "%s.log", dir);
        snprintf(outside, sizeof(outside), "%s.outside", dir);
        fd = open(outside, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        CHECK(fd >= 0 && write(fd, "x", 1) == 1);
        close(fd);
        fd = open(sock_path, O_WRONLY | O_CREAT, 0600); /* stands in for the socket file */
        CHECK(fd >= 0);
        close(fd);

        test_forbidden_calls_kill();
        test_unexpected_calls_refused();
        test_refusal_logged_as_json();
        test_files_refused();
        test_allowed_still_work();

        unlink(outside);
        unlink(log_path);
        unlink(sock_path);
        rmdir(dir);
        printf("sandbox: execve, ptrace, unshare killed with SIGSYS; socket(AF_INET), sysinfo, memfd_create "
               "refused with ENOSYS and logged with the request; files outside refused\n");
        return 0;
}
