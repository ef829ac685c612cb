/* gpuipc-bench: what the sections share. Every section runs in its own process (and process
 * group), starts its own brokers on temporary sockets, and adds rows to one table kept in shared
 * memory; each row is a measurement next to a baseline measured in the same run, because these
 * machines are too noisy for absolute numbers to mean much from one run to the next. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "clock.h"
#include "gpuipc.h"
#include "proto.h"

/* ---- options ---- */

enum {
        SEC_LATENCY = 1 << 0,
        SEC_THROUGHPUT = 1 << 1,
        SEC_FANOUT = 1 << 2,
        SEC_SCALE = 1 << 3,
        SEC_SEED = 1 << 4,
        SEC_GPU = 1 << 5,
        SEC_RING = 1 << 6,
        SEC_FAIRNESS = 1 << 7,
        SEC_CPU_ALL = SEC_LATENCY | SEC_THROUGHPUT | SEC_FANOUT | SEC_SCALE | SEC_SEED | SEC_RING | SEC_FAIRNESS,
};

#define FAIR_REPEAT_MAX 15

typedef struct BenchOpts {
        bool quick;
        unsigned sections;
        const char *out_dir;      /* raw numbers go here (NULL: nowhere) */
        const char *broker;       /* gpuipc-broker to run */
        const char *seccomp;      /* its --seccomp mode */
        const char *python;       /* interpreter for torch_compare.py */
        const char *torch_script; /* NULL or "": skip the PyTorch comparison */
        const char *libgpuipc_path; /* libgpuipc.so for the Python module */
        const char *python_path;  /* the directory holding gpuipc.py */
        const char *pin;          /* latency: NULL (the scheduler decides), "same" or "split" */
        bool no_mps;              /* --gpu: skip the pass under an MPS daemon of our own */
        bool gpu_rings_only;      /* --gpu-rings: only the GPU section's ring rows (both passes) */
        unsigned fair_quota_milli; /* --fair-quota: the fairness section's CPU quota; 0: none */
        const char *old_broker;   /* --old-broker: the fairness section runs on it too (NULL: not) */
        int fair_repeat;          /* --fair-repeat: the fairness section's passes, each reported as the median */
        unsigned long fair_rate;  /* --fair-rate: pings a second per normal client; 0: a closed loop */
} BenchOpts;

extern BenchOpts bench_opts;

/* ---- failing ---- */

/* Prints "gpuipc-bench: <section>: ..." and ends the section's process with status 1. */
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* die() unless a libgpuipc call on c returned >= 0. */
#define TRY(c, call)                                                                                        \
        do {                                                                                                \
                int r_ = (call);                                                                            \
                if (r_ < 0)                                                                                 \
                        die("%s:%d: %s = %d: %s [%s]", __FILE__, __LINE__, #call, r_, gpuipc_strerror(r_),  \
                            gpuipc_errmsg(c));                                                              \
        } while (0)

/* Progress on stderr (the table goes to stdout). */
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- time and samples ---- */

void sleep_ns(uint64_t ns);
void sleep_until_ns(uint64_t t);

typedef struct Samples {
        double *v;
        size_t n, cap;
        bool sorted;
} Samples;

void samples_add(Samples *s, double v);
/* The p-th percentile (0..100), nearest rank; NAN when empty. */
double samples_pct(Samples *s, double p);
double samples_mean(const Samples *s);
double samples_max(Samples *s);
void samples_free(Samples *s);

/* ---- the table ---- */

typedef enum Verdict { VERDICT_NONE, VERDICT_MET, VERDICT_MISSED } Verdict;

typedef struct Row {
        char section[16];
        char metric[80];
        double value;
        char unit[12];
        char baseline[64]; /* what the baseline is ("" when the row is a baseline itself) */
        double base;       /* NAN when none */
        double ratio;      /* value / base */
        char target[40];
        Verdict verdict;
        char note[200];
} Row;

#define ROWS_MAX 512

typedef struct Table {
        int n;
        Row rows[ROWS_MAX];
} Table;

extern Table *table; /* shared between the sections' processes and the main one */
extern const char *section_name;

/* Adds a row for the current section. base may be NAN; ratio = value / base. */
Row *row_add(const char *metric, double value, const char *unit, const char *baseline, double base);
/* Targets: value/base (or value alone) at most / at least limit. Sets target and verdict. */
void row_target_ratio_max(Row *r, double limit);
void row_target_ratio_min(Row *r, double limit);
void row_target_value_max(Row *r, double limit, const char *text);
void row_target_value_min(Row *r, double limit, const char *text);
void row_note(Row *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A file for raw numbers in the output directory (NULL when there is none); header is the first
 * line of a CSV. */
FILE *out_open(const char *name, const char *header);

/* ---- processes ---- */

/* Memory shared with children forked afterwards (zeroed). */
void *shared_alloc(size_t size);

/* Forks a child that runs fn(arg) and _exits with its result. The child dies with its parent and
 * keeps only stdio and the listed fds (never the parent's broker connections). */
pid_t spawn(int (*fn)(void *arg), void *arg, const int *keep, size_t n_keep);

/* Waits for a child: its exit status, or 128 + signal. */
int child_wait(pid_t pid);

/* Pins a process (0: this one, and so what it forks afterwards) to one CPU. */
void pin_to_cpu(pid_t pid, int cpu);

/* Raises RLIMIT_NOFILE (soft and, if need be, hard) to at least n; the limit reached. */
rlim_t raise_nofile(rlim_t n);

/* ---- /proc ---- */

/* utime + stime of a process in nanoseconds (clock-tick resolution). */
uint64_t proc_cpu_ns(pid_t pid);
/* Time on CPU of all of a process's threads in nanoseconds (scheduler accounting, precise). */
uint64_t proc_sched_ns(pid_t pid);
/* A "Key:" line of /proc/PID/status in KiB (VmRSS, VmHWM), 0 if absent. */
uint64_t proc_status_kib(pid_t pid, const char *key);

/* ---- the broker ---- */

typedef struct Broker {
        pid_t pid;
        char dir[64]; /* $TMPDIR (at most 40 bytes of it)/gpuipc-bench.XXXXXX */
        char sock[108];
        char log[96];
} Broker;

/* Starts gpuipc-broker on a socket in a new temporary directory with the NULL-terminated extra
 * flags (extra may be NULL) and RLIMIT_NOFILE nofile (0: inherited), and waits until it answers. */
void broker_start(Broker *b, const char *const *extra, rlim_t nofile);
/* SIGTERM, wait, remove the directory. */
void broker_stop(Broker *b);

/* When set, broker_start puts the broker into this cgroup (its cgroup.procs) before it runs, so
 * that it starts under the cgroup's limits and can read them. */
extern const char *broker_cgroup_procs;

/* Connects to b without probing GPUs (CPU sections); dies on failure. */
gpuipc_t *bench_connect(const Broker *b, const char *label);
/* The same, probing GPUs (the GPU part's consumers must declare theirs). */
gpuipc_t *bench_connect_gpus(const Broker *b, const char *label);

/* A broker counter ("references", "waits", ...) through the stats op. */
uint64_t stats_value(gpuipc_t *c, const char *key);
/* Waits until stats_value(c, key) >= want, polling every millisecond; dies after timeout_ms. */
void stats_wait_at_least(gpuipc_t *c, const char *key, uint64_t want, int timeout_ms);

/* Raw requests through the library's connection (client/internal.h), for cases where libgpuipc's
 * own mapping cache would get in the way. An fd in the reply is closed. */
uint64_t raw_attach_name(gpuipc_t *c, const char *name, bool *ret_cached);
void raw_release(gpuipc_t *c, uint64_t buffer);
void raw_unmap(gpuipc_t *c, uint64_t buffer);
/* refs of buffer by the stat op. */
uint64_t raw_stat_refs(gpuipc_t *c, uint64_t buffer);
/* Publishes fd (a sealed memfd of size bytes) under name; returns the buffer id. */
uint64_t raw_publish_memfd(gpuipc_t *c, const char *name, int fd, uint64_t size);
/* Registers a cuda-legacy buffer with a made-up handle and device: a registry entry without an
 * fd (the broker never touches a GPU). Only peers declaring that device could attach it. */
uint64_t raw_publish_handle(gpuipc_t *c, const char *name, uint64_t size);
/* A sealed, read-only memfd of size bytes (no pages touched). */
int sealed_memfd(uint64_t size);

/* Encoded length of the frame for m (what travels, header included). */
size_t frame_len(const ProtoMsg *m, int n_fds);

/* ---- raw SOCK_SEQPACKET records: the baselines ---- */

/* The first bytes of every request to an echo server say how it answers. */
typedef struct EchoHdr {
        uint32_t reply_len;
        uint32_t fd_back; /* non-zero: attach a memfd to the reply */
} EchoHdr;

#define ECHO_BUF PROTO_MAX_FRAME

/* Sends one record with an optional fd (blocking). 0 or -errno. */
int rec_send(int sock, const void *buf, size_t len, int fd);
/* Receives one record (blocking): its length, 0 at EOF, or -errno; *ret_fd is a received fd
 * (the caller closes it) or -1. */
long rec_recv(int sock, void *buf, size_t cap, int *ret_fd);
/* Serves one blocking connection until EOF: every request is answered with reply_len bytes
 * (and a memfd if asked); fds that arrive are closed. */
int echo_serve(int sock);
/* One round trip to an echo server: q bytes out (with fd_out unless -1), r bytes back (with an fd
 * if fd_back, closed on arrival). Nanoseconds. buf holds ECHO_BUF bytes. */
uint64_t echo_round(int sock, uint8_t *buf, size_t q, size_t r, int fd_out, bool fd_back);

/* ---- sections ---- */

void section_latency(void);
void section_throughput(void);
void section_fanout(void);
void section_scale(void);
/* gpuipc-bench --victim SOCKET FIRST N RANGE FD: the scale section's dying peer. */
int victim_main(int argc, char **argv);
void section_seed(void);
void section_ring(void);
void section_fairness(void);
void section_gpu(void);
/* Inside the GPU part: the stream-ordered ring against publish/attach, in C (gpu-ring.c), with
 * suffix after every metric; the stream ring's us per frame with 1 and 8 consumers (NAN: failed). */
void gpu_ring_rows(const char *suffix, double ret_stream_us[2]);
/* In a GPU child: the libcuda libgpuipc loaded (for entry points its table lacks); dies without. */
void *bench_libcuda(void);

/* The machine, in words, for the table's heading; the GPU part fills gpus. */
typedef struct Machine {
        char cpu[128];
        int cores;
        char kernel[160];
        uint64_t mem_mib;
        char gpus[512];
} Machine;

extern Machine *machine;

/* GPU names through a CUDA-probing child (the caller stays CUDA-free); "" when none. */
void gpu_describe(char *out, size_t cap);
