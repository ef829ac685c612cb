/* Section 3, fan-out: N consumer processes wait in attach for a name; the producer publishes a new
 * buffer; each consumer, once attach returns and it has touched the mapping, takes CLOCK_MONOTONIC.
 * The result of a trial is the last consumer's time minus the time just before publish. The
 * baseline does the same by hand: one process sends the fd (SCM_RIGHTS) to N processes blocked in
 * recvmsg on N socketpairs, which map and touch it. Trials of both alternate. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"
#include "macro.h"

#define FAN_MAX        128
#define FAN_TRIALS_MAX 32
#define FAN_MSG        180 /* about an attach reply */

typedef struct FanShared {
        int ready;
        int armed[FAN_TRIALS_MAX];              /* raw consumers about to block for this trial */
        uint64_t t[2][FAN_TRIALS_MAX][FAN_MAX]; /* [raw, gpuipc][trial][consumer]: when mapped */
} FanShared;

typedef struct FanChild {
        FanShared *sh;
        const Broker *broker;
        int n, trials, idx, sock, done;
} FanChild;

static void touch(const void *p)
{
        (void)*(volatile const uint8_t *)p;
}

static void report_done(int fd)
{
        char c = 1;

        while (write(fd, &c, 1) < 0 && errno == EINTR)
                ;
}

static int gpuipc_consumer(void *arg)
{
        FanChild *a = arg;
        gpuipc_t *c = bench_connect(a->broker, "bench-fanout");

        __atomic_add_fetch(&a->sh->ready, 1, __ATOMIC_SEQ_CST);
        for (int t = 0; t < a->trials; t++) {
                gpuipc_buffer_t *b;
                char name[64];

                snprintf(name, sizeof(name), "bench/fan/%d/%d", a->n, t);
                TRY(c, gpuipc_attach(c, name, 60000, &b));
                touch(gpuipc_buffer_ptr(b));
                a->sh->t[1][t][a->idx] = monotonic_ns();
                report_done(a->done);
                TRY(c, gpuipc_release(c, b));
        }
        gpuipc_close(c);
        return 0;
}

static int raw_consumer(void *arg)
{
        FanChild *a = arg;
        uint8_t buf[512];

        __atomic_add_fetch(&a->sh->ready, 1, __ATOMIC_SEQ_CST);
        for (int t = 0; t < a->trials; t++) {
                void *p;
                int fd;

                __atomic_add_fetch(&a->sh->armed[t], 1, __ATOMIC_SEQ_CST);
                if (rec_recv(a->sock, buf, sizeof(buf), &fd) <= 0 || fd < 0)
                        die("the raw fan-out producer went away");
                p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
                if (p == MAP_FAILED)
                        die("mmap: %s", strerror(errno));
                touch(p);
                a->sh->t[0][t][a->idx] = monotonic_ns();
                report_done(a->done);
                munmap(p, 4096);
                close(fd);
        }
        return 0;
}

static void wait_done(int fd, int n)
{
        char buf[FAN_MAX];

        while (n > 0) {
                ssize_t k = read(fd, buf, (size_t)n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        die("a fan-out consumer died");
                n -= (int)k;
        }
}

/* Last and median consumer, in microseconds after t0. */
static void trial_result(const uint64_t *t, int n, uint64_t t0, double *ret_max, double *ret_med)
{
        Samples s = {0};

        for (int i = 0; i < n; i++)
                samples_add(&s, (double)(t[i] - t0) / 1000.0);
        *ret_max = samples_max(&s);
        *ret_med = samples_pct(&s, 50);
        samples_free(&s);
}

static void fan_run(const Broker *broker, gpuipc_t *prod, gpuipc_t *obs, FanShared *sh, int n, int trials,
                    FILE *raw, FILE *summary)
{
        pid_t kids[2 * FAN_MAX];
        int socks[FAN_MAX], done[2];
        int memfd = sealed_memfd(4096);
        uint8_t msg[FAN_MSG] = {0};
        Samples all[2] = {0}, med[2] = {0};
        static const char *const series[] = {"raw", "gpuipc"};
        char metric[96];
        Row *r;

        memset(sh, 0, sizeof(*sh));
        if (pipe2(done, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
                int sv[2], keep[2];
                FanChild a = {sh, broker, n, trials, i, -1, done[1]};

                if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                        die("socketpair: %s", strerror(errno));
                a.sock = sv[1];
                keep[0] = sv[1];
                keep[1] = done[1];
                kids[2 * i] = spawn(raw_consumer, &a, keep, 2);
                close(sv[1]);
                socks[i] = sv[0];
                kids[2 * i + 1] = spawn(gpuipc_consumer, &a, &done[1], 1);
        }
        close(done[1]);
        while (__atomic_load_n(&sh->ready, __ATOMIC_SEQ_CST) < 2 * n)
                sleep_ns(1000000);

        for (int t = 0; t < trials; t++) {
                for (int k = 0; k < 2; k++) {
                        bool use_gpuipc = (k + t) & 1;
                        double mx, md;
                        uint64_t t0;

                        if (use_gpuipc) {
                                gpuipc_buffer_t *b;
                                char name[64];

                                snprintf(name, sizeof(name), "bench/fan/%d/%d", n, t);
                                TRY(prod, gpuipc_buffer_alloc(prod, GPUIPC_KIND_MEMFD, 4096, 0, &b));
                                memset(gpuipc_buffer_ptr(b), 1, 4096);
                                /* Every consumer's attach is parked in the broker. */
                                stats_wait_at_least(obs, "waits", (uint64_t)n, 30000);
                                sleep_ns(2000000);
                                t0 = monotonic_ns();
                                TRY(prod, gpuipc_publish(prod, b, name, NULL));
                                wait_done(done[0], n);
                                TRY(prod, gpuipc_buffer_free(prod, b));
                        } else {
                                while (__atomic_load_n(&sh->armed[t], __ATOMIC_SEQ_CST) < n)
                                        sleep_ns(1000000);
                                sleep_ns(2000000);
                                t0 = monotonic_ns();
                                for (int i = 0; i < n; i++) {
                                        if (rec_send(socks[i], msg, sizeof(msg), memfd) < 0)
                                                die("send to a raw consumer: %s", strerror(errno));
                                }
                                wait_done(done[0], n);
                        }
                        trial_result(sh->t[use_gpuipc][t], n, t0, &mx, &md);
                        samples_add(&all[use_gpuipc], mx);
                        samples_add(&med[use_gpuipc], md);
                        for (int i = 0; raw && i < n; i++)
                                fprintf(raw, "%d,%d,%s,%d,%.3f\n", n, t, series[use_gpuipc], i,
                                        (double)(sh->t[use_gpuipc][t][i] - t0) / 1000.0);
                }
        }
        for (int i = 0; i < 2 * n; i++) {
                if (child_wait(kids[i]) != 0)
                        die("a fan-out consumer failed");
        }
        for (int i = 0; i < n; i++)
                close(socks[i]);
        close(done[0]);
        close(memfd);

        for (int s = 0; summary && s < 2; s++)
                fprintf(summary, "%d,%s,%.3f,%.3f,%.3f,%.3f\n", n, series[s], samples_pct(&all[s], 10),
                        samples_pct(&all[s], 50), samples_pct(&all[s], 90), samples_pct(&med[s], 50));
        snprintf(metric, sizeof(metric), "publish -> %d consumer%s mapped, p50", n, n > 1 ? "s" : "");
        r = row_add(metric, samples_pct(&all[1], 50), "us", "fd sent to N sockets by hand",
                    samples_pct(&all[0], 50));
        row_note(r, "%d trials; p90 %.0f us (raw %.0f); median consumer %.0f us (raw %.0f)", trials,
                 samples_pct(&all[1], 90), samples_pct(&all[0], 90), samples_pct(&med[1], 50),
                 samples_pct(&med[0], 50));
        for (int s = 0; s < 2; s++) {
                samples_free(&all[s]);
                samples_free(&med[s]);
        }
}

void section_fanout(void)
{
        static const int sizes[] = {1, 16, 128};
        int trials = bench_opts.quick ? 5 : 20;
        FanShared *sh = shared_alloc(sizeof(*sh));
        FILE *raw = out_open("fanout.csv", "consumers,trial,series,consumer,us");
        FILE *summary =
                out_open("fanout_summary.csv", "consumers,series,p10_us,p50_us,p90_us,median_consumer_us");
        gpuipc_t *prod, *obs;
        Broker broker;

        raise_nofile(4096);
        broker_start(&broker, NULL, 0);
        prod = bench_connect(&broker, "bench-producer");
        obs = bench_connect(&broker, "bench-observer");
        note("%d trials per size; consumers are processes", trials);
        for (size_t i = 0; i < ARRAY_SIZE(sizes); i++)
                fan_run(&broker, prod, obs, sh, sizes[i], trials, raw, summary);
        if (raw)
                fclose(raw);
        if (summary)
                fclose(summary);
        gpuipc_close(obs);
        gpuipc_close(prod);
        broker_stop(&broker);
}
