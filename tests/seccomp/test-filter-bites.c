/* Proves the broker's sandbox bites: under the same Landlock rules and seccomp filter the broker
 * loads, execve and socket(AF_INET) kill the process (SIGSYS, and the log names the call), and
 * opening a file outside the allowed paths is refused, while what the broker needs still works. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "landlock.h"
#include "log.h"
#include "sandbox.h"

static char dir[] = "/tmp/gpuipc-sandbox-XXXXXX";
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
                log_setup(false, LOG_WARN);
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

static int try_inet_socket(void)
{
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        return fd >= 0 ? 10 : 11;
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

/* What the broker does at run time keeps working. */
static int try_allowed(void)
{
        char buf[256];
        int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);

        if (fd < 0 || read(fd, buf, sizeof(buf)) <= 0)
                return 20;
        close(fd);
        fd = memfd_create("x", MFD_CLOEXEC); /* not on the list: must be killed */
        return fd >= 0 ? 21 : 22;
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

static void test_execve_killed(void)
{
        int st = run_confined(try_execve);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS);
        CHECK(log_mentions("syscall=execve"));
}

static void test_inet_socket_killed(void)
{
        int st = run_confined(try_inet_socket);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS);
        CHECK(log_mentions("syscall=socket"));
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
        st = run_confined(try_allowed);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS);
        CHECK(log_mentions("syscall=memfd_create"));
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

        test_execve_killed();
        test_inet_socket_killed();
        test_files_refused();
        test_allowed_still_work();

        unlink(outside);
        unlink(log_path);
        unlink(sock_path);
        rmdir(dir);
        printf("sandbox: execve and socket(AF_INET) killed with SIGSYS and logged; files outside refused\n");
        return 0;
}
