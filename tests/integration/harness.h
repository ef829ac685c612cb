/* Integration-test harness: the real gpuipc-broker on a temporary socket, peers in child
 * processes, raw frames on raw sockets, and the broker's open-fd count.
 *
 * A test binary is a plain main() that hands a table of `static void test_x(void)` cases to
 * h_main(). Each case runs in its own forked process (and process group) with its own temporary
 * directory and an alarm(), so a hung or failed case is killed with everything it started and the
 * next case still runs. Every wait has a deadline; nothing sleeps a fixed time to "let things
 * happen": conditions are polled until a deadline.
 *
 * Environment: GPUIPC_BROKER and GPUIPC_CTL (paths of the binaries, set by tests/meson.build),
 * GPUIPC_TEST_SECCOMP (the broker's --seccomp mode, default off), GPUIPC_TEST_WRAPPER (a command
 * the broker runs under, e.g. "valgrind -q --error-exitcode=99": a memory error then fails the
 * case through the broker's exit status), GPUIPC_TEST_CASE_TIMEOUT
 * (seconds per case, default 60), GPUIPC_TEST_KEEP=1 (keep the temporary directories),
 * GPUIPC_TEST_STRICT=1 (CHECK_KNOWN_BUG fails like CHECK). An argument selects the cases whose
 * name contains it.
 *
 * Checks cannot be compiled out. In the case process a failed check prints where and why, the
 * tail of every broker's log (and each syscall its seccomp filter refused or killed it for), and
 * exits 1; a case whose broker logged such a call fails even if everything else passed; in a child
 * started with h_spawn() it reports the failure to the parent over its channel and exits 1. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "clock.h"
#include "gpuipc.h"
#include "proto.h"

/* ---- checks ---- */

_Noreturn void h_fail(const char *file, int line, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/* CHECK, CHECKF, CHECK_EQ and CHECK_STREQ (tests/unit/check.h), failing through h_fail. */
#define CHECK_FAIL h_fail
#include "check.h"

/* A libgpuipc call on connection c that must succeed. */
#define CHECK_OK(c, call)                                                                                   \
        do {                                                                                                \
                int r_ = (call);                                                                            \
                if (r_ < 0)                                                                                 \
                        h_fail(__FILE__, __LINE__, "%s = %d: %s [%s]", #call, r_, gpuipc_strerror(r_),      \
                               gpuipc_errmsg(c));                                                           \
        } while (0)

/* A libgpuipc call on connection c that must fail with exactly err. */
#define CHECK_ERR(c, call, err)                                                                             \
        do {                                                                                                \
                int r_ = (call);                                                                            \
                if (r_ != (err))                                                                            \
                        h_fail(__FILE__, __LINE__, "%s = %d (%s) [%s], expected %s = %d", #call, r_,        \
                               gpuipc_strerror(r_), gpuipc_errmsg(c), #err, (int)(err));                    \
        } while (0)

/* A check that fails today because of a reported bug (id names it in the report). A failure is
 * printed as XFAIL and tolerated; a success is printed as XPASS, so whoever fixes the bug sees
 * that the mark can become a CHECK. GPUIPC_TEST_STRICT=1 turns failures into real ones. */
#define CHECK_KNOWN_BUG(id, cond) h_known_bug(__FILE__, __LINE__, id, #cond, !!(cond))
void h_known_bug(const char *file, int line, const char *id, const char *what, bool ok);

/* Polls cond every few milliseconds until it holds; fails after timeout_ms. */
#define WAIT_UNTIL(cond, timeout_ms)                                                                        \
        do {                                                                                                \
                uint64_t dl_ = monotonic_ms() + (uint64_t)(timeout_ms);                                         \
                while (!(cond)) {                                                                           \
                        if (monotonic_ms() >= dl_)                                                              \
                                h_fail(__FILE__, __LINE__, "timed out after %d ms waiting for %s",          \
                                       (int)(timeout_ms), #cond);                                           \
                        h_sleep_ms(2);                                                                      \
                }                                                                                           \
        } while (0)

/* Generous deadlines for what must happen (the machine may be loaded); lower bounds are checked
 * separately and tightly. */
#define H_SOON_MS 10000

/* ---- the runner ---- */

typedef struct HTest {
        const char *name;
        void (*fn)(void);
} HTest;

#define H_TEST(fn)                                                                                          \
        {                                                                                                   \
#fn, fn                                                                                     \
        }

/* Runs the cases (each forked, in its own process group and temporary directory) and prints one
 * line per case and a closing "N passed, N failed, N skipped". Returns the exit status for main:
 * 0, 1 when a case failed, 77 when every case was skipped. */
int h_main(int argc, char **argv, const HTest *tests, size_t n_tests);

/* Ends the current case as skipped (exit 77): only for a real reason, printed. */
_Noreturn void h_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Progress note on stderr, prefixed with the case (or child) and the milliseconds since its start. */
void h_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void h_sleep_ms(unsigned ms);

/* The current case's temporary directory (empty by default, removed afterwards). */
const char *h_case_dir(void);

/* Path of gpuipcctl ($GPUIPC_CTL). */
const char *h_ctl_path(void);

/* ---- the broker ---- */

typedef struct HBroker {
        char dir[128];  /* its own directory inside the case's */
        char sock[108]; /* dir/s.sock */
        char log[160];  /* stderr of the current run (dir/broker-N.log) */
        pid_t pid;      /* 0 when not running */
        int runs;
        int baseline_fds;     /* open fds when idle after start: what every case must return to */
        const char *args[24]; /* extra flags, borrowed: must outlive the broker */
        size_t n_args;
} HBroker;

/* Starts gpuipc-broker --socket DIR/s.sock --seccomp $GPUIPC_TEST_SECCOMP --log-format json, plus
 * the NULL-terminated extra flags (may be NULL), waits until it answers a ping, and records its
 * idle fd count as the baseline. Skips the case when seccomp is asked for and not built in. */
HBroker *h_broker_start(const char *const *extra);

/* Starts the broker again on the same socket path with the same flags (after h_broker_stop or
 * h_broker_kill9) and waits until it answers; clients may reconnect at once (the fd baseline is the
 * first start's). */
void h_broker_restart(HBroker *b);

/* Sends SIGTERM and requires exit status 0 within the deadline and the socket file removed.
 * Returns how many milliseconds the broker took to exit. The directory stays. */
unsigned h_broker_stop(HBroker *b);

/* The broker's open fds right now (/proc/PID/fd). */
int h_broker_fds(const HBroker *b);

/* The broker's resident set right now, in kB (VmRSS of /proc/PID/status). */
long h_broker_rss_kb(const HBroker *b);

/* Whether the broker's resident set says anything about the broker: not under a wrapper
 * (GPUIPC_TEST_WRAPPER, e.g. valgrind) or in an AddressSanitizer build, where it is mostly the
 * tool's (shadow memory, a quarantine of freed blocks). */
bool h_broker_rss_meaningful(void);

/* Fills buf (PROTO_MAX_META bytes) with a metadata map of exactly the largest encoded size,
 * {"pad": "xxx..."} (str 16), and returns that size. */
size_t h_largest_meta(unsigned char *buf);

/* Waits (with a grace period for disconnects) until every peer that connected was processed as
 * disconnected (the broker's info-level "peer connected"/"peer disconnected" log lines) and the
 * open-fd count is back at the baseline; fails listing the broker's fds. */
void h_broker_settle(const HBroker *b);

/* Occurrences of needle in the current run's log. */
unsigned h_broker_log_count(const HBroker *b, const char *needle);

/* Kills the broker with SIGKILL and reaps it (for restart tests that simulate a crash). */
void h_broker_kill9(HBroker *b);

/* ---- libgpuipc peers ---- */

/* Connects to b (label may be NULL); fails the test on error. The connection does not reconnect
 * (no_reconnect): most cases check what one broker does, and a peer the broker drops must stay
 * dropped there. Cases about restarts connect with the library's default (h_try_connect). */
gpuipc_t *h_connect(const HBroker *b, const char *label);

/* Connects with options (socket_path is filled in); returns the library's result. */
int h_try_connect(const HBroker *b, gpuipc_options_t *opts, gpuipc_t **ret);

/* Data patterns, gpuipcctl's own (cli/pattern.c): seed 0 is "counter" (each 8-byte word holds its
 * index), any other seed is "random:SEED". h_pattern_check returns the first differing offset or
 * SIZE_MAX. */
void h_pattern_fill(void *dst, size_t len, uint64_t seed);
size_t h_pattern_check(const void *src, size_t len, uint64_t seed);

/* Allocates a memfd buffer of size bytes, fills it with the pattern and publishes it (opts may be
 * NULL). Fails the test on error. */
gpuipc_buffer_t *h_publish(gpuipc_t *c, const char *name, size_t size, uint64_t seed,
                           const gpuipc_publish_options_t *opts);

/* Attaches name (waiting up to timeout_ms) and checks every byte against the pattern. */
gpuipc_buffer_t *h_attach_verify(gpuipc_t *c, const char *name, int timeout_ms, uint64_t seed);

/* Checks every byte of an attached or own buffer against the pattern. */
void h_verify(const gpuipc_buffer_t *b, uint64_t seed);

/* Takes events until one of type arrives (others are dropped): 0, or GPUIPC_E_TIMEOUT. */
int h_next_event_of(gpuipc_t *c, gpuipc_event_type_t type, int timeout_ms, gpuipc_event_t *ret);

/* What the broker says about one buffer (the stat op). */
typedef struct HStat {
        uint64_t buffer, generation, refs, holders, owner, size;
        ProtoState state;
        bool broker_held;
} HStat;

/* 0 and *ret, or the GPUIPC_E_* code (GPUIPC_E_NOT_FOUND when no live buffer has that name). */
int h_stat(gpuipc_t *c, const char *name, HStat *ret);
int h_stat_id(gpuipc_t *c, uint64_t id, HStat *ret);

/* One value of the stats op ("references", "waits", "held_fds", "peers", ...); fails if absent. */
uint64_t h_stats(gpuipc_t *c, const char *key);

/* How many buffers the list op shows under prefix ("" for all). */
unsigned h_list_count(gpuipc_t *c, const char *prefix);
/* The ids and names of (at most max) buffers listed under prefix, in listing order; their number. */
unsigned h_list_ids(gpuipc_t *c, const char *prefix, uint64_t *ids, char (*names)[PROTO_MAX_NAME + 1],
                    unsigned max);
/* A member of ring `ring`: attaches its own member page (the one of the ring's listed member pages
 * it may attach), as a member that means to scribble on it would; fails the test if there is none. */
gpuipc_buffer_t *h_ring_own_page(gpuipc_t *c, const char *ring);

/* ---- child processes ---- */

/* The child's end of its channel to the parent. */
typedef struct HChan {
        int rd, wr;
} HChan;

typedef struct HChild {
        char name[48];
        pid_t pid;
        int rd, wr;    /* parent's ends: reports from the child, commands to it (-1 for programs) */
        char out[160]; /* stdout+stderr of a program started with h_spawn_ctl */
        bool reaped;
        int status; /* wait status, once reaped */
} HChild;

typedef int (*HChildFn)(HChan *ch, void *arg);

/* Forks a child that runs fn(ch, arg) and exits with its return value. The child keeps only stdio
 * and its channel (never the parent's broker connections), dies with its parent, and has its own
 * alarm. A failed check inside it is reported to the parent (h_child_expect prints it). */
HChild *h_spawn(const char *name, HChildFn fn, void *arg);

/* Runs gpuipcctl --socket SOCK followed by the NULL-terminated arguments, output to a file. */
HChild *h_spawn_ctl(const HBroker *b, const char *name, ...) __attribute__((sentinel));

/* Child side: sends a message (a tag character and a short text) to the parent / waits for a
 * command with this tag from it (fails when another tag, EOF or the deadline comes first). */
void h_report(HChan *ch, char tag, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void h_await(HChan *ch, char tag, int timeout_ms);

/* Parent side: waits for the child's message with this tag and copies its text into buf (may be
 * NULL). A failure the child reported, its exit, another tag or the deadline fails the test. */
void h_child_expect(HChild *c, char tag, int timeout_ms, char *buf, size_t cap);
/* True when the child has sent nothing (yet) that h_child_expect would read. */
bool h_child_quiet(HChild *c);
/* Sends a command to the child. */
void h_child_tell(HChild *c, char tag);

/* Waits for the child to exit; returns its exit code (128 + signal if a signal killed it). Fails
 * the test (killing it) when the deadline passes first. */
int h_child_wait(HChild *c, int timeout_ms);
/* Requires exit code 0 within the deadline; prints the program's output otherwise. */
void h_child_wait_ok(HChild *c, int timeout_ms);
/* SIGKILL and reap. */
void h_child_kill9(HChild *c);
/* The output of a program child (malloc'd, NUL-terminated). */
char *h_child_output(const HChild *c);
/* Kills it if still running, closes the channel, frees c. NULL is fine. */
void h_child_free(HChild *c);

/* ---- raw sockets ---- */

/* A raw SOCK_SEQPACKET connection to the broker; nothing is sent. */
int h_raw_connect(const HBroker *b);

/* Sends one record with optional fds (SCM_RIGHTS). 0 or -errno. */
int h_raw_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds);

/* Encodes m as one frame whose header announces n_announce fds and sends it with the n_fds fds.
 * A request without PF_ID gets the next id. 0 or -errno. */
int h_raw_send_msg(int sock, ProtoMsg *m, uint8_t n_announce, const int *fds, size_t n_fds);

typedef struct HFrame {
        uint8_t buf[PROTO_MAX_FRAME];
        size_t len;
        ProtoMsg msg; /* points into buf */
        int fd;       /* received fd (owned by the frame), or -1 */
} HFrame;

/* A frame buffer (64 KiB: allocate, don't put it on the stack) with no fd. */
HFrame *h_frame_new(void);
void h_frame_free(HFrame *f);

/* Receives and decodes one frame: 1, 0 at EOF (or a reset connection), -ETIMEDOUT. A frame the
 * client could not decode fails the test. Closes a previously held f->fd first. */
int h_raw_recv(int sock, int timeout_ms, HFrame *f);

/* Sends req (with fd, or -1) and returns the status of its reply, skipping events. */
unsigned h_raw_call(int sock, ProtoMsg *req, int fd, HFrame *reply);

/* Says hello (protocol version, this pid) and requires an ok reply. */
void h_raw_hello(int sock);

/* Reads (and drops) frames until EOF; true if EOF came before the deadline. */
bool h_raw_wait_eof(int sock, int timeout_ms);

/* True once every other holder of the pipe's write end closed it (its read end polls HUP). */
bool h_pipe_writer_gone(int read_end);

/* ---- case scaffolding ---- */

/* What most cases share: a broker, an observer connection for stat and stats, and a bystander (a
 * producer and a consumer holding one buffer for the whole case) that must come out undisturbed by
 * whatever the case did to other peers. */
typedef struct HCase {
        HBroker *broker;
        gpuipc_t *obs;
        gpuipc_t *by_prod, *by_cons;
        gpuipc_buffer_t *by_buf, *by_view;
} HCase;

/* Starts the broker (extra flags as for h_broker_start), the observer and the bystander. */
void h_case_begin(HCase *k, const char *const *broker_flags);

/* The bystander still works: both its connections answer, the consumer's view is intact and not
 * revoked, and a new consumer can attach and verify the buffer. */
void h_bystander_check(HCase *k);

/* Checks the bystander, takes it and the observer down, requires every disconnect processed and
 * the broker's open fds back at the baseline, then stops the broker (exit status 0). */
void h_case_end(HCase *k);
