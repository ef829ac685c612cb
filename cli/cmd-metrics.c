/* gpuipcctl metrics: the broker's statistics and its rings for Prometheus, printed once or served
 * over HTTP by a small exporter process (the broker itself stays off the network). The exporter
 * keeps one broker connection, asks it at every scrape, and reconnects after the broker went away.
 *
 * What it must never do: put the broker on the network (only this process listens, and it only
 * asks read-only questions), or leave a scrape without an answer when the broker is away: the
 * exposition still comes, with gpuipc_up 0. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "http.h"
#include "json.h"
#include "metrics.h"

/* Rings exported per scrape at most: one series each per gpuipc_ring_* family. A bound, so that a
 * scrape's memory and time do not grow with whatever peers create; past it the first ones by
 * cursor are shown. */
#define MAX_RINGS 4096

typedef struct Exporter {
        Ctl *ctl;
        gpuipc_stat_t *stats;
        gpuipc_ring_info_t *rings; /* MAX_RINGS */
        bool reachable; /* what the last scrape found, to log only the changes */
        bool logged;
} Exporter;

/* Up to MAX_RINGS rings into rings: how many, or an error (a broker older than ring listings has
 * none to show: 0). */
static int scrape_rings(gpuipc_t *c, gpuipc_ring_info_t *rings)
{
        uint64_t cursor = 0;
        int n = 0;

        do {
                int got = gpuipc_list_rings(c, NULL, &cursor, rings + n, MAX_RINGS - n);

                if (got == GPUIPC_E_UNKNOWN_OP)
                        return 0;
                if (got < 0)
                        return got;
                n += got;
        } while (cursor && n < MAX_RINGS);
        return n;
}

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
        (void)sig;
        stop_requested = 1;
}

/* Connects if needed and checks that the broker answers. 0, or the error (logged when it is news). */
static int reach_broker(Exporter *e)
{
        Ctl *ctl = e->ctl;
        gpuipc_options_t o = { .struct_size = sizeof(o), .socket_path = ctl->socket, .label = "gpuipcctl-metrics",
                               .no_gpus = 1 };
        const char *why;
        int r = 0;

        o.connect_timeout_ms = ctl->timeout_ms;
        if (!ctl->c) {
                r = gpuipc_connect(&ctl->c, &o);
                if (r < 0)
                        ctl->c = NULL;
        }
        /* A connection that once worked may be dead by now: only a ping answered says "up". */
        if (r == 0)
                r = gpuipc_ping(ctl->c, ctl->timeout_ms);
        if (r < 0 && (e->reachable || !e->logged)) {
                why = ctl->c ? gpuipc_errmsg(ctl->c) : gpuipc_errmsg(NULL);
                fprintf(stderr, "gpuipcctl metrics: the broker does not answer: [%s] %s\n", gpuipc_err_name(r),
                        why[0] ? why : gpuipc_strerror(r));
        } else if (r == 0 && !e->reachable && e->logged) {
                fprintf(stderr, "gpuipcctl metrics: the broker answers again\n");
        }
        if (r < 0) {
                /* A fresh connection at the next scrape: this one may be broken. */
                gpuipc_close(ctl->c);
                ctl->c = NULL;
        }
        e->reachable = r == 0;
        e->logged = true;
        return r;
}

/* One scrape into in: the records and rings, or up false (the broker did not answer). */
static void scrape(Exporter *e, MetricsInput *in)
{
        const char *what = "stats";
        int n, n_rings = 0;

        *in = (MetricsInput){ .stats = e->stats, .rings = e->rings };
        if (reach_broker(e) < 0)
                return;
        n = gpuipc_stats(e->ctl->c, e->stats, GPUIPC_MAX_PAGE);
        if (n >= 0) {
                what = "rings";
                n_rings = scrape_rings(e->ctl->c, e->rings);
        }
        if (n < 0 || n_rings < 0) {
                int err = n < 0 ? n : n_rings;

                fprintf(stderr, "gpuipcctl metrics: %s: [%s] %s\n", what, gpuipc_err_name(err),
                        gpuipc_errmsg(e->ctl->c));
                gpuipc_close(e->ctl->c);
                e->ctl->c = NULL;
                e->reachable = false;
                return;
        }
        in->up = true;
        in->n_stats = n > GPUIPC_MAX_PAGE ? GPUIPC_MAX_PAGE : n;
        in->n_rings = n_rings;
}

static void serve(const char *path, HttpResponse *ret, void *ud)
{
        Exporter *e = ud;
        FILE *f;

        if (strcmp(path, "/metrics") == 0) {
                MetricsInput in;

                scrape(e, &in);
                f = open_memstream(&ret->body, &ret->len);
                if (!f)
                        return;
                metrics_write_text(f, &in);
                fclose(f);
                ret->status = 200;
                ret->content_type = METRICS_CONTENT_TYPE;
        } else if (strcmp(path, "/healthz") == 0) {
                bool ok = reach_broker(e) == 0;

                ret->status = ok ? 200 : 503;
                ret->body = strdup(ok ? "ok\n" : "the broker does not answer\n");
                ret->len = ret->body ? strlen(ret->body) : 1;
        } else if (strcmp(path, "/") == 0) {
                ret->status = 200;
                ret->body = strdup("gpuipcctl metrics: /metrics (Prometheus text format), /healthz\n");
                ret->len = ret->body ? strlen(ret->body) : 1;
        } else {
                ret->status = 404;
                ret->body = strdup("not found: try /metrics or /healthz\n");
                ret->len = ret->body ? strlen(ret->body) : 1;
        }
}

static int listen_and_serve(Ctl *ctl, const char *spec)
{
        struct sigaction stop = { .sa_handler = on_stop_signal }, ignore = { .sa_handler = SIG_IGN };
        Exporter e = { .ctl = ctl };
        char bound[128];
        const char *why = "";
        int fd, r;

        fd = http_listen(spec, bound, sizeof(bound), &why);
        if (fd < 0)
                return ctl_error(ctl, "listen", "--listen '%s': %s", spec, why);
        e.stats = calloc(GPUIPC_MAX_PAGE, sizeof(*e.stats));
        e.rings = calloc(MAX_RINGS, sizeof(*e.rings));
        if (!e.stats || !e.rings) {
                free(e.stats);
                free(e.rings);
                close(fd);
                return ctl_fail(ctl, "metrics", -ENOMEM);
        }
        /* No SA_RESTART: SIGTERM must interrupt poll(), so that a sidecar stops at once. */
        sigaction(SIGTERM, &stop, NULL);
        sigaction(SIGINT, &stop, NULL);
        sigaction(SIGPIPE, &ignore, NULL);
        if (ctl->json)
                printf("{\"event\":\"listening\",\"address\":\"%s\"}\n", bound);
        else
                printf("serving /metrics and /healthz on http://%s\n", bound);
        fflush(stdout);
        ctl->printed = true;
        r = http_serve(fd, serve, &e, &stop_requested);
        free(e.stats);
        free(e.rings);
        if (r < 0) {
                ctl->printed = false;
                return ctl_fail(ctl, "serving HTTP", r);
        }
        return CTL_OK;
}

int cmd_metrics(Ctl *ctl, int argc, char **argv)
{
        static const struct option longopts[] = { { "listen", required_argument, NULL, 'l' }, CTL_HELP_OPTION, {} };
        const char *listen_spec = NULL;
        MetricsInput in = { 0 };
        gpuipc_stat_t *stats;
        gpuipc_ring_info_t *rings;
        int c, n, r;

        while ((c = getopt_long(argc, argv, ":l:h", longopts, NULL)) >= 0) {
                if (c == 'h')
                        return ctl_help(ctl);
                if (c != 'l')
                        return ctl_bad_option(ctl, argc, argv, c);
                listen_spec = optarg;
        }
        if (optind < argc)
                return ctl_usage(ctl, "unexpected argument '%s'", argv[optind]);
        if (listen_spec)
                return listen_and_serve(ctl, listen_spec);

        /* Once: without a broker the exposition still comes out, saying gpuipc_up 0 (a textfile
         * collector then records the outage), and the exit code says so too. */
        stats = calloc(GPUIPC_MAX_PAGE, sizeof(*stats));
        rings = calloc(MAX_RINGS, sizeof(*rings));
        if (!stats || !rings) {
                free(stats);
                free(rings);
                return ctl_fail(ctl, "metrics", -ENOMEM);
        }
        ctl->printed = true; /* the exposition is the document, failure or not */
        in = (MetricsInput){ .stats = stats, .rings = rings };
        r = ctl_connect(ctl, false);
        if (r == 0) {
                n = gpuipc_stats(ctl->c, stats, GPUIPC_MAX_PAGE);
                if (n < 0)
                        r = ctl_fail(ctl, "stats", n);
                in.n_stats = n < 0 ? 0 : n > GPUIPC_MAX_PAGE ? GPUIPC_MAX_PAGE : n;
        }
        if (r == 0) {
                n = scrape_rings(ctl->c, rings);
                if (n < 0)
                        r = ctl_fail(ctl, "rings", n);
                in.n_rings = n < 0 ? 0 : n;
        }
        in.up = r == 0;
        if (ctl->json)
                metrics_write_json(stdout, &in);
        else
                metrics_write_text(stdout, &in);
        free(stats);
        free(rings);
        return r;
}
