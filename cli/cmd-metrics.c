/* gpuipcctl metrics: the broker's statistics and its rings for Prometheus, printed once or served
 * over HTTP by a small exporter process (the broker itself stays off the network). The exporter's
 * HTTP loop (http.c, on libmicrohttpd) runs in the main thread and never waits for the broker; a second thread
 * (sampler.c) asks the broker for what scrapes want, and reconnects after the broker went away.
 *
 * What it must never do: put the broker on the network (only this process listens, and it only
 * asks read-only questions), let a client or a slow broker hold up other requests, or leave a
 * scrape without an answer by its deadline: the exposition still comes, with gpuipc_up 0. It is
 * confined (exporter-confine.c) once it listens. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ctl.h"
#include "exporter-confine.h"
#include "http.h"
#include "json.h"
#include "metrics.h"
#include "sampler.h"

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
        (void)sig;
        stop_requested = 1;
}

typedef struct Exporter {
        Sampler *sampler;
        int timeout_ms; /* a scrape's deadline */
} Exporter;

/* A plain-text answer; without memory for it a bodiless 500, which the server can always send. */
static void answer_text(HttpResponse *ret, int status, const char *text)
{
        ret->status = status;
        ret->body = http_body_new(text, strlen(text));
        if (!ret->body)
                ret->status = 500;
}

/* The HTTP loop's handler: never waits. A scrape is answered once a sample at least as new as it is
 * ready, or at its deadline with the last good one and gpuipc_up 0; /healthz at once. */
static void serve(HttpRequest *req, HttpResponse *ret, void *ud)
{
        Exporter *e = ud;
        uint64_t now = monotonic_ms();

        if (strcmp(req->path, "/metrics") == 0) {
                uint64_t deadline = req->arrived_ms + (uint64_t)e->timeout_ms;

                /* The ticket is taken on the first call only and kept in the request: asking
                 * again (the loop retries until answered) must not move the scrape to a later
                 * sample, or a busy broker could keep it waiting to its deadline. */
                if (!req->note)
                        req->note = sampler_want(e->sampler, req->arrived_ms);
                if (sampler_answer(e->sampler, req->note, now >= deadline, &ret->body)) {
                        ret->status = ret->body ? 200 : 500;
                        ret->content_type = METRICS_CONTENT_TYPE;
                } else {
                        ret->retry_at_ms = deadline;
                }
        } else if (strcmp(req->path, "/healthz") == 0) {
                char why[320];

                if (sampler_healthy(e->sampler, now, why, sizeof(why))) {
                        answer_text(ret, 200, "ok\n");
                } else {
                        /* The reason is the body, so a probe's log says why it failed. why is at
                         * most 256 + the sampler's prefix, well inside its 320 bytes. */
                        strcat(why, "\n");
                        answer_text(ret, 503, why);
                }
        } else if (strcmp(req->path, "/") == 0) {
                /* For a person who points a browser at the port: where the two resources are. */
                answer_text(ret, 200, "gpuipcctl metrics: /metrics (Prometheus text format), /healthz\n");
        } else {
                answer_text(ret, 404, "not found: try /metrics or /healthz\n");
        }
}

/* metrics --listen: the order of set-up is the point. Listen (so a bad address fails before
 * anything else starts), the sampler made but not started, the HTTP server, the signals, then the
 * confinement, and only then the sampler's thread and the first byte read from the network. */
static int listen_and_serve(Ctl *ctl, const char *spec, bool confined)
{
        struct sigaction stop = { .sa_handler = on_stop_signal }, ignore = { .sa_handler = SIG_IGN };
        Exporter e = { .timeout_ms = ctl->timeout_ms };
        SamplerConfig sc = { .socket = ctl->socket, .timeout_ms = ctl->timeout_ms };
        HttpServerConfig hc = { .handler = serve, .userdata = &e };
        HttpServer *server = NULL;
        char bound[128];
        const char *why = "";
        int r;

        hc.listen_fd = http_listen(spec, bound, sizeof(bound), &why);
        if (hc.listen_fd < 0)
                return ctl_error(ctl, "listen", "--listen '%s': %s", spec, why);
        hc.wake_fd = sc.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        r = hc.wake_fd < 0 ? -errno : sampler_new(&e.sampler, &sc);
        if (r < 0) {
                close(hc.listen_fd);
                if (hc.wake_fd >= 0)
                        close(hc.wake_fd);
                return ctl_fail(ctl, "metrics", r);
        }
        /* The server (libmicrohttpd loaded, its daemon on the listening socket) before the
         * confinement, which lets no library be opened. */
        r = http_server_new(&server, &hc, &why);
        if (r < 0) {
                sampler_stop(e.sampler);
                close(hc.wake_fd);
                return ctl_error(ctl, "listen", "--listen '%s': %s", spec, why);
        }
        /* No SA_RESTART: SIGTERM must interrupt poll(), so that a sidecar stops at once. */
        sigaction(SIGTERM, &stop, NULL);
        sigaction(SIGINT, &stop, NULL);
        /* Belt and braces: libmicrohttpd sends with MSG_NOSIGNAL, but a scraper that hangs up must
         * never take the exporter down through a path that forgot it. */
        sigaction(SIGPIPE, &ignore, NULL);
        /* The one process that listens on the network: confined before it reads a byte from it,
         * and before its second thread exists (both confinements are inherited, not imposed). */
        if (confined && (r = exporter_confine(&why)) < 0) {
                http_server_free(server);
                sampler_stop(e.sampler);
                close(hc.wake_fd);
                return ctl_error(ctl, "confine", "cannot confine the exporter: %s (--no-sandbox runs it "
                                 "without)", why);
        }
        r = sampler_start(e.sampler);
        if (r < 0) {
                http_server_free(server);
                sampler_stop(e.sampler);
                close(hc.wake_fd);
                return ctl_fail(ctl, "metrics", r);
        }
        /* The address as bound (port 0 becomes the real one): a test or a supervisor reads it from
         * this first line; `bound` is digits, dots, colons and brackets, safe in JSON as it is. */
        if (ctl->json)
                printf("{\"event\":\"listening\",\"address\":\"%s\"}\n", bound);
        else
                printf("serving /metrics and /healthz on http://%s\n", bound);
        fflush(stdout);
        ctl->printed = true;
        r = http_server_run(server, &stop_requested);
        /* The server first: its handler asks the sampler. */
        http_server_free(server);
        sampler_stop(e.sampler);
        close(hc.wake_fd);
        if (r < 0) {
                ctl->printed = false;
                return ctl_fail(ctl, "serving HTTP", r);
        }
        return CTL_OK;
}

/* metrics: once to stdout (a textfile collector, a script), or with --listen as an exporter. The
 * listen spec is checked before anything connects, so a typo is a usage error, not a late failure. */
int cmd_metrics(Ctl *ctl, int argc, char **argv)
{
        const char *listen_spec = NULL, *why, *what;
        bool confined = true;
        MetricsInput in = { 0 };
        gpuipc_stat_t *stats;
        gpuipc_ring_info_t *rings;
        int c, r;

        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                if (c == CTL_OPT_NO_SANDBOX)
                        confined = false;
                else if (c == 'l')
                        listen_spec = optarg;
        }
        if (c < 0)
                return r;
        if (optind < argc)
                return ctl_usage(ctl, "unexpected argument '%s'", argv[optind]);
        if (listen_spec && http_check_spec(listen_spec, &why) < 0)
                return ctl_usage(ctl, "--listen '%s': %s", listen_spec, why);
        if (!listen_spec && !confined)
                return ctl_usage(ctl, "--no-sandbox goes with --listen");
        if (listen_spec)
                return listen_and_serve(ctl, listen_spec, confined); /* its sampler reconnects */

        /* Once: without a broker the exposition still comes out, saying gpuipc_up 0 (a textfile
         * collector then records the outage), and the exit code says so too. */
        stats = calloc(GPUIPC_MAX_PAGE, sizeof(*stats));
        rings = calloc(SAMPLER_MAX_RINGS, sizeof(*rings));
        if (!stats || !rings) {
                free(stats);
                free(rings);
                return ctl_fail(ctl, "metrics", -ENOMEM);
        }
        ctl->printed = true; /* the exposition is the document, failure or not */
        /* No sampler thread here: one collection on this thread over the ordinary connection; a
         * failure is reported on stderr, and the exposition (gpuipc_up 0) still prints. */
        r = ctl_connect(ctl, false);
        if (r == 0) {
                r = sampler_collect(ctl->c, stats, rings, &in, &what);
                if (r < 0) {
                        r = ctl_fail(ctl, what, r);
                        in = (MetricsInput){ 0 };
                }
        }
        if (ctl->json)
                metrics_write_json(stdout, &in);
        else
                metrics_write_text(stdout, &in);
        free(stats);
        free(rings);
        return r;
}
