/* cli/metrics.c: broker records become Prometheus families in base units, with one HELP and TYPE
 * each; series and histograms are assembled from their records; records a newer broker may send
 * are still exported, validly named. The exposition is checked line by line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "metrics.h"

static gpuipc_stat_t stat_of(const char *name, const char *status, uint64_t le_us, uint64_t value)
{
        gpuipc_stat_t s = { .le_us = le_us, .value = value };

        snprintf(s.name, sizeof(s.name), "%s", name);
        snprintf(s.status, sizeof(s.status), "%s", status);
        return s;
}

static char *render_with_rings(const gpuipc_stat_t *stats, int n, const gpuipc_ring_info_t *rings, int n_rings,
                               bool up, bool json)
{
        MetricsInput in = { .up = up, .stats = stats, .n_stats = n, .rings = rings, .n_rings = n_rings };
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);

        CHECK(f);
        if (json)
                metrics_write_json(f, &in);
        else
                metrics_write_text(f, &in);
        CHECK(fclose(f) == 0);
        return text;
}

static char *render(const gpuipc_stat_t *stats, int n, bool up, bool json)
{
        return render_with_rings(stats, n, NULL, 0, up, json);
}

static void check_line(const char *text, const char *line)
{
        const char *p = text;
        size_t n = strlen(line);

        for (; (p = strstr(p, line)); p++)
                if ((p == text || p[-1] == '\n') && p[n] == '\n')
                        return;
        fprintf(stderr, "missing line: %s\nin:\n%s", line, text);
        abort();
}

static size_t count(const char *text, const char *needle)
{
        size_t n = 0;

        for (const char *p = text; (p = strstr(p, needle)); p++)
                n++;
        return n;
}

/* Known records: renamed into base units, folded into labelled families, histograms complete. */
static void test_metrics_known(void)
{
        const gpuipc_stat_t stats[] = {
                stat_of("buffers", "", 0, 3),          stat_of("buffers_live", "", 0, 2),
                stat_of("buffers_retired", "", 0, 1),  stat_of("buffers_idle", "", 0, 0),
                stat_of("uptime_ms", "", 0, 1500),     stat_of("open_fds", "", 0, 12),
                stat_of("open_fds_limit", "", 0, 1024), stat_of("request_errors_total", "quota", 0, 4),
                stat_of("request_errors_total", "denied", 0, 1),
                stat_of("request_duration_us_bucket", "", 10, 5),
                stat_of("request_duration_us_bucket", "", 100, 7),
                stat_of("request_duration_us_count", "", 0, 8), stat_of("request_duration_us_sum", "", 0, 2500),
                stat_of("peer_cleanup_us_max", "", 0, 1500000),
                stat_of("shared_bytes", "memfd", 0, 8192), stat_of("shared_bytes", "cuda-vmm", 0, 0),
                stat_of("held_bytes", "memfd", 0, 4096), stat_of("uid_shared_bytes", "10001", 0, 8192),
                stat_of("uid_held_bytes", "10001", 0, 0),
        };
        char *t = render(stats, sizeof(stats) / sizeof(stats[0]), true, false);

        check_line(t, "gpuipc_up 1");
        check_line(t, "gpuipc_buffers{state=\"live\"} 2");
        check_line(t, "gpuipc_buffers{state=\"retired\"} 1");
        check_line(t, "gpuipc_buffers{state=\"idle\"} 0");
        CHECK(count(t, "# TYPE gpuipc_buffers gauge") == 1); /* one family, and "buffers" itself left out */
        check_line(t, "gpuipc_uptime_seconds 1.5");
        check_line(t, "gpuipc_open_fds 12");
        check_line(t, "gpuipc_max_fds 1024");
        check_line(t, "gpuipc_request_errors_total{status=\"quota\"} 4");
        check_line(t, "gpuipc_request_errors_total{status=\"denied\"} 1");
        check_line(t, "# TYPE gpuipc_request_duration_seconds histogram");
        check_line(t, "gpuipc_request_duration_seconds_bucket{le=\"0.00001\"} 5");
        check_line(t, "gpuipc_request_duration_seconds_bucket{le=\"0.0001\"} 7");
        check_line(t, "gpuipc_request_duration_seconds_bucket{le=\"+Inf\"} 8");
        check_line(t, "gpuipc_request_duration_seconds_sum 0.0025");
        check_line(t, "gpuipc_request_duration_seconds_count 8");
        check_line(t, "gpuipc_peer_cleanup_max_seconds 1.5");
        check_line(t, "# TYPE gpuipc_shared_bytes gauge");
        check_line(t, "gpuipc_shared_bytes{kind=\"memfd\"} 8192");
        check_line(t, "gpuipc_shared_bytes{kind=\"cuda-vmm\"} 0");
        check_line(t, "gpuipc_held_bytes{kind=\"memfd\"} 4096");
        check_line(t, "gpuipc_uid_shared_bytes{uid=\"10001\"} 8192");
        check_line(t, "gpuipc_uid_held_bytes{uid=\"10001\"} 0");
        CHECK(count(t, "# HELP gpuipc_shared_bytes ") == 1 && count(t, "# HELP gpuipc_uid_held_bytes ") == 1);
        CHECK(count(t, "# HELP ") == count(t, "# TYPE "));
        CHECK(!strstr(t, "_ms") && !strstr(t, "_us"));
        free(t);
}

/* A newer broker's records: exported under their own names, time units converted, a status as a
 * label; an unknown histogram's buckets and names that are not metric names are left out. */
static void test_metrics_unknown(void)
{
        const gpuipc_stat_t stats[] = {
                stat_of("widgets", "", 0, 9),
                stat_of("widget_wait_us", "", 0, 250),
                stat_of("widget_errors_total", "quota", 0, 2),
                stat_of("gizmo_us_bucket", "", 10, 1),
                stat_of("bad name!", "", 0, 1),
        };
        char *t = render(stats, sizeof(stats) / sizeof(stats[0]), true, false);

        check_line(t, "# TYPE gpuipc_widgets gauge");
        check_line(t, "gpuipc_widgets 9");
        check_line(t, "gpuipc_widget_wait_seconds 0.00025");
        check_line(t, "# TYPE gpuipc_widget_errors_total counter");
        check_line(t, "gpuipc_widget_errors_total{status=\"quota\"} 2");
        CHECK(!strstr(t, "gizmo") && !strstr(t, "bad name"));
        free(t);
}

/* Without a broker: up 0 and the build info, nothing else; the JSON form says the same. */
static void test_metrics_down(void)
{
        const gpuipc_stat_t stats[] = { stat_of("peers", "", 0, 5) };
        char *t = render(stats, 1, false, false), *j = render(stats, 1, false, true);

        check_line(t, "gpuipc_up 0");
        CHECK(strstr(t, "gpuipc_build_info{version=\""));
        CHECK(!strstr(t, "gpuipc_peers"));
        CHECK(strstr(j, "\"name\":\"gpuipc_up\"") && strstr(j, "\"value\":0"));
        CHECK(j[0] == '[' && !strstr(j, "gpuipc_peers"));
        free(t);
        free(j);
}

/* A broker that did not answer in time: up 0, and the last good sample with its time, so that a
 * dashboard keeps its values and an alert sees the outage. */
static void test_metrics_stale(void)
{
        const gpuipc_stat_t stats[] = { stat_of("peers", "", 0, 5) };
        MetricsInput in = { .stale = true, .sampled_at = 1700000000.25, .stats = stats, .n_stats = 1 };
        char *t = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&t, &len);

        CHECK(f);
        metrics_write_text(f, &in);
        CHECK(fclose(f) == 0);
        check_line(t, "gpuipc_up 0");
        check_line(t, "gpuipc_peers 5");
        check_line(t, "# TYPE gpuipc_sample_timestamp_seconds gauge");
        check_line(t, "gpuipc_sample_timestamp_seconds 1700000000.250");
        free(t);
}

/* Rings: one series per ring in each gpuipc_ring_* family, labelled with its name; what is not
 * known (the head of an unreadable control page, the lag of a ring nobody sits in) has no sample. */
static void test_metrics_rings(void)
{
        const gpuipc_stat_t stats[] = { stat_of("rings", "", 0, 2), stat_of("ring_members", "", 0, 3) };
        gpuipc_ring_info_t rings[2] = { { .slots = 8, .taken = 3, .head_known = 1, .head = 1207, .lag_known = 1,
                                          .lag = 7 },
                                        { .slots = 4, .taken = 0 } };
        char *t, *j;

        snprintf(rings[0].name, sizeof(rings[0].name), "cams/front");
        snprintf(rings[1].name, sizeof(rings[1].name), "cams/\"odd\"");
        t = render_with_rings(stats, 2, rings, 2, true, false);
        j = render_with_rings(stats, 2, rings, 2, true, true);
        check_line(t, "gpuipc_rings 2");
        check_line(t, "gpuipc_ring_members 3");
        check_line(t, "# TYPE gpuipc_ring_head gauge");
        check_line(t, "gpuipc_ring_head{ring=\"cams/front\"} 1207");
        check_line(t, "# TYPE gpuipc_ring_frames_published_total counter");
        check_line(t, "gpuipc_ring_frames_published_total{ring=\"cams/front\"} 1207");
        CHECK(count(t, "gpuipc_ring_frames_published_total{") == 1); /* none for the unreadable one */
        check_line(t, "gpuipc_ring_lag_frames{ring=\"cams/front\"} 7");
        check_line(t, "gpuipc_ring_seats_taken{ring=\"cams/front\"} 3");
        check_line(t, "gpuipc_ring_seats_taken{ring=\"cams/\\\"odd\\\"\"} 0");
        check_line(t, "gpuipc_ring_slots{ring=\"cams/front\"} 8");
        CHECK(count(t, "gpuipc_ring_head{") == 1 && count(t, "gpuipc_ring_lag_frames{") == 1);
        CHECK(count(t, "# HELP gpuipc_ring_slots ") == 1 && count(t, "gpuipc_ring_slots{") == 2);
        CHECK(strstr(j, "\"name\":\"gpuipc_ring_lag_frames\"") && strstr(j, "\"labels\":{\"ring\":\"cams/front\"}"));
        free(t);
        free(j);
        /* Without a broker: no ring family at all. */
        t = render_with_rings(stats, 2, rings, 2, false, false);
        CHECK(!strstr(t, "gpuipc_ring"));
        free(t);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_metrics_known);
        TEST_RUN(argc, argv, test_metrics_unknown);
        TEST_RUN(argc, argv, test_metrics_down);
        TEST_RUN(argc, argv, test_metrics_stale);
        TEST_RUN(argc, argv, test_metrics_rings);
        return TEST_END();
}
