/* Section 5, the seed's way: the producer writes a 64-byte handle file into a shared directory and
 * the consumer looks for it every 2 seconds (docs/DESIGN.md, the practice gpuipc replaces). Next
 * to it an inotify consumer on the same directory, and gpuipc's attach-with-wait, where the
 * consumer's attach is parked in the broker until the producer publishes. Each trial measures
 * from just before the producer writes (publishes) until the consumer holds the 64 bytes.
 *
 * The file is written to a temporary name and renamed into place, so a consumer never reads a
 * half-written handle. Polling trials run side by side, each consumer with its own file and a
 * random phase between its polls and the write: sleeping processes do not disturb each other,
 * and 20 trials take 4 seconds instead of 40. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "macro.h"

#define HANDLE_LEN      64
#define SEED_POLL_NS    2000000000ull
#define SEED_TRIALS_MAX 512

typedef struct SeedShared {
        int armed;
        uint64_t found[SEED_TRIALS_MAX];
} SeedShared;

typedef struct SeedArg {
        SeedShared *sh;
        const char *dir;
        const Broker *broker;
        int idx, trials, done;
} SeedArg;

static const uint8_t handle[HANDLE_LEN] = "a cudaIpcMemHandle_t is 64 opaque bytes; these stand in for one";

static void path_of(char *buf, size_t cap, const char *dir, const char *kind, int i)
{
        snprintf(buf, cap, "%s/%s.%d", dir, kind, i);
}

/* Writes the handle under a temporary name and renames it into place. */
static void write_handle(const char *dir, const char *kind, int i)
{
        char tmp[PATH_MAX + 8], path[PATH_MAX];
        int fd;

        path_of(path, sizeof(path), dir, kind, i);
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || write(fd, handle, HANDLE_LEN) != HANDLE_LEN || close(fd) < 0 || rename(tmp, path) < 0)
                die("cannot write %s: %s", path, strerror(errno));
}

static bool read_handle(const char *path)
{
        uint8_t buf[HANDLE_LEN];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n;

        if (fd < 0)
                return false;
        n = read(fd, buf, sizeof(buf));
        close(fd);
        return n == HANDLE_LEN && memcmp(buf, handle, HANDLE_LEN) == 0;
}

static void report_done(int fd)
{
        char c = 1;

        while (write(fd, &c, 1) < 0 && errno == EINTR)
                ;
}

static void wait_done(int fd)
{
        char c;

        while (read(fd, &c, 1) != 1) {
                if (errno != EINTR)
                        die("a consumer died");
        }
}

/* ---- the seed: poll every 2 s ---- */

static int poll_consumer(void *arg)
{
        SeedArg *a = arg;
        char path[PATH_MAX];

        path_of(path, sizeof(path), a->dir, "poll", a->idx);
        while (!read_handle(path))
                sleep_ns(SEED_POLL_NS);
        a->sh->found[a->idx] = monotonic_ns();
        return 0;
}

static void run_polling(const char *dir, int trials, Samples *out, FILE *raw)
{
        SeedShared *sh = shared_alloc(sizeof(*sh));
        pid_t kids[SEED_TRIALS_MAX];
        uint64_t at[SEED_TRIALS_MAX], wrote[SEED_TRIALS_MAX], start;
        int order[SEED_TRIALS_MAX];

        start = monotonic_ns();
        for (int i = 0; i < trials; i++) {
                SeedArg a = {sh, dir, NULL, i, 1, -1};
                kids[i] = spawn(poll_consumer, &a, NULL, 0);
                /* The write lands somewhere in a 2 s polling period. */
                at[i] = start + 100000000ull + (uint64_t)rand() % SEED_POLL_NS;
                order[i] = i;
        }
        for (int i = 0; i < trials; i++) {
                for (int k = i + 1; k < trials; k++) {
                        if (at[order[k]] < at[order[i]]) {
                                int t = order[i];
                                order[i] = order[k];
                                order[k] = t;
                        }
                }
        }
        for (int i = 0; i < trials; i++) {
                int t = order[i];
                sleep_until_ns(at[t]);
                wrote[t] = monotonic_ns();
                write_handle(dir, "poll", t);
        }
        for (int i = 0; i < trials; i++) {
                if (child_wait(kids[i]) != 0)
                        die("a polling consumer failed");
                samples_add(out, (double)(sh->found[i] - wrote[i]) / 1000.0);
                if (raw)
                        fprintf(raw, "poll_2s,%d,%.3f\n", i, (double)(sh->found[i] - wrote[i]) / 1000.0);
        }
}

/* ---- inotify ---- */

static int inotify_consumer(void *arg)
{
        SeedArg *a = arg;
        int ifd = inotify_init1(IN_CLOEXEC);

        if (ifd < 0 || inotify_add_watch(ifd, a->dir, IN_MOVED_TO | IN_CLOSE_WRITE) < 0)
                die("inotify: %s", strerror(errno));
        for (int t = 0; t < a->trials; t++) {
                char path[PATH_MAX], want[32];
                bool got = false;

                path_of(path, sizeof(path), a->dir, "inotify", t);
                snprintf(want, sizeof(want), "inotify.%d", t);
                __atomic_store_n(&a->sh->armed, t + 1, __ATOMIC_SEQ_CST);
                /* Watch first, then look: a file that appeared in between is not missed. */
                got = read_handle(path);
                while (!got) {
                        char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
                        ssize_t n = read(ifd, buf, sizeof(buf));

                        if (n <= 0)
                                die("inotify read: %s", strerror(errno));
                        for (char *p = buf; p < buf + n;) {
                                struct inotify_event *ev = (struct inotify_event *)p;

                                if (ev->len && strcmp(ev->name, want) == 0)
                                        got = read_handle(path);
                                p += sizeof(*ev) + ev->len;
                        }
                }
                a->sh->found[t] = monotonic_ns();
                report_done(a->done);
        }
        return 0;
}

/* ---- gpuipc ---- */

static int gpuipc_consumer(void *arg)
{
        SeedArg *a = arg;
        gpuipc_t *c = bench_connect(a->broker, "bench-seed");

        for (int t = 0; t < a->trials; t++) {
                uint8_t buf[HANDLE_LEN];
                gpuipc_buffer_t *b;
                char name[64];

                snprintf(name, sizeof(name), "bench/seed/%d", t);
                TRY(c, gpuipc_attach(c, name, 60000, &b));
                memcpy(buf, gpuipc_buffer_ptr(b), HANDLE_LEN);
                a->sh->found[t] = monotonic_ns();
                if (memcmp(buf, handle, HANDLE_LEN) != 0)
                        die("wrong bytes in the buffer");
                report_done(a->done);
                TRY(c, gpuipc_release(c, b));
        }
        gpuipc_close(c);
        return 0;
}

static void run_waiting(const char *dir, const Broker *broker, int trials, Samples *ino, Samples *gp,
                        FILE *raw)
{
        SeedShared *si = shared_alloc(sizeof(*si)), *sg = shared_alloc(sizeof(*sg));
        gpuipc_t *prod = bench_connect(broker, "bench-producer"),
                 *obs = bench_connect(broker, "bench-observer");
        int di[2], dg[2];
        pid_t ki, kg;

        if (pipe2(di, O_CLOEXEC) < 0 || pipe2(dg, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        {
                SeedArg a = {si, dir, broker, 0, trials, di[1]}, b = {sg, dir, broker, 0, trials, dg[1]};
                ki = spawn(inotify_consumer, &a, &di[1], 1);
                kg = spawn(gpuipc_consumer, &b, &dg[1], 1);
        }
        close(di[1]);
        close(dg[1]);
        for (int t = 0; t < trials; t++) {
                for (int k = 0; k < 2; k++) {
                        uint64_t t0;

                        if ((k + t) & 1) {
                                gpuipc_buffer_t *b;
                                char name[64];

                                snprintf(name, sizeof(name), "bench/seed/%d", t);
                                TRY(prod, gpuipc_buffer_alloc(prod, GPUIPC_KIND_MEMFD, HANDLE_LEN, 0, &b));
                                memcpy(gpuipc_buffer_ptr(b), handle, HANDLE_LEN);
                                stats_wait_at_least(obs, "waits", 1, 30000);
                                sleep_ns(2000000);
                                t0 = monotonic_ns();
                                TRY(prod, gpuipc_publish(prod, b, name, NULL));
                                wait_done(dg[0]);
                                samples_add(gp, (double)(sg->found[t] - t0) / 1000.0);
                                if (raw)
                                        fprintf(raw, "gpuipc,%d,%.3f\n", t,
                                                (double)(sg->found[t] - t0) / 1000.0);
                                TRY(prod, gpuipc_buffer_free(prod, b));
                        } else {
                                while (__atomic_load_n(&si->armed, __ATOMIC_SEQ_CST) < t + 1)
                                        sleep_ns(1000000);
                                sleep_ns(2000000);
                                t0 = monotonic_ns();
                                write_handle(dir, "inotify", t);
                                wait_done(di[0]);
                                samples_add(ino, (double)(si->found[t] - t0) / 1000.0);
                                if (raw)
                                        fprintf(raw, "inotify,%d,%.3f\n", t,
                                                (double)(si->found[t] - t0) / 1000.0);
                        }
                }
        }
        if (child_wait(ki) != 0 || child_wait(kg) != 0)
                die("a consumer failed");
        close(di[0]);
        close(dg[0]);
        gpuipc_close(obs);
        gpuipc_close(prod);
}

static void add_rows(const char *what, Samples *s, Samples *seed, bool is_seed, Samples *ino)
{
        char metric[96];
        Row *r;

        for (int k = 0; k < 2; k++) {
                double p = k ? 99 : 50;

                snprintf(metric, sizeof(metric), "%s, %s", what, k ? "p99" : "p50");
                r = row_add(metric, samples_pct(s, p) / 1000, "ms",
                            is_seed ? "" : "handle file polled every 2 s",
                            is_seed ? NAN : samples_pct(seed, p) / 1000);
                if (is_seed)
                        row_note(r, "the baseline; %zu trials, mean %.0f ms, max %.0f ms", s->n,
                                 samples_mean(s) / 1000, samples_max(s) / 1000);
                else if (ino)
                        row_note(r, "%zu trials; %.2fx inotify's", s->n,
                                 samples_pct(s, p) / samples_pct(ino, p));
                else
                        row_note(r, "%zu trials, mean %.3f ms", s->n, samples_mean(s) / 1000);
        }
}

void section_seed(void)
{
        int poll_trials = bench_opts.quick ? 6 : 20, trials = bench_opts.quick ? 30 : 200;
        Samples poll = {0}, ino = {0}, gp = {0};
        FILE *raw = out_open("seed.csv", "method,trial,us");
        char dir[160];
        Broker broker;

        if (poll_trials > SEED_TRIALS_MAX || trials > SEED_TRIALS_MAX)
                die("too many trials");
        srand((unsigned)monotonic_ns());
        broker_start(&broker, NULL, 0);
        snprintf(dir, sizeof(dir), "%s/handles", broker.dir);
        if (mkdir(dir, 0755) < 0)
                die("mkdir %s: %s", dir, strerror(errno));

        note("%d polling consumers side by side (each polls every 2 s), then %d inotify and %d gpuipc "
             "trials",
             poll_trials, trials, trials);
        run_polling(dir, poll_trials, &poll, raw);
        run_waiting(dir, &broker, trials, &ino, &gp, raw);
        if (raw)
                fclose(raw);

        add_rows("handle file, polled every 2 s (the seed)", &poll, &poll, true, NULL);
        add_rows("handle file, inotify on the directory", &ino, &poll, false, NULL);
        add_rows("gpuipc attach-with-wait (rendezvous)", &gp, &poll, false, &ino);

        for (int i = 0; i < poll_trials; i++) {
                char path[PATH_MAX];
                path_of(path, sizeof(path), dir, "poll", i);
                unlink(path);
        }
        for (int i = 0; i < trials; i++) {
                char path[PATH_MAX];
                path_of(path, sizeof(path), dir, "inotify", i);
                unlink(path);
        }
        rmdir(dir);
        broker_stop(&broker);
}
