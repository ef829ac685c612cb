/* The metrics exporter's broker side; see sampler.h. One mutex guards what the two threads share;
 * nothing is done under it but copying numbers and taking references, so the HTTP loop never waits
 * for the broker through it. Attempts are numbered: a scrape's ticket is the number of the first
 * attempt that begins after it arrived, so that every answer is at least as new as its question. */
#include "sampler.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "metrics.h"

#define MIN_INTERVAL_MS 250    /* a sample this young answers new scrapes too */
#define HEALTH_PERIOD_MS 1000  /* a ping this often while nobody scrapes */
#define STOP_WAIT_MS 200       /* how long sampler_stop waits for the thread */

struct Sampler {
        SamplerConfig cfg;
        pthread_t thread;
        bool running;
        pthread_mutex_t lock;
        pthread_cond_t cond;    /* the thread waits on it for work; sampler_stop for the thread's end */

        /* Under lock. */
        uint64_t wanted;        /* the highest ticket handed out */
        uint64_t started;       /* the last attempt to sample begun ... */
        uint64_t finished;      /* ... and ended */
        uint64_t started_ms;    /* when `started` began */
        uint64_t busy_since;    /* a call to the broker (sample or ping) in progress since; 0: none */
        uint64_t ended_ms;      /* when the last call ended */
        bool ever, ok;          /* a call ended; the broker answered the last one */
        char why[256];          /* why not, when !ok */
        HttpBody *fresh, *stale; /* the last good sample with gpuipc_up 1 and 0 (NULL: none) */
        HttpBody *down;          /* gpuipc_up 0 alone */
        bool stop, exited;

        /* The thread's own. */
        gpuipc_t *c;
        gpuipc_stat_t *stats;
        gpuipc_ring_info_t *rings;
        bool logged_down;
};

/* A sample rendered once, into a reference-counted body that every scrape answered from it shares:
 * rendering per scrape would repeat the work for each of many scrapers, under no lock. */
static HttpBody *render(const MetricsInput *in)
{
        char *text = NULL;
        size_t len = 0;
        HttpBody *b = NULL;
        FILE *f = open_memstream(&text, &len);

        if (!f)
                return NULL;
        metrics_write_text(f, in);
        if (fclose(f) == 0)
                b = http_body_new(text, len);
        free(text);
        return b;
}

/* Up to SAMPLER_MAX_RINGS rings into rings: how many, or an error (a broker older than ring
 * listings has none to show: 0). */
static int collect_rings(gpuipc_t *c, gpuipc_ring_info_t *rings)
{
        uint64_t cursor = 0;
        int n = 0;

        /* Past SAMPLER_MAX_RINGS the rest are left out: the rings array is sized once, by that
         * bound, not by how many rings a broker has. */
        do {
                int got = gpuipc_list_rings(c, NULL, &cursor, rings + n, SAMPLER_MAX_RINGS - n);

                if (got == GPUIPC_E_UNKNOWN_OP)
                        return 0;
                if (got < 0)
                        return got;
                n += got;
        } while (cursor && n < SAMPLER_MAX_RINGS);
        return n;
}

int sampler_collect(gpuipc_t *c, gpuipc_stat_t *stats, gpuipc_ring_info_t *rings, MetricsInput *ret,
                    const char **what)
{
        int n, n_rings;

        *ret = (MetricsInput){ .stats = stats, .rings = rings };
        *what = "stats";
        n = gpuipc_stats(c, stats, GPUIPC_MAX_PAGE);
        if (n < 0)
                return n;
        /* Wall clock, not monotonic: it is exported as a Unix time for people and dashboards to
         * compare, and taken right after the stats so it dates them, not the ring listing. */
        ret->sampled_at = (double)realtime_ns() / 1e9;
        /* gpuipc_stats returns how many records there are, which may exceed what fit. */
        ret->n_stats = n > GPUIPC_MAX_PAGE ? GPUIPC_MAX_PAGE : n;
        *what = "rings";
        n_rings = collect_rings(c, rings);
        if (n_rings < 0)
                return n_rings;
        ret->n_rings = n_rings;
        ret->up = true;
        return 0;
}

/* ---- the thread ---- */

/* Says what went wrong, once per outage (and when it is over). */
static void log_change(Sampler *s, bool ok, const char *why)
{
        if (!ok && !s->logged_down)
                fprintf(stderr, "gpuipcctl metrics: the broker does not answer: %s\n", why);
        else if (ok && s->logged_down)
                fprintf(stderr, "gpuipcctl metrics: the broker answers again\n");
        s->logged_down = !ok;
}

static void failed(Sampler *s, const char *what, int err, char *why, size_t cap)
{
        const char *msg = s->c ? gpuipc_errmsg(s->c) : gpuipc_errmsg(NULL);

        snprintf(why, cap, "%s: [%s] %s", what, gpuipc_err_name(err), msg[0] ? msg : gpuipc_strerror(err));
        /* A fresh connection next time: this one may be broken in ways a reconnect does not mend. */
        gpuipc_close(s->c);
        s->c = NULL;
}

/* Connects lazily, on the sampler thread only: the HTTP side never touches the connection. no_gpus:
 * the exporter asks for statistics only, and probing CUDA would load the driver into a process
 * confined by its own seccomp filter for nothing. */
static int reach(Sampler *s, char *why, size_t cap)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .socket_path = s->cfg.socket, .label = "gpuipcctl-metrics",
                               .connect_timeout_ms = s->cfg.timeout_ms, .no_gpus = 1 };
        int r;

        if (s->c)
                return 0;
        r = gpuipc_connect(&s->c, &o);
        if (r < 0) {
                s->c = NULL;
                failed(s, "connect", r, why, cap);
        }
        return r;
}

/* One sample: true with the two renderings of it. */
static bool sample(Sampler *s, HttpBody **fresh, HttpBody **stale, char *why, size_t cap)
{
        MetricsInput in;
        const char *what;
        int r = reach(s, why, cap);

        if (r == 0)
                r = sampler_collect(s->c, s->stats, s->rings, &in, &what);
        if (r < 0) {
                /* When reach failed it has said why already, and left no connection to close. */
                if (s->c)
                        failed(s, what, r, why, cap);
                return false;
        }
        /* Both renderings now, while the records are at hand: a late scrape gets the stale one
         * (gpuipc_up 0 with the last numbers) without rendering on the HTTP thread. */
        *fresh = render(&in);
        in.up = false;
        in.stale = true;
        *stale = render(&in);
        if (!*fresh || !*stale) {
                *fresh = http_body_unref(*fresh);
                *stale = http_body_unref(*stale);
                snprintf(why, cap, "no memory to render the sample");
                return false;
        }
        return true;
}

/* The health check between scrapes: a ping is cheap for the broker, unlike a full sample, so an
 * idle exporter still notices a broker that stopped answering (sampler_healthy). */
static bool ping(Sampler *s, char *why, size_t cap)
{
        int r = reach(s, why, cap);

        if (r == 0) {
                r = gpuipc_ping(s->c, s->cfg.timeout_ms);
                if (r < 0)
                        failed(s, "ping", r, why, cap);
        }
        return r == 0;
}

/* Tells the HTTP loop (polling wake_fd, an eventfd) that a sample ended, so the scrapes waiting
 * for it are answered now rather than at their next timeout. A failed write only delays them. */
static void wake(Sampler *s)
{
        uint64_t one = 1;

        (void)!write(s->cfg.wake_fd, &one, sizeof(one));
}

/* With lock held: what a call ended with. A broker that failed takes its samples with it: they
 * described an instance that may be gone. */
static void record(Sampler *s, bool ok, const char *why, HttpBody *fresh, HttpBody *stale)
{
        s->busy_since = 0;
        s->ended_ms = monotonic_ms();
        s->ever = true;
        s->ok = ok;
        snprintf(s->why, sizeof(s->why), "%s", ok ? "" : why);
        /* A ping that succeeded brings no sample: the last one stays. A failed call of either
         * kind drops it. */
        if (fresh || !ok) {
                http_body_unref(s->fresh);
                http_body_unref(s->stale);
                s->fresh = fresh;
                s->stale = stale;
        }
}

/* The sampler thread: a sample when a ticket asks for one, else a ping when the last call is older
 * than HEALTH_PERIOD_MS, else a sleep until then (or until a ticket comes). Only this thread talks to
 * the broker, one call at a time, so scrapes never pile up calls on it. */
static void *run(void *arg)
{
        Sampler *s = arg;
        char why[256];

        pthread_mutex_lock(&s->lock);
        while (!s->stop) {
                uint64_t now = monotonic_ms();

                if (s->wanted > s->started) {
                        uint64_t attempt = ++s->started;
                        HttpBody *fresh = NULL, *stale = NULL;
                        bool ok;

                        /* The lock is dropped for the broker's call, so sampler_want and
                         * sampler_answer never wait for the broker. */
                        s->started_ms = s->busy_since = now;
                        pthread_mutex_unlock(&s->lock);
                        ok = sample(s, &fresh, &stale, why, sizeof(why));
                        log_change(s, ok, why);
                        pthread_mutex_lock(&s->lock);
                        record(s, ok, why, fresh, stale);
                        s->finished = attempt;
                        wake(s);
                } else if (!s->ever || now - s->ended_ms >= HEALTH_PERIOD_MS) {
                        bool ok;

                        s->busy_since = now;
                        pthread_mutex_unlock(&s->lock);
                        ok = ping(s, why, sizeof(why));
                        log_change(s, ok, why);
                        pthread_mutex_lock(&s->lock);
                        record(s, ok, why, NULL, NULL);
                } else {
                        /* An absolute monotonic time: the condition variable was made with
                         * CLOCK_MONOTONIC (sampler_new), so setting the wall clock cannot stretch
                         * or cut the wait. */
                        uint64_t at = s->ended_ms + HEALTH_PERIOD_MS;
                        struct timespec ts = { .tv_sec = (time_t)(at / 1000), .tv_nsec = (long)(at % 1000) * 1000000 };

                        pthread_cond_timedwait(&s->cond, &s->lock, &ts);
                }
        }
        s->exited = true;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        return NULL;
}

/* ---- the serving thread's side ---- */

/* A sample younger than MIN_INTERVAL_MS answers a new scrape as it is: many scrapers (or a
 * retrying one) then cost the broker one sample, not one each. */
uint64_t sampler_want(Sampler *s, uint64_t now)
{
        uint64_t ticket;

        pthread_mutex_lock(&s->lock);
        if (s->finished && s->finished == s->started && s->ok && s->fresh && now - s->started_ms < MIN_INTERVAL_MS) {
                ticket = s->finished;
        } else {
                ticket = s->started + 1;
                if (s->wanted < ticket)
                        s->wanted = ticket;
                pthread_cond_broadcast(&s->cond);
        }
        pthread_mutex_unlock(&s->lock);
        return ticket;
}

/* A scrape past its deadline (late) gets the last good sample with up 0, or up 0 alone: an
 * answer in time with what is known beats a timeout that Prometheus would count as a failed scrape. */
bool sampler_answer(Sampler *s, uint64_t ticket, bool late, HttpBody **ret)
{
        bool answered = true;

        pthread_mutex_lock(&s->lock);
        /* A reference, taken under the lock: record() may replace fresh the moment it is released,
         * and the connection keeps sending what it was given. */
        /* The attempt this ticket waited for ended: if it failed, up 0 alone, since record()
         * dropped the older numbers with it. */
        if (s->finished >= ticket)
                *ret = http_body_ref(s->ok && s->fresh ? s->fresh : s->down);
        else if (late)
                *ret = http_body_ref(s->stale ? s->stale : s->down);
        else
                answered = false;
        pthread_mutex_unlock(&s->lock);
        return answered;
}

bool sampler_healthy(Sampler *s, uint64_t now, char *why, size_t cap)
{
        bool ok = false;

        pthread_mutex_lock(&s->lock);
        /* First: a call hanging past the timeout makes the exporter unhealthy even though the
         * last call that ended went well. */
        if (s->busy_since && now - s->busy_since > (uint64_t)s->cfg.timeout_ms)
                snprintf(why, cap, "the broker has not answered for %llu ms",
                         (unsigned long long)(now - s->busy_since));
        else if (!s->ever)
                snprintf(why, cap, "the exporter has not reached the broker yet");
        else if (!s->ok)
                snprintf(why, cap, "the broker does not answer: %s", s->why);
        else
                ok = true;
        pthread_mutex_unlock(&s->lock);
        return ok;
}

/* ---- life ---- */

static Sampler *sampler_free(Sampler *s)
{
        if (!s)
                return NULL;
        gpuipc_close(s->c);
        http_body_unref(s->fresh);
        http_body_unref(s->stale);
        http_body_unref(s->down);
        free(s->stats);
        free(s->rings);
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return NULL;
}

int sampler_new(Sampler **ret, const SamplerConfig *cfg)
{
        MetricsInput down = { 0 };
        pthread_condattr_t attr;
        Sampler *s = calloc(1, sizeof(*s));

        if (!s)
                return -ENOMEM;
        s->cfg = *cfg;
        pthread_mutex_init(&s->lock, NULL);
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&s->cond, &attr);
        pthread_condattr_destroy(&attr);
        s->stats = calloc(GPUIPC_MAX_PAGE, sizeof(*s->stats));
        s->rings = calloc(SAMPLER_MAX_RINGS, sizeof(*s->rings));
        /* Rendered up front: answering "down" must not need memory at the moment things go wrong. */
        s->down = render(&down);
        if (!s->stats || !s->rings || !s->down) {
                sampler_free(s);
                return -ENOMEM;
        }
        *ret = s;
        return 0;
}

int sampler_start(Sampler *s)
{
        int r = pthread_create(&s->thread, NULL, run, s);

        if (r)
                return -r;
        s->running = true;
        return 0;
}

/* Waits STOP_WAIT_MS at most: the thread may be inside a broker call that only its timeout ends,
 * and a stopping exporter should not hang on it. A thread that did not exit is left to the process's
 * exit, and s with it (freeing it under a running thread would be a use after free). */
void sampler_stop(Sampler *s)
{
        uint64_t at = monotonic_ms() + STOP_WAIT_MS;
        struct timespec ts = { .tv_sec = (time_t)(at / 1000), .tv_nsec = (long)(at % 1000) * 1000000 };
        bool exited;

        if (!s)
                return;
        pthread_mutex_lock(&s->lock);
        s->stop = true;
        pthread_cond_broadcast(&s->cond);
        while (s->running && !s->exited && pthread_cond_timedwait(&s->cond, &s->lock, &ts) == 0)
                ;
        exited = !s->running || s->exited;
        pthread_mutex_unlock(&s->lock);
        if (!exited)
                return; /* inside a call to the broker: the process's exit ends it */
        if (s->running)
                pthread_join(s->thread, NULL);
        sampler_free(s);
}
