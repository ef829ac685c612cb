/* Integration-test harness: see harness.h. */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fdpass.h"
#include "internal.h"
#include "pattern.h"

#define MAX_BROKERS        8
#define LOG_TAIL_BYTES     6000
#define STOP_DEADLINE_MS   5000
#define READY_DEADLINE_MS  10000
#define SETTLE_DEADLINE_MS 5000

/* ---- state of this process ---- */

static const char *case_name = ""; /* the running case */
static char case_dir_path[96];
static const char *role; /* a child's name; NULL in the case process itself */
static int role_up = -1; /* a child's report channel */
static uint64_t started_ms;
static unsigned case_timeout_s = 60;
static HBroker *brokers[MAX_BROKERS];
static size_t n_brokers;

void h_sleep_ms(unsigned ms)
{
        struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

const char *h_case_dir(void)
{
        return case_dir_path;
}

static const char *env_or(const char *name, const char *fallback)
{
        const char *v = getenv(name);
        return v && *v ? v : fallback;
}

const char *h_ctl_path(void)
{
        return env_or("GPUIPC_CTL", "");
}

static const char *seccomp_mode(void)
{
        return env_or("GPUIPC_TEST_SECCOMP", "off");
}

static void vlog(const char *prefix, const char *fmt, va_list ap)
{
        char line[1400];
        int n;

        n = snprintf(line, sizeof(line), "# [%s%s%s +%llums] %s", case_name, role ? "/" : "",
                     role ? role : "", (unsigned long long)(monotonic_ms() - started_ms), prefix);
        if (n < 0 || (size_t)n >= sizeof(line))
                n = 0;
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
        n = (int)strlen(line);
        if ((size_t)n < sizeof(line) - 1)
                line[n++] = '\n';
        (void)!write(STDERR_FILENO, line, (size_t)n);
}

void h_log(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vlog("", fmt, ap);
        va_end(ap);
}

/* ---- diagnostics ---- */

static void put(const char *s)
{
        (void)!write(STDERR_FILENO, s, strlen(s));
}

/* Prints the seccomp verdicts the broker logged: each syscall outside the allow-list, refused or
 * fatal. */
static void report_seccomp(const char *log, size_t len)
{
        const char *p = log, *end = log + len;

        while (p < end && (p = memmem(p, (size_t)(end - p), "seccomp:", 8))) {
                const char *sc = memmem(p, (size_t)(end - p), "\"syscall\":\"", 11);
                char line[200];

                if (!sc) {
                        const char *text = memmem(p, (size_t)(end - p), "syscall=", 8);
                        sc = text ? text - 3 : NULL;
                }
                if (sc) {
                        const char *name = sc + 11, *q = name;
                        while (q < end && *q != '"' && *q != '\n' && *q != ' ')
                                q++;
                        snprintf(line, sizeof(line), "!!! the broker's seccomp filter %s: syscall=%.*s\n",
                                 memmem(p, (size_t)(q - p), "killed", 6) ? "killed it" : "refused a call",
                                 (int)(q - name), name);
                        put(line);
                }
                p += 8;
        }
}

/* The broker's state and the tail of its log, with read/write only: this also runs from the
 * alarm handler of a case that hangs. */
static void dump_broker(HBroker *b)
{
        static char tail[LOG_TAIL_BYTES + 1];
        char line[300];
        ssize_t n;
        int fd, st;

        if (b->pid > 0) {
                pid_t w = waitpid(b->pid, &st, WNOHANG);
                if (w == b->pid) {
                        b->pid = 0;
                        if (WIFEXITED(st))
                                snprintf(line, sizeof(line), "--- broker %s exited with status %d\n",
                                         b->sock, WEXITSTATUS(st));
                        else
                                snprintf(line, sizeof(line), "--- broker %s was killed by signal %d\n",
                                         b->sock, WTERMSIG(st));
                } else {
                        snprintf(line, sizeof(line), "--- broker %s (pid %d) is running\n", b->sock,
                                 (int)b->pid);
                }
        } else {
                snprintf(line, sizeof(line), "--- broker %s is stopped\n", b->sock);
        }
        put(line);
        fd = open(b->log, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        if (lseek(fd, 0, SEEK_END) > LOG_TAIL_BYTES)
                lseek(fd, -LOG_TAIL_BYTES, SEEK_END);
        else
                lseek(fd, 0, SEEK_SET);
        n = read(fd, tail, LOG_TAIL_BYTES);
        close(fd);
        if (n <= 0)
                return;
        tail[n] = 0;
        snprintf(line, sizeof(line), "--- tail of %s:\n", b->log);
        put(line);
        put(tail);
        if (tail[n - 1] != '\n')
                put("\n");
        report_seccomp(tail, (size_t)n);
}

static void dump_brokers(void)
{
        for (size_t i = 0; i < n_brokers; i++)
                dump_broker(brokers[i]);
}

static void send_msg(int fd, char tag, const char *text);

void h_fail(const char *file, int line, const char *fmt, ...)
{
        char msg[1200], where[1400];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        snprintf(where, sizeof(where), "%s:%d: %s", file, line, msg);
        if (role) {
                h_log("FAIL %s", where);
                if (role_up >= 0)
                        send_msg(role_up, 'E', where);
                _exit(1);
        }
        fflush(stdout);
        h_log("FAIL %s", where);
        dump_brokers();
        _exit(1);
}

void h_skip(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vlog("SKIP ", fmt, ap);
        va_end(ap);
        for (size_t i = 0; i < n_brokers; i++)
                if (brokers[i]->pid > 0)
                        kill(brokers[i]->pid, SIGKILL);
        _exit(77);
}

void h_known_bug(const char *file, int line, const char *id, const char *what, bool ok)
{
        if (ok) {
                h_log("XPASS %s:%d: known bug %s no longer shows (%s): make this a CHECK", file, line, id,
                      what);
                return;
        }
        if (strcmp(env_or("GPUIPC_TEST_STRICT", "0"), "1") == 0)
                h_fail(file, line, "known bug %s: %s", id, what);
        h_log("XFAIL %s:%d: known bug %s: %s", file, line, id, what);
}

/* ---- the runner ---- */

static pid_t running_case;

static void case_alarm(int sig)
{
        char line[200];

        (void)sig;
        snprintf(line, sizeof(line), "TIMEOUT: case %s did not finish within %u s\n", case_name,
                 case_timeout_s);
        put(line);
        dump_brokers();
        _exit(1);
}

static void runner_alarm(int sig)
{
        (void)sig;
        put("TIMEOUT: the test binary ran out of time\n");
        if (running_case > 0)
                kill(-running_case, SIGKILL);
        _exit(1);
}

static int rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
        (void)st;
        (void)type;
        (void)ftw;
        remove(path);
        return 0;
}

static void rm_rf(const char *path)
{
        nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Reaps whatever the case left behind (we are their subreaper), for at most deadline_ms. */
static void reap_orphans(int deadline_ms)
{
        uint64_t end = monotonic_ms() + (uint64_t)deadline_ms;

        for (;;) {
                pid_t w = waitpid(-1, NULL, WNOHANG);
                if (w < 0 || monotonic_ms() >= end)
                        return;
                if (w == 0)
                        h_sleep_ms(2);
        }
}

/* Runs one case in a forked process group; returns its exit status (1 on timeout). */
static void require_no_refusals(const HBroker *b);

static int run_case(const HTest *t, const char *root, size_t index)
{
        uint64_t deadline;
        int status = 0;
        pid_t pid;

        snprintf(case_dir_path, sizeof(case_dir_path), "%s/%zu", root, index);
        if (mkdir(case_dir_path, 0700) < 0) {
                fprintf(stderr, "cannot create %s: %s\n", case_dir_path, strerror(errno));
                return 1;
        }
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0)
                return 1;
        if (pid == 0) {
                setpgid(0, 0);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                signal(SIGALRM, case_alarm);
                case_name = t->name;
                started_ms = monotonic_ms();
                alarm(case_timeout_s);
                t->fn();
                for (size_t i = 0; i < n_brokers; i++) {
                        if (brokers[i]->pid > 0)
                                h_fail(__FILE__, __LINE__, "the case left broker %s running",
                                       brokers[i]->sock);
                        require_no_refusals(brokers[i]);
                }
                fflush(stdout);
                _exit(0);
        }
        setpgid(pid, pid);
        running_case = pid;
        deadline = monotonic_ms() + (uint64_t)case_timeout_s * 1000 + 5000;
        for (;;) {
                siginfo_t si = { 0 };

                /* Exited, but not reaped yet: its pid (the group's id) cannot be reused meanwhile. */
                if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid)
                        break;
                if (monotonic_ms() >= deadline) {
                        fprintf(stderr, "case %s: no exit after %u s; killing it\n", t->name,
                                case_timeout_s + 5);
                        break;
                }
                h_sleep_ms(5);
        }
        /* Whatever the case started and left behind dies with it (a case that hung too). */
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        running_case = 0;
        reap_orphans(3000);
        if (WIFSIGNALED(status)) {
                fprintf(stderr, "case %s: killed by signal %d\n", t->name, WTERMSIG(status));
                return 1;
        }
        return WEXITSTATUS(status);
}

int h_main(int argc, char **argv, const HTest *tests, size_t n_tests)
{
        const char *filter = argc > 1 ? argv[1] : NULL;
        const char *tmp = env_or("TMPDIR", "/tmp");
        char root[64];
        unsigned passed = 0, failed = 0, skipped = 0, selected = 0;
        bool keep = strcmp(env_or("GPUIPC_TEST_KEEP", "0"), "1") == 0;

        setvbuf(stdout, NULL, _IOLBF, 0);
        signal(SIGPIPE, SIG_IGN);
        started_ms = monotonic_ms();
        case_timeout_s = (unsigned)strtoul(env_or("GPUIPC_TEST_CASE_TIMEOUT", "60"), NULL, 10);
        if (case_timeout_s == 0)
                case_timeout_s = 60;
        if (access(env_or("GPUIPC_BROKER", ""), X_OK) < 0 || access(h_ctl_path(), X_OK) < 0) {
                printf("SKIP: GPUIPC_BROKER and GPUIPC_CTL must name the broker and gpuipcctl (meson test "
                       "sets them)\n");
                return 77;
        }
        if (strcmp(seccomp_mode(), "off") && strcmp(seccomp_mode(), "enforce") &&
            strcmp(seccomp_mode(), "log")) {
                printf("GPUIPC_TEST_SECCOMP is off, log or enforce, not '%s'\n", seccomp_mode());
                return 1;
        }
        /* Socket paths must fit in sun_path: keep the root short. */
        if (strlen(tmp) > 40)
                tmp = "/tmp";
        snprintf(root, sizeof(root), "%s/gpuipc-it.XXXXXX", tmp);
        if (!mkdtemp(root)) {
                printf("cannot create a temporary directory under %s: %s\n", tmp, strerror(errno));
                return 1;
        }
        prctl(PR_SET_CHILD_SUBREAPER, 1);
        for (size_t i = 0; i < n_tests; i++)
                selected += !filter || strstr(tests[i].name, filter);
        signal(SIGALRM, runner_alarm);
        alarm(selected * (case_timeout_s + 10) + 30);
        printf("# broker seccomp mode: %s\n", seccomp_mode());
        for (size_t i = 0; i < n_tests; i++) {
                uint64_t t0 = monotonic_ms();
                int r;

                if (filter && !strstr(tests[i].name, filter))
                        continue;
                r = run_case(&tests[i], root, i);
                if (r == 0)
                        passed++;
                else if (r == 77)
                        skipped++;
                else
                        failed++;
                printf("%s %s (%llu ms)\n",
                       r == 0    ? "ok  "
                       : r == 77 ? "skip"
                                 : "FAIL",
                       tests[i].name, (unsigned long long)(monotonic_ms() - t0));
                if (r != 0 && r != 77 && keep)
                        printf("# kept %s\n", case_dir_path);
        }
        if (!keep)
                rm_rf(root);
        printf("%u passed, %u failed, %u skipped\n", passed, failed, skipped);
        if (failed)
                return 1;
        return passed == 0 && skipped > 0 ? 77 : 0;
}

/* ---- the broker ---- */

/* Occurrences of needle in the file at path. */
static unsigned file_count(const char *path, const char *needle)
{
        size_t nlen = strlen(needle), len = 0, cap = 0;
        char *buf = NULL;
        unsigned n = 0;
        int fd = open(path, O_RDONLY | O_CLOEXEC);

        if (fd < 0)
                return 0;
        for (;;) {
                ssize_t r;

                if (len == cap) {
                        char *nb = realloc(buf, cap ? cap * 2 : 65536);
                        if (!nb)
                                break;
                        buf = nb;
                        cap = cap ? cap * 2 : 65536;
                }
                r = read(fd, buf + len, cap - len);
                if (r <= 0)
                        break;
                len += (size_t)r;
        }
        close(fd);
        for (const char *p = buf; p && (p = memmem(p, len - (size_t)(p - buf), needle, nlen)); p += nlen)
                n++;
        free(buf);
        return n;
}

unsigned h_broker_log_count(const HBroker *b, const char *needle)
{
        return file_count(b->log, needle);
}

/* The sweep of docs/security.md "The filter fails safe": a broker under its filter that had to
 * refuse a call (a libc path the allow-list misses) logged it, and answered one request worse for
 * it; every case of every suite that runs a broker fails on that line, in every run of its broker. */
static void require_no_refusals(const HBroker *b)
{
        for (int run = 1; run <= b->runs; run++) {
                char path[sizeof(b->dir) + 32];

                snprintf(path, sizeof(path), "%s/broker-%d.log", b->dir, run);
                if (file_count(path, "seccomp:")) {
                        dump_broker((HBroker *)b);
                        h_fail(__FILE__, __LINE__,
                               "broker %s (run %d) logged a system call outside its allow-list "
                               "(seccomp/gpuipc-broker.allow)", b->sock, run);
                }
        }
}

int h_broker_fds(const HBroker *b)
{
        char path[64];
        struct dirent *e;
        DIR *d;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int)b->pid);
        d = opendir(path);
        if (!d)
                return -1;
        while ((e = readdir(d)))
                n += e->d_name[0] != '.';
        closedir(d);
        return n;
}

long h_broker_rss_kb(const HBroker *b)
{
        char path[64], line[256];
        long kb = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)b->pid);
        f = fopen(path, "re");
        CHECKF(f, "cannot read %s", path);
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
                        break;
        fclose(f);
        CHECK(kb > 0);
        return kb;
}

bool h_broker_rss_meaningful(void)
{
#ifdef __SANITIZE_ADDRESS__
        return false;
#endif
        return !(getenv("GPUIPC_TEST_WRAPPER") && *getenv("GPUIPC_TEST_WRAPPER"));
}

size_t h_largest_meta(unsigned char *buf)
{
        size_t pad = PROTO_MAX_META - 8;

        buf[0] = 0x81;
        buf[1] = 0xa3;
        memcpy(buf + 2, "pad", 3);
        buf[5] = 0xda;
        buf[6] = (unsigned char)(pad >> 8);
        buf[7] = (unsigned char)pad;
        memset(buf + 8, 'x', pad);
        return PROTO_MAX_META;
}

static void list_fds(const HBroker *b)
{
        char path[64], link[PATH_MAX + 80], target[PATH_MAX];
        struct dirent *e;
        DIR *d;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int)b->pid);
        d = opendir(path);
        if (!d)
                return;
        while ((e = readdir(d))) {
                ssize_t n;

                if (e->d_name[0] == '.')
                        continue;
                snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
                n = readlink(link, target, sizeof(target) - 1);
                target[n > 0 ? n : 0] = 0;
                h_log("  broker fd %s -> %s", e->d_name, target);
        }
        closedir(d);
}

/* Fails with the log when the broker is no longer running. */
static void require_alive(HBroker *b, const char *when)
{
        int st;

        if (b->pid > 0 && waitpid(b->pid, &st, WNOHANG) == b->pid) {
                b->pid = 0;
                if (strcmp(seccomp_mode(), "off") && h_broker_log_count(b, "built without libseccomp"))
                        h_skip("the broker was built without libseccomp; --seccomp=%s cannot run",
                               seccomp_mode());
                h_fail(__FILE__, __LINE__, "the broker died %s (%s %d)", when,
                       WIFEXITED(st) ? "exit status" : "signal",
                       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        }
}

/* Every peer that connected was processed as disconnected (the log says so). */
static bool broker_idle(const HBroker *b)
{
        return h_broker_log_count(b, "\"msg\":\"peer connected\"") ==
               h_broker_log_count(b, "\"msg\":\"peer disconnected\"");
}

/* Waits until the broker answers a ping. On its first start, also until it is idle, and records
 * its idle fd count: the baseline every case returns to. A restarted broker has the same baseline,
 * and reconnecting clients may already be talking to it, so it is not measured again. */
static void broker_wait_ready(HBroker *b)
{
        uint64_t deadline = monotonic_ms() + READY_DEADLINE_MS;
        int prev = -1, stable = 0;

        for (;;) {
                gpuipc_options_t o = { .struct_size = sizeof(o), .socket_path = b->sock, .label = "harness-probe",
                                       .no_gpus = 1, .no_reconnect = 1 };
                gpuipc_t *c = NULL;

                require_alive(b, "while starting");
                if (gpuipc_connect(&c, &o) == 0) {
                        int r = gpuipc_ping(c, 2000);
                        gpuipc_close(c);
                        if (r == 0)
                                break;
                }
                CHECKF(monotonic_ms() < deadline, "the broker did not answer on %s within %d ms", b->sock,
                       READY_DEADLINE_MS);
                h_sleep_ms(5);
        }
        if (b->runs > 1)
                return;
        /* The probe's disconnect must be processed before the baseline is taken. */
        WAIT_UNTIL(broker_idle(b), SETTLE_DEADLINE_MS);
        while (stable < 3) {
                int n = h_broker_fds(b);
                CHECKF(monotonic_ms() < deadline, "the broker's fd count did not settle");
                stable = n == prev ? stable + 1 : 0;
                prev = n;
                h_sleep_ms(5);
        }
        b->baseline_fds = prev;
}

static void broker_spawn(HBroker *b)
{
        static char wrapper[512];
        const char *argv[60];
        size_t n = 0;
        int logfd;
        pid_t pid;

        snprintf(b->log, sizeof(b->log), "%s/broker-%d.log", b->dir, ++b->runs);
        /* An optional wrapper, e.g. "valgrind -q --error-exitcode=99" (with --seccomp off). */
        snprintf(wrapper, sizeof(wrapper), "%s", env_or("GPUIPC_TEST_WRAPPER", ""));
        for (char *save = NULL, *w = strtok_r(wrapper, " ", &save); w && n < 16;
             w = strtok_r(NULL, " ", &save))
                argv[n++] = w;
        argv[n++] = env_or("GPUIPC_BROKER", "gpuipc-broker");
        argv[n++] = "--socket";
        argv[n++] = b->sock;
        argv[n++] = "--seccomp";
        argv[n++] = seccomp_mode();
        argv[n++] = "--log-format";
        argv[n++] = "json";
        for (size_t i = 0; i < b->n_args; i++)
                argv[n++] = b->args[i];
        argv[n] = NULL;
        logfd = open(b->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        CHECKF(logfd >= 0, "cannot create %s: %s", b->log, strerror(errno));
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
                int devnull = open("/dev/null", O_RDWR);

                prctl(PR_SET_PDEATHSIG, SIGKILL);
                dup2(devnull, STDIN_FILENO);
                dup2(logfd, STDOUT_FILENO);
                dup2(logfd, STDERR_FILENO);
                close_range(3, ~0u, 0);
                signal(SIGPIPE, SIG_DFL);
                signal(SIGALRM, SIG_DFL);
                execvp(argv[0], (char *const *)argv);
                _exit(127);
        }
        close(logfd);
        b->pid = pid;
        broker_wait_ready(b);
}

HBroker *h_broker_start(const char *const *extra)
{
        HBroker *b;

        CHECKF(n_brokers < MAX_BROKERS, "too many brokers in one case");
        b = calloc(1, sizeof(*b));
        CHECK(b);
        snprintf(b->dir, sizeof(b->dir), "%s/b%zu", case_dir_path, n_brokers);
        CHECKF(mkdir(b->dir, 0700) == 0, "mkdir %s: %s", b->dir, strerror(errno));
        CHECKF(strlen(b->dir) + 8 < sizeof(b->sock), "socket path under %s is too long", b->dir);
        snprintf(b->sock, sizeof(b->sock), "%s/s.sock", b->dir);
        for (size_t i = 0; extra && extra[i]; i++) {
                CHECK(b->n_args < sizeof(b->args) / sizeof(b->args[0]));
                b->args[b->n_args++] = extra[i];
        }
        brokers[n_brokers++] = b;
        broker_spawn(b);
        return b;
}

void h_broker_restart(HBroker *b)
{
        CHECKF(b->pid == 0, "restart needs a stopped broker");
        broker_spawn(b);
}

unsigned h_broker_stop(HBroker *b)
{
        uint64_t t0 = monotonic_ms();
        struct stat st;
        int status;

        require_alive(b, "before it was told to stop");
        CHECK(kill(b->pid, SIGTERM) == 0);
        for (;;) {
                pid_t w = waitpid(b->pid, &status, WNOHANG);

                if (w == b->pid)
                        break;
                if (monotonic_ms() - t0 > STOP_DEADLINE_MS) {
                        kill(b->pid, SIGKILL);
                        waitpid(b->pid, &status, 0);
                        b->pid = 0;
                        h_fail(__FILE__, __LINE__, "the broker did not exit within %d ms of SIGTERM",
                               STOP_DEADLINE_MS);
                }
                h_sleep_ms(2);
        }
        b->pid = 0;
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the broker ended with %s %d after SIGTERM",
               WIFEXITED(status) ? "exit status" : "signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        CHECKF(lstat(b->sock, &st) < 0 && errno == ENOENT, "the broker left its socket file %s behind",
               b->sock);
        return (unsigned)(monotonic_ms() - t0);
}

void h_broker_kill9(HBroker *b)
{
        CHECK(b->pid > 0);
        kill(b->pid, SIGKILL);
        waitpid(b->pid, NULL, 0);
        b->pid = 0;
}

void h_broker_settle(const HBroker *b)
{
        uint64_t deadline = monotonic_ms() + SETTLE_DEADLINE_MS;
        unsigned connected, disconnected;
        int n;

        require_alive((HBroker *)b, "during the case");
        for (;;) {
                connected = h_broker_log_count(b, "\"msg\":\"peer connected\"");
                disconnected = h_broker_log_count(b, "\"msg\":\"peer disconnected\"");
                n = h_broker_fds(b);
                if (connected == disconnected && n == b->baseline_fds)
                        return;
                if (monotonic_ms() >= deadline)
                        break;
                h_sleep_ms(2);
        }
        list_fds(b);
        h_fail(__FILE__, __LINE__,
               "%d ms after the case: %u peers connected, %u disconnected; the broker holds %d fds, %d when "
               "it "
               "started (a connection or an fd leaked)",
               SETTLE_DEADLINE_MS, connected, disconnected, n, b->baseline_fds);
}

/* ---- libgpuipc peers ---- */

int h_try_connect(const HBroker *b, gpuipc_options_t *opts, gpuipc_t **ret)
{
        opts->socket_path = b->sock;
        opts->no_gpus = 1;
        return gpuipc_connect(ret, opts);
}

gpuipc_t *h_connect(const HBroker *b, const char *label)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .label = label, .no_reconnect = 1 };
        gpuipc_t *c = NULL;
        int r = h_try_connect(b, &o, &c);

        CHECKF(r == 0, "connect to %s: %s [%s]", b->sock, gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

/* Seed 0 is gpuipcctl's "counter", any other "random:SEED" (cli/pattern.c makes both). */
static Pattern pattern_of(uint64_t seed)
{
        return (Pattern){ seed ? PATTERN_RANDOM : PATTERN_COUNTER, seed };
}

void h_pattern_fill(void *dst, size_t len, uint64_t seed)
{
        Pattern p = pattern_of(seed);

        pattern_fill(&p, 0, dst, len);
}

size_t h_pattern_check(const void *src, size_t len, uint64_t seed)
{
        Pattern p = pattern_of(seed);

        return pattern_check(&p, 0, src, len);
}

gpuipc_buffer_t *h_publish(gpuipc_t *c, const char *name, size_t size, uint64_t seed,
                           const gpuipc_publish_options_t *opts)
{
        gpuipc_buffer_t *b = NULL;

        CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, size, 0, &b));
        h_pattern_fill(gpuipc_buffer_ptr(b), size, seed);
        CHECK_OK(c, gpuipc_publish(c, b, name, opts));
        CHECK(gpuipc_buffer_id(b) != 0);
        return b;
}

void h_verify(const gpuipc_buffer_t *b, uint64_t seed)
{
        size_t at;

        CHECK(gpuipc_buffer_ptr(b) != NULL);
        at = h_pattern_check(gpuipc_buffer_ptr(b), gpuipc_buffer_size(b), seed);
        CHECKF(at == SIZE_MAX, "buffer '%s' differs from pattern %llu at byte %zu of %zu",
               gpuipc_buffer_name(b), (unsigned long long)seed, at, gpuipc_buffer_size(b));
}

gpuipc_buffer_t *h_attach_verify(gpuipc_t *c, const char *name, int timeout_ms, uint64_t seed)
{
        gpuipc_buffer_t *b = NULL;

        CHECK_OK(c, gpuipc_attach(c, name, timeout_ms, &b));
        CHECK(strcmp(gpuipc_buffer_name(b), name) == 0);
        h_verify(b, seed);
        return b;
}

int h_next_event_of(gpuipc_t *c, gpuipc_event_type_t type, int timeout_ms, gpuipc_event_t *ret)
{
        uint64_t deadline = monotonic_ms() + (uint64_t)timeout_ms;

        for (;;) {
                uint64_t now = monotonic_ms();
                int r = gpuipc_next_event(c, now >= deadline ? 0 : (int)(deadline - now), ret);

                if (r < 0)
                        return r;
                if (ret->type == type)
                        return 0;
        }
}

/* Raw requests go through the library's internals: they hold the connection's lock while the
 * reply is read, as the public calls do (a ring thread may read the socket otherwise). */
static int stat_request(gpuipc_t *c, ProtoMsg *req, HStat *ret)
{
        CLIENT_LOCKED(c);
        Frame f = { .fd = -1 };
        int r = client_request(c, req, -1, H_SOON_MS, &f);

        if (r < 0)
                return r;
        *ret = (HStat){
                .buffer = f.msg.buffer,
                .generation = f.msg.generation,
                .refs = f.msg.refs,
                .holders = f.msg.holders,
                .owner = f.msg.owner,
                .size = f.msg.size,
                .state = f.msg.state,
                .broker_held = f.msg.broker_held,
        };
        frame_free(&f);
        return 0;
}

int h_stat(gpuipc_t *c, const char *name, HStat *ret)
{
        ProtoMsg req = { .op = PROTO_OP_STAT, .name = proto_str(name) };

        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_NAME);
        return stat_request(c, &req, ret);
}

int h_stat_id(gpuipc_t *c, uint64_t id, HStat *ret)
{
        ProtoMsg req = { .op = PROTO_OP_STAT, .buffer = id };

        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_BUFFER);
        return stat_request(c, &req, ret);
}

uint64_t h_stats(gpuipc_t *c, const char *key)
{
        CLIENT_LOCKED(c);
        ProtoMsg req = { .op = PROTO_OP_STATS, .has = PROTO_BIT(PF_OP) }, rec;
        Frame f = { .fd = -1 };
        ProtoIter it;
        int r;

        CHECK_OK(c, client_request(c, &req, -1, H_SOON_MS, &f));
        proto_iter_init(&it, &f.msg.items);
        while ((r = proto_iter_next(&it, &rec)) == 1) {
                if (proto_str_eq(rec.name, key)) {
                        uint64_t v = rec.value;
                        frame_free(&f);
                        return v;
                }
        }
        frame_free(&f);
        h_fail(__FILE__, __LINE__, "the stats reply has no '%s' (iter %d)", key, r);
}

unsigned h_list_count(gpuipc_t *c, const char *prefix)
{
        return h_list_ids(c, prefix, NULL, NULL, 0);
}

unsigned h_list_ids(gpuipc_t *c, const char *prefix, uint64_t *ids, char (*names)[PROTO_MAX_NAME + 1],
                    unsigned max)
{
        CLIENT_LOCKED(c);
        uint64_t after = 0;
        unsigned n = 0;
        bool more = true;

        while (more) {
                ProtoMsg req = { .op = PROTO_OP_LIST, .prefix = proto_str(prefix), .after = after }, rec;
                Frame f = { .fd = -1 };
                ProtoIter it;

                req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_PREFIX) | PROTO_BIT(PF_AFTER);
                CHECK_OK(c, client_request(c, &req, -1, H_SOON_MS, &f));
                proto_iter_init(&it, &f.msg.items);
                while (proto_iter_next(&it, &rec) == 1) {
                        if (n < max) {
                                ids[n] = rec.buffer;
                                proto_str_copy(rec.name, names[n], sizeof(names[n]));
                        }
                        n++;
                }
                more = f.msg.more;
                CHECK(!more || f.msg.after > after);
                after = f.msg.after;
                frame_free(&f);
        }
        return n;
}

gpuipc_buffer_t *h_ring_own_page(gpuipc_t *c, const char *ring)
{
        char names[16][PROTO_MAX_NAME + 1];
        gpuipc_buffer_t *page = NULL;
        uint64_t ids[16];
        unsigned n = h_list_ids(c, ring, ids, names, 16);

        for (unsigned i = 0; i < n && i < 16 && !page; i++)
                if (strstr(names[i], "@member.") && gpuipc_attach_id(c, ids[i], &page) < 0)
                        page = NULL;
        CHECKF(page, "no member page of ours among the %u parts of ring '%s'", n, ring);
        return page;
}

/* ---- child processes ---- */

/* Messages: a tag byte, a length byte, then that many bytes of text (one atomic pipe write). */
static void send_msg(int fd, char tag, const char *text)
{
        uint8_t buf[2 + 255];
        size_t len = strnlen(text, 255);

        buf[0] = (uint8_t)tag;
        buf[1] = (uint8_t)len;
        memcpy(buf + 2, text, len);
        (void)!write(fd, buf, len + 2);
}

/* Reads exactly len bytes before the deadline: 1, 0 at EOF, -ETIMEDOUT. */
static int read_full(int fd, void *buf, size_t len, uint64_t deadline)
{
        size_t got = 0;

        while (got < len) {
                struct pollfd p = { fd, POLLIN, 0 };
                uint64_t now = monotonic_ms();
                ssize_t n;

                if (now >= deadline)
                        return -ETIMEDOUT;
                if (poll(&p, 1, (int)(deadline - now)) == 0)
                        continue;
                n = read(fd, (char *)buf + got, len - got);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return 0;
                got += (size_t)n;
        }
        return 1;
}

/* One message: 1 with *tag and text (NUL-terminated), 0 at EOF, -ETIMEDOUT. */
static int recv_msg(int fd, int timeout_ms, char *tag, char text[256])
{
        uint64_t deadline = monotonic_ms() + (uint64_t)timeout_ms;
        uint8_t hdr[2];
        int r;

        r = read_full(fd, hdr, 2, deadline);
        if (r <= 0)
                return r;
        r = read_full(fd, text, hdr[1], deadline);
        if (r <= 0)
                return r < 0 ? r : 0;
        text[hdr[1]] = 0;
        *tag = (char)hdr[0];
        return 1;
}

void h_report(HChan *ch, char tag, const char *fmt, ...)
{
        char text[256];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(text, sizeof(text), fmt, ap);
        va_end(ap);
        send_msg(ch->wr, tag, text);
}

void h_await(HChan *ch, char tag, int timeout_ms)
{
        char text[256], got = 0;
        int r = recv_msg(ch->rd, timeout_ms, &got, text);

        CHECKF(r > 0, "waiting for command '%c' from the parent: %s", tag,
               r == 0 ? "it went away" : "timed out");
        CHECKF(got == tag, "expected command '%c' from the parent, got '%c'", tag, got);
}

/* Closes every fd but stdio and the two given (a child must not hold the parent's connections). */
static void close_all_but(int keep1, int keep2)
{
        int fds[4096], n = 0;
        DIR *d = opendir("/proc/self/fd");
        struct dirent *e;

        if (!d) {
                close_range(3, (unsigned)(keep1 < keep2 ? keep1 : keep2) - 1, 0);
                return;
        }
        while ((e = readdir(d)) && n < 4096) {
                int fd = atoi(e->d_name);
                if (e->d_name[0] != '.' && fd > 2 && fd != keep1 && fd != keep2 && fd != dirfd(d))
                        fds[n++] = fd;
        }
        closedir(d);
        for (int i = 0; i < n; i++)
                close(fds[i]);
}

static void child_setup(const char *name)
{
        role = name;
        started_ms = monotonic_ms();
        n_brokers = 0; /* the parent's brokers are not ours to dump or stop */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGALRM, SIG_DFL);
        signal(SIGPIPE, SIG_IGN);
        alarm(case_timeout_s);
}

HChild *h_spawn(const char *name, HChildFn fn, void *arg)
{
        HChild *c = calloc(1, sizeof(*c));
        int up[2], down[2];
        pid_t pid;

        CHECK(c);
        CHECK(pipe2(up, O_CLOEXEC) == 0 && pipe2(down, O_CLOEXEC) == 0);
        snprintf(c->name, sizeof(c->name), "%s", name);
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
                HChan ch = { down[0], up[1] };

                child_setup(c->name);
                close_all_but(ch.rd, ch.wr);
                role_up = ch.wr;
                _exit(fn(&ch, arg));
        }
        close(up[1]);
        close(down[0]);
        c->pid = pid;
        c->rd = up[0];
        c->wr = down[1];
        return c;
}

HChild *h_spawn_ctl(const HBroker *b, const char *name, ...)
{
        const char *argv[40];
        HChild *c = calloc(1, sizeof(*c));
        size_t n = 0;
        va_list ap;
        pid_t pid;

        CHECK(c);
        argv[n++] = h_ctl_path();
        argv[n++] = "--socket";
        argv[n++] = b->sock;
        va_start(ap, name);
        for (const char *a; (a = va_arg(ap, const char *)) && n < 39;)
                argv[n++] = a;
        va_end(ap);
        argv[n] = NULL;
        snprintf(c->name, sizeof(c->name), "%s", name);
        snprintf(c->out, sizeof(c->out), "%s/%s.out", case_dir_path, name);
        c->rd = c->wr = -1;
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
                int out = open(c->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
                int devnull = open("/dev/null", O_RDONLY);

                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (out < 0 || devnull < 0)
                        _exit(127);
                dup2(devnull, STDIN_FILENO);
                dup2(out, STDOUT_FILENO);
                dup2(out, STDERR_FILENO);
                close_range(3, ~0u, 0);
                signal(SIGPIPE, SIG_DFL);
                signal(SIGALRM, SIG_DFL);
                execv(argv[0], (char *const *)argv);
                _exit(127);
        }
        c->pid = pid;
        return c;
}

static void child_describe(const HChild *c, char *buf, size_t cap)
{
        if (!c->reaped)
                snprintf(buf, cap, "still running");
        else if (WIFEXITED(c->status))
                snprintf(buf, cap, "exit status %d", WEXITSTATUS(c->status));
        else
                snprintf(buf, cap, "killed by signal %d", WTERMSIG(c->status));
}

char *h_child_output(const HChild *c)
{
        size_t len = 0;
        char *buf = calloc(1, 65537);
        int fd;

        CHECK(buf);
        fd = c->out[0] ? open(c->out, O_RDONLY | O_CLOEXEC) : -1;
        if (fd < 0)
                return buf;
        for (ssize_t n; len < 65536 && (n = read(fd, buf + len, 65536 - len)) > 0;)
                len += (size_t)n;
        close(fd);
        return buf;
}

static bool child_try_reap(HChild *c)
{
        if (!c->reaped && waitpid(c->pid, &c->status, WNOHANG) == c->pid)
                c->reaped = true;
        return c->reaped;
}

void h_child_expect(HChild *c, char tag, int timeout_ms, char *buf, size_t cap)
{
        char text[256], got = 0, how[64];
        int r = recv_msg(c->rd, timeout_ms, &got, text);

        if (r == 0) {
                uint64_t end = monotonic_ms() + 2000;
                while (!child_try_reap(c) && monotonic_ms() < end)
                        h_sleep_ms(2);
                child_describe(c, how, sizeof(how));
                h_fail(__FILE__, __LINE__, "child %s went away (%s) before reporting '%c'", c->name, how,
                       tag);
        }
        CHECKF(r > 0, "child %s did not report '%c' within %d ms", c->name, tag, timeout_ms);
        CHECKF(got != 'E', "child %s failed: %s", c->name, text);
        CHECKF(got == tag, "child %s reported '%c' (%s), expected '%c'", c->name, got, text, tag);
        if (buf)
                snprintf(buf, cap, "%s", text);
}

bool h_child_quiet(HChild *c)
{
        struct pollfd p = { c->rd, POLLIN, 0 };

        return poll(&p, 1, 0) == 0;
}

void h_child_tell(HChild *c, char tag)
{
        send_msg(c->wr, tag, "");
}

int h_child_wait(HChild *c, int timeout_ms)
{
        uint64_t deadline = monotonic_ms() + (uint64_t)timeout_ms;

        while (!child_try_reap(c)) {
                if (monotonic_ms() >= deadline) {
                        char *out = h_child_output(c);
                        kill(c->pid, SIGKILL);
                        h_fail(__FILE__, __LINE__, "child %s did not exit within %d ms%s%s", c->name,
                               timeout_ms, out[0] ? "; its output:\n" : "", out);
                }
                h_sleep_ms(2);
        }
        if (WIFSIGNALED(c->status))
                return 128 + WTERMSIG(c->status);
        return WEXITSTATUS(c->status);
}

void h_child_wait_ok(HChild *c, int timeout_ms)
{
        int r = h_child_wait(c, timeout_ms);
        char text[256] = "", tag;

        if (r == 0)
                return;
        /* A child that failed a check said why on its channel. */
        if (c->rd >= 0 && recv_msg(c->rd, 0, &tag, text) > 0 && tag == 'E')
                h_fail(__FILE__, __LINE__, "child %s failed: %s", c->name, text);
        h_fail(__FILE__, __LINE__, "child %s exited with %d; its output:\n%s", c->name, r,
               h_child_output(c));
}

void h_child_kill9(HChild *c)
{
        CHECK(!c->reaped);
        CHECK(kill(c->pid, SIGKILL) == 0);
        CHECK_EQ(h_child_wait(c, H_SOON_MS), 128 + SIGKILL);
}

void h_child_free(HChild *c)
{
        if (!c)
                return;
        if (!child_try_reap(c)) {
                kill(c->pid, SIGKILL);
                waitpid(c->pid, &c->status, 0);
        }
        if (c->rd >= 0)
                close(c->rd);
        if (c->wr >= 0)
                close(c->wr);
        free(c);
}

/* ---- raw sockets ---- */

int h_raw_connect(const HBroker *b)
{
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        CHECK(fd >= 0);
        memcpy(sa.sun_path, b->sock, strlen(b->sock));
        CHECKF(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s: %s", b->sock,
               strerror(errno));
        return fd;
}

int h_raw_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds)
{
        union {
                char buf[CMSG_SPACE(sizeof(int) * 16)];
                struct cmsghdr align;
        } ctrl;
        struct iovec iov = { (void *)buf, len };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
        uint64_t deadline = monotonic_ms() + H_SOON_MS;

        CHECK(n_fds <= 16);
        if (n_fds) {
                struct cmsghdr *cm;

                memset(&ctrl, 0, sizeof(ctrl));
                mh.msg_control = ctrl.buf;
                mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
                cm = CMSG_FIRSTHDR(&mh);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
                memcpy(CMSG_DATA(cm), fds, sizeof(int) * n_fds);
        }
        for (;;) {
                struct pollfd p = { sock, POLLOUT, 0 };

                if (sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0)
                        return 0;
                if (errno != EAGAIN && errno != EINTR)
                        return -errno;
                if (monotonic_ms() >= deadline)
                        return -ETIMEDOUT;
                poll(&p, 1, 10);
        }
}

int h_raw_send_msg(int sock, ProtoMsg *m, uint8_t n_announce, const int *fds, size_t n_fds)
{
        static uint64_t next_id = 1000;
        ProtoBuf frame = { 0 };
        int r;

        if (m->type == PROTO_NONE && proto_has(m, PF_OP) && !proto_has(m, PF_ID)) {
                m->id = next_id++;
                proto_set(m, PF_ID);
        }
        CHECK_EQ(proto_frame_encode(&frame, m, n_announce), 0);
        r = h_raw_send(sock, frame.data, frame.len, fds, n_fds);
        proto_buf_free(&frame);
        return r;
}

HFrame *h_frame_new(void)
{
        HFrame *f = calloc(1, sizeof(*f));

        CHECK(f);
        f->fd = -1;
        return f;
}

void h_frame_free(HFrame *f)
{
        if (!f)
                return;
        if (f->fd >= 0)
                close(f->fd);
        free(f);
}

int h_raw_recv(int sock, int timeout_ms, HFrame *f)
{
        uint64_t deadline = monotonic_ms() + (uint64_t)timeout_ms;
        int fds[FDPASS_MAX_FDS], truncated = 0;
        ProtoFrameError err;
        size_t n_fds = 0;
        ssize_t n;

        if (f->fd >= 0)
                close(f->fd);
        f->fd = -1;
        for (;;) {
                struct pollfd p = { sock, POLLIN, 0 };
                uint64_t now = monotonic_ms();

                n = fdpass_recv(sock, f->buf, sizeof(f->buf), fds, FDPASS_MAX_FDS, &n_fds, &truncated);
                if (n >= 0)
                        break;
                if (n == -ECONNRESET)
                        return 0;
                CHECKF(n == -EAGAIN, "recvmsg: %s", strerror((int)-n));
                if (now >= deadline)
                        return -ETIMEDOUT;
                poll(&p, 1, (int)(deadline - now));
        }
        f->fd = n_fds ? fds[0] : -1;
        for (size_t i = 1; i < n_fds; i++)
                close(fds[i]);
        if (n == 0 && n_fds == 0)
                return 0;
        f->len = (size_t)n;
        /* The library's own way of reading a frame: what it would refuse, the broker must not send. */
        CHECKF(proto_frame_decode(f->buf, f->len, n_fds, truncated, PROTO_NONE, &f->msg, &err) == 0,
               "the broker sent a frame we cannot read: %s", err.text);
        return 1;
}

unsigned h_raw_call(int sock, ProtoMsg *req, int fd, HFrame *reply)
{
        int r = h_raw_send_msg(sock, req, fd >= 0 ? 1 : 0, &fd, fd >= 0 ? 1 : 0);

        CHECKF(r == 0, "sending %s: %s", proto_op_name(req->op), strerror(-r));
        for (;;) {
                r = h_raw_recv(sock, H_SOON_MS, reply);
                CHECKF(r > 0, "no reply to %s: %s", proto_op_name(req->op),
                       r == 0 ? "connection closed" : "timeout");
                if (reply->msg.type == PROTO_REPLY && reply->msg.reply == req->id)
                        return (unsigned)reply->msg.status;
        }
}

void h_raw_hello(int sock)
{
        ProtoMsg req = { .op = PROTO_OP_HELLO, .version = PROTO_VERSION, .pid = (uint64_t)getpid() };
        HFrame *f = h_frame_new();
        unsigned st;

        req.label = proto_str("raw-test-peer");
        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_VERSION) | PROTO_BIT(PF_PID) | PROTO_BIT(PF_LABEL);
        st = h_raw_call(sock, &req, -1, f);
        CHECKF(st == PROTO_STATUS_OK, "hello was answered with %s", proto_status_name(st));
        h_frame_free(f);
}

bool h_raw_wait_eof(int sock, int timeout_ms)
{
        uint64_t deadline = monotonic_ms() + (uint64_t)timeout_ms;
        HFrame *f = h_frame_new();
        bool eof = false;

        for (;;) {
                uint64_t now = monotonic_ms();
                int r = h_raw_recv(sock, now >= deadline ? 0 : (int)(deadline - now), f);

                if (r <= 0) {
                        eof = r == 0;
                        break;
                }
        }
        h_frame_free(f);
        return eof;
}

bool h_pipe_writer_gone(int read_end)
{
        struct pollfd p = { read_end, POLLIN, 0 };

        return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

/* ---- case scaffolding ---- */

#define BYSTANDER_NAME "bystander/data"
#define BYSTANDER_SEED 0xb457a4de5ULL
#define BYSTANDER_SIZE (64u << 10)

void h_case_begin(HCase *k, const char *const *broker_flags)
{
        *k = (HCase){ 0 };
        k->broker = h_broker_start(broker_flags);
        k->obs = h_connect(k->broker, "observer");
        k->by_prod = h_connect(k->broker, "bystander-producer");
        k->by_cons = h_connect(k->broker, "bystander-consumer");
        k->by_buf = h_publish(k->by_prod, BYSTANDER_NAME, BYSTANDER_SIZE, BYSTANDER_SEED, NULL);
        k->by_view = h_attach_verify(k->by_cons, BYSTANDER_NAME, 0, BYSTANDER_SEED);
}

void h_bystander_check(HCase *k)
{
        gpuipc_t *fresh = h_connect(k->broker, "bystander-check");
        gpuipc_buffer_t *b;
        gpuipc_event_t ev;
        HStat st;
        int r;

        CHECK_OK(k->by_prod, gpuipc_ping(k->by_prod, H_SOON_MS));
        CHECK_OK(k->by_cons, gpuipc_ping(k->by_cons, H_SOON_MS));
        /* Nothing happened to the bystander's buffer: no revoke, no retire, no drain. */
        while ((r = gpuipc_next_event(k->by_cons, 0, &ev)) == 0)
                CHECKF(ev.type != GPUIPC_EVENT_REVOKED, "the bystander's consumer got a revoke for '%s'",
                       ev.name);
        CHECK_EQ(r, GPUIPC_E_TIMEOUT);
        while ((r = gpuipc_next_event(k->by_prod, 0, &ev)) == 0)
                CHECKF(ev.type != GPUIPC_EVENT_DRAINED, "the bystander's producer got drained for '%s'",
                       ev.name);
        CHECK_EQ(r, GPUIPC_E_TIMEOUT);
        CHECK(!gpuipc_buffer_revoked(k->by_view));
        h_verify(k->by_view, BYSTANDER_SEED);
        CHECK_OK(k->obs, h_stat(k->obs, BYSTANDER_NAME, &st));
        CHECK_EQ(st.state, PROTO_STATE_LIVE);
        CHECK_EQ(st.buffer, gpuipc_buffer_id(k->by_buf));
        CHECK_EQ(st.refs, 1);
        b = h_attach_verify(fresh, BYSTANDER_NAME, 0, BYSTANDER_SEED);
        CHECK_OK(fresh, gpuipc_release(fresh, b));
        gpuipc_close(fresh);
}

void h_case_end(HCase *k)
{
        h_bystander_check(k);
        CHECK_OK(k->by_cons, gpuipc_release(k->by_cons, k->by_view));
        CHECK_OK(k->by_prod, gpuipc_retire(k->by_prod, k->by_buf));
        CHECK_OK(k->by_prod, gpuipc_wait_drained(k->by_prod, k->by_buf, H_SOON_MS));
        CHECK_OK(k->by_prod, gpuipc_buffer_free(k->by_prod, k->by_buf));
        gpuipc_close(k->by_cons);
        gpuipc_close(k->by_prod);
        gpuipc_close(k->obs);
        h_broker_settle(k->broker);
        h_broker_stop(k->broker);
}
