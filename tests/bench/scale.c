/* Section 4, scale: a broker holding 100k live buffers (one small memfd each, so the broker holds
 * 100k fds) and 1k peers, next to a broker holding one buffer. Measured: the broker's RSS, publish
 * and attach-by-name round trips at that scale against the small broker (alternating blocks), the
 * stats op, and the time from SIGKILL of a peer holding 10k references until the broker has
 * dropped them, against a peer holding one.
 *
 * Cleanup timing: the broker removes a dead peer in one event-loop callback, so a request it
 * handles after the removal began is answered after it ended. We poll the refs of one buffer the
 * victim held with the stat op (O(1) in the broker) and take the reply that first shows the drop:
 * the cleanup ended before the broker handled that poll, and after it handled the previous one.
 * Half a round trip before each reply stands for "handled"; the gap between the two bounds is the
 * polling granularity, reported with the result. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench.h"
#include "macro.h"

#define NAME_FMT "bench/scale/%06u"

typedef struct Scale {
        unsigned n_buffers, n_peers, n_refs, trials, warm;
        unsigned n_memfd; /* memfd buffers: [0, n_low) and the last 1000; the rest handle-only */
        unsigned n_low;   /* lookups and references pick names below this */
        Broker big, small;
        gpuipc_t *prod, *obs; /* on the big broker */
        gpuipc_t *small_prod, *small_obs;
        uint64_t *ids; /* buffer ids by index on the big broker */
        FILE *raw;
} Scale;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static unsigned rnd(unsigned n)
{
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return (unsigned)(rng_state % n);
}

static void put(Scale *s, const char *key, double value)
{
        if (s->raw)
                fprintf(s->raw, "%s,%.3f\n", key, value);
}

static double rss_mib(pid_t pid)
{
        return (double)proc_status_kib(pid, "VmRSS:") / 1024.0;
}

/* ---- populating ---- */

/* Publishes buffers [from, to) on c (memfds below low and from hi on, handle-only between), noting
 * their ids in ids (if not NULL); returns the mean microseconds per publish of the last
 * min(1000, to - from). */
static double populate(uint64_t *ids, gpuipc_t *c, unsigned from, unsigned to, unsigned low, unsigned hi)
{
        uint64_t t_tail = 0;
        unsigned tail = MIN(1000u, to - from);

        for (unsigned i = from; i < to; i++) {
                char name[64];
                uint64_t id;

                if (i == to - tail)
                        t_tail = monotonic_ns();
                snprintf(name, sizeof(name), NAME_FMT, i);
                if (i < low || i >= hi) {
                        int fd = sealed_memfd(4096);
                        id = raw_publish_memfd(c, name, fd, 4096);
                        close(fd);
                } else {
                        id = raw_publish_handle(c, name, 4096);
                }
                if (ids)
                        ids[i] = id;
        }
        return (double)(monotonic_ns() - t_tail) / 1000.0 / tail;
}

/* ---- lookups ---- */

static double attach_rtt(gpuipc_t *c, const char *name, uint64_t *ret_id)
{
        uint64_t t0 = monotonic_ns();
        uint64_t id = raw_attach_name(c, name, NULL);

        *ret_id = id;
        return (double)(monotonic_ns() - t0) / 1000.0;
}

/* Attach by name and release, n times: cached (this connection already received the fd) or with
 * the fd travelling (an unmap after each release, not timed). names: pick one of n_names. */
static void lookup_block(gpuipc_t *c, unsigned n, bool uncached, unsigned first, unsigned n_names,
                         Samples *out)
{
        for (unsigned i = 0; i < n; i++) {
                char name[64];
                uint64_t id;

                snprintf(name, sizeof(name), NAME_FMT, first + rnd(n_names));
                samples_add(out, attach_rtt(c, name, &id));
                raw_release(c, id);
                if (uncached)
                        raw_unmap(c, id);
        }
}

static void lookups(Scale *s)
{
        gpuipc_t *bc = bench_connect(&s->big, "bench-lookup"),
                 *bu = bench_connect(&s->big, "bench-lookup-fd");
        gpuipc_t *sc = bench_connect(&s->small, "bench-lookup"),
                 *su = bench_connect(&s->small, "bench-lookup-fd");
        Samples big_c = {0}, big_u = {0}, small_c = {0}, small_u = {0}, big_s = {0}, small_s = {0};
        Samples big_p = {0}, small_p = {0};
        unsigned rounds = bench_opts.quick ? 4 : 10, block = bench_opts.quick ? 250 : 500;
        char metric[96];
        Row *r;

        /* Warm set: names this connection received the fd of, scattered over the whole registry. */
        for (unsigned i = 0; i < s->warm; i++) {
                char name[64];
                uint64_t id;

                snprintf(name, sizeof(name), NAME_FMT, i * (s->n_low / s->warm));
                id = raw_attach_name(bc, name, NULL);
                raw_release(bc, id);
        }
        lookup_block(sc, 1, false, 0, 1, &small_c); /* maps it once */
        samples_free(&small_c);

        for (unsigned k = 0; k < rounds; k++) {
                /* Cached lookups over the warm set: stride-spaced names, picked at random. */
                for (unsigned i = 0; i < block; i++) {
                        char name[64];
                        uint64_t id;

                        snprintf(name, sizeof(name), NAME_FMT, rnd(s->warm) * (s->n_low / s->warm));
                        samples_add(&big_c, attach_rtt(bc, name, &id));
                        raw_release(bc, id);
                }
                lookup_block(sc, block, false, 0, 1, &small_c);
                lookup_block(su, block, true, 0, 1, &small_u);
                lookup_block(bu, block, true, 0, s->n_low, &big_u);
                for (unsigned i = 0; i < block; i++) {
                        uint64_t t0 = monotonic_ns();

                        TRY(bc, gpuipc_ping(bc, 10000));
                        samples_add(&big_p, (double)(monotonic_ns() - t0) / 1000.0);
                        t0 = monotonic_ns();
                        TRY(sc, gpuipc_ping(sc, 10000));
                        samples_add(&small_p, (double)(monotonic_ns() - t0) / 1000.0);
                }
        }
        for (unsigned i = 0; i < (bench_opts.quick ? 3u : 10u); i++) {
                uint64_t t0 = monotonic_ns();

                stats_value(s->obs, "buffers");
                samples_add(&big_s, (double)(monotonic_ns() - t0) / 1000.0);
                t0 = monotonic_ns();
                stats_value(s->small_obs, "buffers");
                samples_add(&small_s, (double)(monotonic_ns() - t0) / 1000.0);
        }

        snprintf(metric, sizeof(metric), "attach by name, cached, %uk buffers, p50", s->n_buffers / 1000);
        r = row_add(metric, samples_pct(&big_c, 50), "us", "same on a broker with 1 buffer",
                    samples_pct(&small_c, 50));
        row_note(r, "p99 %.1f us vs %.1f us; random names of a warm set of %u", samples_pct(&big_c, 99),
                 samples_pct(&small_c, 99), s->warm);
        snprintf(metric, sizeof(metric), "attach by name, fd travels, %uk buffers, p50",
                 s->n_buffers / 1000);
        r = row_add(metric, samples_pct(&big_u, 50), "us", "same on a broker with 1 buffer",
                    samples_pct(&small_u, 50));
        row_note(r, "p99 %.1f us vs %.1f us; random names of %u memfd buffers", samples_pct(&big_u, 99),
                 samples_pct(&small_u, 99), s->n_low);
        snprintf(metric, sizeof(metric), "ping, %uk buffers + %u peers, p50", s->n_buffers / 1000,
                 s->n_peers);
        r = row_add(metric, samples_pct(&big_p, 50), "us", "same on a broker with 1 buffer",
                    samples_pct(&small_p, 50));
        row_note(r, "no registry work at all: what is left is per-request cost of the idle peers");
        snprintf(metric, sizeof(metric), "stats op, %uk buffers, p50", s->n_buffers / 1000);
        r = row_add(metric, samples_pct(&big_s, 50), "us", "same on a broker with 1 buffer",
                    samples_pct(&small_s, 50));
        row_note(r, "walks every buffer and lists /proc/self/fd (one entry per held fd)");
        put(s, "lookup_cached_big_p50_us", samples_pct(&big_c, 50));
        put(s, "lookup_cached_small_p50_us", samples_pct(&small_c, 50));
        put(s, "lookup_fd_big_p50_us", samples_pct(&big_u, 50));
        put(s, "lookup_fd_small_p50_us", samples_pct(&small_u, 50));
        put(s, "stats_big_p50_us", samples_pct(&big_s, 50));
        put(s, "ping_big_p50_us", samples_pct(&big_p, 50));
        put(s, "ping_small_p50_us", samples_pct(&small_p, 50));
        put(s, "stats_small_p50_us", samples_pct(&small_s, 50));
        samples_free(&big_c);
        samples_free(&big_u);
        samples_free(&small_c);
        samples_free(&small_u);
        samples_free(&big_s);
        samples_free(&small_s);
        samples_free(&big_p);
        samples_free(&small_p);
        gpuipc_close(bc);
        gpuipc_close(bu);
        gpuipc_close(sc);
        gpuipc_close(su);
}

/* ---- peer death ---- */

/* The victim is a fresh program (this one, exec'd with --victim), not a fork of this process: a
 * dying process closes its files only after unmapping its memory, and a fork of a process holding
 * 1000 connections takes the kernel over 10 ms to unmap, which is not the broker's time. */
int victim_main(int argc, char **argv)
{
        Broker b = {0};
        gpuipc_t *c;
        unsigned first, n, range;
        uint64_t held = 0;
        int ready;

        if (argc != 7)
                return 2;
        snprintf(b.sock, sizeof(b.sock), "%s", argv[2]);
        snprintf(b.log, sizeof(b.log), "/dev/null");
        first = (unsigned)strtoul(argv[3], NULL, 10);
        n = (unsigned)strtoul(argv[4], NULL, 10);
        range = (unsigned)strtoul(argv[5], NULL, 10);
        ready = atoi(argv[6]);
        section_name = "victim";
        c = bench_connect(&b, "bench-victim");
        for (unsigned i = 0; i < n; i++) {
                char name[64];
                uint64_t id;

                snprintf(name, sizeof(name), NAME_FMT, (first + i) % range);
                id = raw_attach_name(c, name, NULL);
                if (i == n / 2)
                        held = id;
        }
        if (write(ready, &held, sizeof(held)) != sizeof(held))
                return 1;
        for (;;)
                pause();
}

typedef struct Victim {
        const Broker *broker;
        unsigned first, n, range;
        int ready;
} Victim;

static int victim_exec(void *arg)
{
        Victim *v = arg;
        char first[16], n[16], range[16], fd[16];

        fcntl(v->ready, F_SETFD, 0);
        snprintf(first, sizeof(first), "%u", v->first);
        snprintf(n, sizeof(n), "%u", v->n);
        snprintf(range, sizeof(range), "%u", v->range);
        snprintf(fd, sizeof(fd), "%d", v->ready);
        execl("/proc/self/exe", "gpuipc-bench", "--victim", v->broker->sock, first, n, range, fd,
              (char *)NULL);
        return 127;
}

/* Starts a victim holding n_refs references; returns its pid and the id of one buffer it holds. */
static pid_t victim_start(Scale *s, unsigned n_refs, uint64_t *ret_held)
{
        Victim v = {&s->big, rnd(s->n_low), n_refs, s->n_low, -1};
        int ready[2];
        pid_t pid;

        if (pipe2(ready, O_CLOEXEC) < 0)
                die("pipe: %s", strerror(errno));
        v.ready = ready[1];
        pid = spawn(victim_exec, &v, &ready[1], 1);
        close(ready[1]);
        if (read(ready[0], ret_held, sizeof(*ret_held)) != sizeof(*ret_held))
                die("the victim died before holding its references");
        close(ready[0]);
        return pid;
}

typedef struct Cleanup {
        double upper_us, lower_us, cpu_us;
        unsigned polls;
} Cleanup;

/* Wall time: SIGKILL, then poll the refs of a buffer the victim held until they drop. */
static void kill_and_time(Scale *s, unsigned n_refs, double rtt_us, Cleanup *res)
{
        uint64_t held, before, t0, prev, got;
        pid_t pid = victim_start(s, n_refs, &held);

        before = raw_stat_refs(s->obs, held);
        if (before < 1)
                die("the victim holds nothing");
        t0 = prev = monotonic_ns();
        kill(pid, SIGKILL);
        for (;;) {
                uint64_t refs = raw_stat_refs(s->obs, held);

                got = monotonic_ns();
                res->polls++;
                if (refs < before)
                        break;
                prev = got;
                if (got - t0 > 30000000000ull)
                        die("the broker did not drop a dead peer's references in 30 s");
        }
        child_wait(pid);
        res->upper_us = (double)(got - t0) / 1000.0 - rtt_us / 2;
        res->lower_us = prev == t0 ? 0 : MAX(0.0, (double)(prev - t0) / 1000.0 - rtt_us / 2);
}

/* Broker CPU: SIGKILL, reap, give the broker time, and only then look (one poll, subtracted). */
static void kill_and_cost(Scale *s, unsigned n_refs, double cpu_per_poll_us, Cleanup *res)
{
        uint64_t held, before, c0, c1;
        pid_t pid = victim_start(s, n_refs, &held);

        before = raw_stat_refs(s->obs, held);
        sleep_ns(20000000);
        c0 = proc_sched_ns(s->big.pid);
        kill(pid, SIGKILL);
        child_wait(pid);
        sleep_ns(50000000);
        if (raw_stat_refs(s->obs, held) >= before)
                die("the broker had not dropped a dead peer's references after 50 ms");
        c1 = proc_sched_ns(s->big.pid);
        res->cpu_us = MAX(0.0, (double)(c1 - c0) / 1000.0 - cpu_per_poll_us);
}

static void deaths(Scale *s)
{
        Samples rtt = {0}, big[3] = {0}, one[3] = {0};
        uint64_t refs0, refs1, c0, c1;
        double cpu_per_poll;
        char metric[96], baseline[64];
        Row *r;

        /* The polling granularity: one stat round trip, and what it costs the broker. */
        c0 = proc_sched_ns(s->big.pid);
        for (int i = 0; i < 200; i++) {
                uint64_t t0 = monotonic_ns();
                raw_stat_refs(s->obs, s->ids[0]);
                samples_add(&rtt, (double)(monotonic_ns() - t0) / 1000.0);
        }
        c1 = proc_sched_ns(s->big.pid);
        cpu_per_poll = (double)(c1 - c0) / 1000.0 / 200;

        refs0 = stats_value(s->obs, "references");
        for (unsigned t = 0; t < s->trials; t++) {
                for (int k = 0; k < 2; k++) {
                        bool many = (k + (int)t) & 1;
                        Cleanup c = {0};

                        kill_and_time(s, many ? s->n_refs : 1, samples_pct(&rtt, 50), &c);
                        kill_and_cost(s, many ? s->n_refs : 1, cpu_per_poll, &c);
                        Samples *into = many ? big : one;

                        samples_add(&into[0], c.upper_us);
                        samples_add(&into[1], c.lower_us);
                        samples_add(&into[2], c.cpu_us);
                        note("peer with %u refs killed: references dropped %.0f..%.0f us after SIGKILL (%u "
                             "polls), "
                             "broker CPU %.0f us",
                             many ? s->n_refs : 1, c.lower_us, c.upper_us, c.polls, c.cpu_us);
                        if (s->raw)
                                fprintf(s->raw,
                                        "cleanup_%u_refs_trial%u_upper_us,%.3f\ncleanup_%u_refs_trial%u_"
                                        "lower_us,"
                                        "%.3f\ncleanup_%u_refs_trial%u_cpu_us,%.3f\n",
                                        many ? s->n_refs : 1, t, c.upper_us, many ? s->n_refs : 1, t,
                                        c.lower_us, many ? s->n_refs : 1, t, c.cpu_us);
                }
        }
        refs1 = stats_value(s->obs, "references");
        if (refs1 != refs0)
                die("references went from %llu to %llu across the peer deaths", (unsigned long long)refs0,
                    (unsigned long long)refs1);

        snprintf(metric, sizeof(metric), "dead peer with %uk refs: SIGKILL -> dropped", s->n_refs / 1000);
        snprintf(baseline, sizeof(baseline), "same, peer holding 1 reference");
        r = row_add(metric, samples_pct(&big[0], 50) / 1000, "ms", baseline,
                    samples_pct(&one[0], 50) / 1000);
        row_target_value_max(r, 10, "< 10 ms");
        row_note(r, "median of %u; between %.2f and %.2f ms (poll round trip %.0f us)", s->trials,
                 samples_pct(&big[1], 50) / 1000, samples_pct(&big[0], 50) / 1000, samples_pct(&rtt, 50));
        snprintf(metric, sizeof(metric), "  broker CPU for that cleanup");
        r = row_add(metric, samples_pct(&big[2], 50) / 1000, "ms", "same, peer holding 1 reference",
                    samples_pct(&one[2], 50) / 1000);
        row_note(r, "scheduler time of the broker over a kill without polling");
        for (int i = 0; i < 3; i++) {
                samples_free(&big[i]);
                samples_free(&one[i]);
        }
        samples_free(&rtt);
}

/* ---- the section ---- */

static void flag(const char **argv, size_t *n, const char *name, unsigned value, char *buf)
{
        sprintf(buf, "%u", value);
        argv[(*n)++] = name;
        argv[(*n)++] = buf;
}

void section_scale(void)
{
        Scale s = {.n_buffers = bench_opts.quick ? 20000 : 100000,
                   .n_peers = bench_opts.quick ? 200 : 1000,
                   .n_refs = bench_opts.quick ? 2000 : 10000,
                   .trials = bench_opts.quick ? 1 : 3,
                   .warm = 2000};
        char v[5][16];
        const char *flags[16];
        size_t nf = 0;
        gpuipc_t **peers;
        double rss_empty, rss_buffers, rss_peers, pub_first, pub_last;
        rlim_t want, got;
        uint64_t t0;
        char metric[96];
        Row *r;

        /* One fd per memfd buffer in the broker, and about three per peer (socket, pidfd, ours). */
        want = (rlim_t)s.n_buffers + 4 * s.n_peers + 4096;
        got = raise_nofile(want); /* the brokers inherit it */
        s.n_memfd = s.n_buffers;
        if (got < want) {
                s.n_memfd = got > 4 * s.n_peers + 4096 + s.n_refs ? (unsigned)(got - 4 * s.n_peers - 4096)
                                                                  : s.n_refs;
                note("RLIMIT_NOFILE is at most %llu here (raising it needs CAP_SYS_RESOURCE): %u memfd "
                     "buffers, "
                     "%u handle-only (cuda-legacy, no fd)",
                     (unsigned long long)got, s.n_memfd, s.n_buffers - s.n_memfd);
        }
        s.n_low = s.n_memfd - 1000;
        flag(flags, &nf, "--max-buffers-per-uid", 2 * s.n_buffers, v[0]);
        flag(flags, &nf, "--max-fds-per-uid", 2 * s.n_buffers, v[1]);
        flag(flags, &nf, "--max-connections", 4 * s.n_peers + 64, v[2]);
        flag(flags, &nf, "--max-connections-per-uid", 4 * s.n_peers + 64, v[3]);
        flag(flags, &nf, "--max-refs-per-peer", 2 * s.n_refs, v[4]);
        flags[nf] = NULL;
        s.ids = calloc(s.n_buffers, sizeof(*s.ids));
        s.raw = out_open("scale.csv", "metric,value");
        if (!s.ids)
                die("out of memory");

        broker_start(&s.small, NULL, 0);
        broker_start(&s.big, flags, 0);
        s.prod = bench_connect(&s.big, "bench-producer");
        s.obs = bench_connect(&s.big, "bench-observer");
        s.small_prod = bench_connect(&s.small, "bench-producer");
        s.small_obs = bench_connect(&s.small, "bench-observer");
        rss_empty = rss_mib(s.big.pid);

        note("publishing %u buffers (%u of them one sealed 4 KiB memfd each)", s.n_buffers, s.n_memfd);
        t0 = monotonic_ns();
        pub_first = populate(s.ids, s.prod, 0, 1000, s.n_low, s.n_buffers - 1000);
        pub_last = populate(s.ids, s.prod, 1000, s.n_buffers, s.n_low, s.n_buffers - 1000);
        put(&s, "populate_s", (double)(monotonic_ns() - t0) / 1e9);
        populate(NULL, s.small_prod, 0, 1, 1, 1);
        rss_buffers = rss_mib(s.big.pid);

        note("connecting %u peers, each holding one reference", s.n_peers);
        peers = calloc(s.n_peers, sizeof(*peers));
        for (unsigned i = 0; i < s.n_peers; i++) {
                char name[64];

                peers[i] = bench_connect(&s.big, "bench-peer");
                snprintf(name, sizeof(name), NAME_FMT, rnd(s.n_low));
                raw_attach_name(peers[i], name, NULL);
        }
        rss_peers = rss_mib(s.big.pid);
        put(&s, "rss_empty_mib", rss_empty);
        put(&s, "rss_buffers_mib", rss_buffers);
        put(&s, "rss_buffers_peers_mib", rss_peers);
        put(&s, "publish_first_1000_us", pub_first);
        put(&s, "publish_last_1000_us", pub_last);

        snprintf(metric, sizeof(metric), "broker RSS, %uk buffers", s.n_buffers / 1000);
        r = row_add(metric, rss_buffers, "MiB", "broker RSS, empty", rss_empty);
        row_target_value_max(r, 64, "< 64 MiB");
        row_note(r, "%.0f bytes per buffer; %u memfd (fd held), %u handle-only",
                 (rss_buffers - rss_empty) * 1048576.0 / s.n_buffers, s.n_memfd, s.n_buffers - s.n_memfd);
        snprintf(metric, sizeof(metric), "broker RSS, %uk buffers + %u peers", s.n_buffers / 1000,
                 s.n_peers);
        r = row_add(metric, rss_peers, "MiB", "broker RSS, empty", rss_empty);
        row_target_value_max(r, 64, "< 64 MiB");
        row_note(r, "%.0f bytes per peer; VmHWM %.1f MiB", (rss_peers - rss_buffers) * 1048576.0 / s.n_peers,
                 (double)proc_status_kib(s.big.pid, "VmHWM:") / 1024.0);
        snprintf(metric, sizeof(metric), "publish new memfd at %uk buffers", s.n_buffers / 1000);
        r = row_add(metric, pub_last, "us", "the first 1000 publishes", pub_first);
        row_note(r, "mean of the last 1000 vs the first 1000");

        note("lookups");
        lookups(&s);
        note("peer deaths");
        deaths(&s);
        put(&s, "rss_end_mib", rss_mib(s.big.pid));
        put(&s, "hwm_end_mib", (double)proc_status_kib(s.big.pid, "VmHWM:") / 1024.0);

        for (unsigned i = 0; i < s.n_peers; i++)
                gpuipc_close(peers[i]);
        free(peers);
        gpuipc_close(s.obs);
        gpuipc_close(s.prod);
        gpuipc_close(s.small_obs);
        gpuipc_close(s.small_prod);
        if (s.raw)
                fclose(s.raw);
        broker_stop(&s.big);
        broker_stop(&s.small);
        free(s.ids);
}
