/* Broker statistics -> Prometheus metric families; see metrics.h. The table below is the one place
 * that says what each broker record means to a Prometheus user: names in base units (seconds, not
 * the broker's integer microseconds), counters ending in _total, one HELP text each. */
#include "metrics.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "json.h"

#define MAX_LABELS 2 /* build_info's version and library; every other family has at most one */

typedef enum MetricType { GAUGE, COUNTER, HISTOGRAM } MetricType;

typedef struct MetricDesc {
        const char *stat;   /* the broker's record; for histograms the base of its _bucket, _count and _sum */
        const char *metric; /* the family's name after "gpuipc_" */
        MetricType type;
        unsigned digits;    /* decimal digits the broker's integer has below the metric's unit: 3 ms, 6 µs */
        const char *label;  /* a label: with label_value fixed (buffers by state), else the record's status */
        const char *label_value;
        const char *help;
} MetricDesc;

/* Families in exposition order; entries sharing a metric are one family (keep them adjacent). The
 * broker's "buffers" is left out: it is the sum of gpuipc_buffers over its states. */
/* The metric names (second column) are what dashboards and alert rules query: the exporter's
 * interface, kept apart from the broker's record names (first column), so that a record renamed in
 * the broker changes one entry here and no dashboard. */
static const MetricDesc descs[] = {
        { "peers", "peers", GAUGE, 0, NULL, NULL, "Connections to the broker." },
        { "buffers_live", "buffers", GAUGE, 0, "state", "live", "Registered buffers, by state (live: attachable; "
          "retired: waiting for the last release; idle: drained, kept for publishing again)." },
        { "buffers_retired", "buffers", GAUGE, 0, "state", "retired", NULL },
        { "buffers_idle", "buffers", GAUGE, 0, "state", "idle", NULL },
        { "buffers_orphaned", "buffers_orphaned", GAUGE, 0, NULL, NULL,
          "Broker-held buffers whose producer is gone; they live until retired and drained." },
        { "broker_held_bytes", "broker_held_bytes", GAUGE, 0, NULL, NULL,
          "Bytes of the memory of broker-held buffers (loaded weights among them): it outlives its producers." },
        { "references", "references", GAUGE, 0, NULL, NULL, "References consumers hold, over all buffers." },
        { "held_fds", "held_fds", GAUGE, 0, NULL, NULL, "Buffer memory file descriptors the broker holds." },
        { "waits", "waits", GAUGE, 0, NULL, NULL, "Attaches and group joins waiting in the broker." },
        { "subscriptions", "subscriptions", GAUGE, 0, NULL, NULL, "Event subscriptions of all peers." },
        { "groups", "groups", GAUGE, 0, NULL, NULL, "Rendezvous groups still forming." },
        { "names", "names", GAUGE, 0, NULL, NULL, "Names with a published buffer or a waiter." },
        { "restart_grace", "restart_grace", GAUGE, 0, NULL, NULL,
          "1 while the broker is in its restart grace (--restart-grace-ms after it started): holders that "
          "reconnect may reclaim what they held, and restored buffers do not drain yet; else 0." },
        { "buffers_restored", "buffers_restored", GAUGE, 0, NULL, NULL,
          "Buffers their producers registered again after a broker restart, waiting for the grace to end "
          "before they may drain." },
        { "claims_pending", "claims_pending", GAUGE, 0, NULL, NULL,
          "Reclaims by reconnected consumers that wait for the buffer's producer to register it again; revoked "
          "if it does not within the restart grace." },
        { "shared_bytes", "shared_bytes", GAUGE, 0, "kind", NULL,
          "Bytes of buffer memory registered with the broker, by buffer kind, in every state (a view's bytes "
          "are its segment's, counted once; a ring's slots and pages count)." },
        { "held_bytes", "held_bytes", GAUGE, 0, "kind", NULL,
          "Bytes of the buffers consumers hold references to, by buffer kind: each buffer's size once per "
          "connection holding at least one reference to it." },
        { "uid_shared_bytes", "uid_shared_bytes", GAUGE, 0, "uid", NULL,
          "gpuipc_shared_bytes for the buffers one uid's connections published, for each uid the broker's "
          "policy names (at most 64)." },
        { "uid_held_bytes", "uid_held_bytes", GAUGE, 0, "uid", NULL,
          "gpuipc_held_bytes for the references one uid's connections hold, for each uid the broker's policy "
          "names (at most 64)." },
        { "rings", "rings", GAUGE, 0, NULL, NULL, "Rings registered (frames pass through them without the broker)." },
        { "ring_members", "ring_members", GAUGE, 0, NULL, NULL, "Members seated in rings, over all rings." },
        { "open_fds", "open_fds", GAUGE, 0, NULL, NULL,
          "File descriptors open in the broker process (counted at most once a second)." },
        { "open_fds_limit", "max_fds", GAUGE, 0, NULL, NULL,
          "File descriptors the broker may open: its soft RLIMIT_NOFILE." },
        { "uptime_ms", "uptime_seconds", GAUGE, 3, NULL, NULL, "Seconds since the broker started." },
        { "publishes_total", "publishes_total", COUNTER, 0, NULL, NULL, "First publishes: buffers registered." },
        { "republishes_total", "republishes_total", COUNTER, 0, NULL, NULL,
          "Publishes of a drained buffer again, without sending its memory." },
        { "attaches_total", "attaches_total", COUNTER, 0, NULL, NULL, "Attaches that succeeded." },
        { "attaches_cached_total", "attaches_cached_total", COUNTER, 0, NULL, NULL,
          "Attaches served by the consumer's cached mapping: no fd travelled." },
        { "attach_waits_total", "attach_waits_total", COUNTER, 0, NULL, NULL,
          "Attaches by name that had to wait for a publish." },
        { "timeouts_total", "attach_timeouts_total", COUNTER, 0, NULL, NULL,
          "Attaches by name that waited their whole timeout." },
        { "releases_total", "releases_total", COUNTER, 0, NULL, NULL, "References released by consumers." },
        { "retires_total", "retires_total", COUNTER, 0, NULL, NULL, "Buffers retired." },
        { "drains_total", "drains_total", COUNTER, 0, NULL, NULL,
          "Retired buffers whose last reference went: drained." },
        { "revokes_total", "revokes_total", COUNTER, 0, NULL, NULL,
          "Buffers revoked because their producer died without broker-held lifetime." },
        { "frees_total", "frees_total", COUNTER, 0, NULL, NULL, "Buffers the broker forgot." },
        { "events_total", "events_total", COUNTER, 0, NULL, NULL, "Events sent to peers." },
        { "groups_completed_total", "groups_completed_total", COUNTER, 0, NULL, NULL,
          "Rendezvous groups whose members all arrived." },
        { "groups_failed_total", "groups_failed_total", COUNTER, 0, NULL, NULL,
          "Rendezvous groups that failed at their earliest member's deadline." },
        { "request_errors_total", "request_errors_total", COUNTER, 0, "status", NULL,
          "Requests answered with an error, by status (quota: a limit refused it; denied: the policy did)." },
        { "reclaims_total", "reclaims_total", COUNTER, 0, NULL, NULL,
          "References consumers took back after reconnecting (to a restarted broker, or after a dropped "
          "connection)." },
        { "reclaims_refused_total", "reclaims_refused_total", COUNTER, 0, NULL, NULL,
          "Reclaims refused: the buffer was published again, drained or unknown after the grace, or nobody "
          "could vouch for the references and an attach would not have been granted; the holder must stop "
          "using the memory." },
        { "claims_revoked_total", "claims_revoked_total", COUNTER, 0, NULL, NULL,
          "Pending claims revoked: their producer did not register the buffer again within the restart grace." },
        { "ring_frames_taken_total", "ring_frames_taken_total", COUNTER, 0, NULL, NULL,
          "Frames ring members took, all rings together, as their member pages said when the broker last listed "
          "rings (each scrape lists them after reading this: it shows the previous scrape's reading). Takes since "
          "then by a member that left are not counted." },
        { "connections_total", "connections_total", COUNTER, 0, NULL, NULL, "Connections accepted." },
        { "audit_suppressed_total", "audit_suppressed_total", COUNTER, 0, NULL, NULL,
          "Audit records not written: past --audit-rate, for the broker or for their uid." },
        { "connections_refused_total", "connections_refused_total", COUNTER, 0, NULL, NULL,
          "Connections refused by a connection quota (or for lack of memory)." },
        { "frames_in_total", "frames_received_total", COUNTER, 0, NULL, NULL, "Frames received from peers." },
        { "frames_out_total", "frames_sent_total", COUNTER, 0, NULL, NULL, "Frames sent to peers." },
        { "bytes_in_total", "received_bytes_total", COUNTER, 0, NULL, NULL, "Bytes of frames received from peers." },
        { "bytes_out_total", "sent_bytes_total", COUNTER, 0, NULL, NULL, "Bytes of frames sent to peers." },
        { "fds_in_total", "fds_received_total", COUNTER, 0, NULL, NULL, "File descriptors received from peers." },
        { "fds_out_total", "fds_sent_total", COUNTER, 0, NULL, NULL, "File descriptors sent to peers." },
        { "protocol_errors_total", "protocol_errors_total", COUNTER, 0, NULL, NULL,
          "Peers disconnected for breaking the protocol." },
        { "seccomp_refused_total", "seccomp_refused_calls_total", COUNTER, 0, NULL, NULL,
          "System calls outside the broker's seccomp allow-list that were refused with ENOSYS (the "
          "broker's log names each and the request it served); anything above 0 is a bug to report." },
        { "slow_peers_dropped_total", "slow_peers_dropped_total", COUNTER, 0, NULL, NULL,
          "Peers disconnected because they stopped reading (queued output over the limit)." },
        { "memory_budget_bytes", "memory_budget_bytes", GAUGE, 0, NULL, NULL,
          "The memory budget for everything peers make the broker keep (--memory-budget)." },
        { "memory_uid_share_bytes", "memory_uid_share_bytes", GAUGE, 0, NULL, NULL,
          "One uid's share of the memory budget (--memory-budget-per-uid)." },
        { "memory_held_bytes", "memory_held_bytes", GAUGE, 0, NULL, NULL,
          "Bytes of the budget charged for what peers make the broker keep: connections, buffers, "
          "references, subscriptions, waits, groups, claims, rings (at most half the budget)." },
        { "memory_output_bytes", "memory_output_bytes", GAUGE, 0, NULL, NULL,
          "Bytes of the budget charged for frames queued for peers that have not read them (at most "
          "half the budget)." },
        { "memory_peak_bytes", "memory_peak_bytes", GAUGE, 0, NULL, NULL,
          "The most the budget has had charged at once since the broker started." },
        { "memory_refused_total", "memory_refused_total", COUNTER, 0, NULL, NULL,
          "Requests and connections refused with quota for the memory budget, and peers dropped for "
          "unread output over their uid's share of it." },
        { "cpu_limit_millicpus", "cpu_limit_cpus", GAUGE, 3, NULL, NULL,
          "The CPU the broker keeps its use under (--cpu-limit, or the cgroup's quota); 0: none." },
        { "frames_paced_total", "paced_total", COUNTER, 0, NULL, NULL,
          "Times a connection that had its share of the broker's CPU waited for the next 10 ms window "
          "(only under a CPU limit)." },
        { "turns_skipped_total", "turns_skipped_total", COUNTER, 0, NULL, NULL,
          "Turns a uid skipped to pay back CPU time its costly requests took beyond its share." },
        { "request_duration_us", "request_duration_seconds", HISTOGRAM, 6, NULL, NULL,
          "Time the broker spent on a request, from receiving it to handing its replies to the kernel "
          "(an attach's wait for a publish is not part of it)." },
        { "peer_cleanup_duration_us", "peer_cleanup_duration_seconds", HISTOGRAM, 6, NULL, NULL,
          "Time forgetting a disconnected peer took: its references, waits, subscriptions and buffers." },
        { "peer_cleanup_us_last", "peer_cleanup_last_seconds", GAUGE, 6, NULL, NULL,
          "How long forgetting the last disconnected peer took." },
        { "peer_cleanup_us_max", "peer_cleanup_max_seconds", GAUGE, 6, NULL, NULL,
          "The longest forgetting a peer took since the broker started." },
        { "peer_cleanup_refs_last", "peer_cleanup_last_references", GAUGE, 0, NULL, NULL,
          "References the last disconnected peer held." },
};

/* ---- output: the text format or JSON, sample by sample ---- */

typedef struct Sink {
        FILE *f;
        bool json;
        bool in_family;
        char family[GPUIPC_MAX_NAME + 16]; /* the family being written */
        Json families, family_obj, samples;
} Sink;

/* The TYPE line's word, and the JSON's "type": Prometheus's own names, so the two formats agree. */
static const char *type_name(MetricType t)
{
        return t == COUNTER ? "counter" : t == HISTOGRAM ? "histogram" : "gauge";
}

/* The text format's escapes: HELP text escapes backslash and newline, label values also the double
 * quote (quotes). A newline left raw would end the line and let a ring's name forge a sample. */
static void text_escaped(FILE *f, const char *s, bool quotes)
{
        for (; *s; s++) {
                if (*s == '\\')
                        fputs("\\\\", f);
                else if (*s == '\n')
                        fputs("\\n", f);
                else if (*s == '"' && quotes)
                        fputs("\\\"", f);
                else
                        fputc(*s, f);
        }
}

/* Only JSON has something to close; the text format ends a family by starting the next. */
static void family_end(Sink *s)
{
        if (s->in_family && s->json) {
                json_end(&s->samples, ']');
                json_end(&s->family_obj, '}');
        }
        s->in_family = false;
}

/* Starts a family unless it is the one being written: HELP and TYPE once, before its samples. */
static void family_begin(Sink *s, const char *name, MetricType type, const char *help)
{
        if (s->in_family && strcmp(s->family, name) == 0)
                return;
        family_end(s);
        s->in_family = true;
        snprintf(s->family, sizeof(s->family), "%s", name);
        if (s->json) {
                json_next(&s->families);
                json_begin(&s->family_obj, s->f, '{');
                /* Written raw: family names come from the tables here or passed name_ok, so
                 * they are [a-z0-9_] and need no JSON escaping. */
                json_key(&s->family_obj, "name");
                fprintf(s->f, "\"gpuipc_%s\"", name);
                json_kstr(&s->family_obj, "type", type_name(type));
                json_kstr(&s->family_obj, "help", help);
                json_key(&s->family_obj, "samples");
                json_begin(&s->samples, s->f, '[');
                return;
        }
        fprintf(s->f, "# HELP gpuipc_%s ", name);
        text_escaped(s->f, help, false);
        fprintf(s->f, "\n# TYPE gpuipc_%s %s\n", name, type_name(type));
}

/* One sample of the current family: its name's suffix ("", "_bucket", ...), labels, and value
 * (a decimal number). */
static void sample(Sink *s, const char *suffix, const char *const *keys, const char *const *values, int n_labels,
                   const char *value)
{
        if (s->json) {
                Json o, l;
                json_next(&s->samples);
                json_begin(&o, s->f, '{');
                json_key(&o, "name");
                fprintf(s->f, "\"gpuipc_%s%s\"", s->family, suffix);
                json_key(&o, "labels");
                json_begin(&l, s->f, '{');
                for (int i = 0; i < n_labels; i++)
                        json_kstr(&l, keys[i], values[i]);
                json_end(&l, '}');
                /* value is a decimal number we formatted, a valid JSON number as it is. */
                json_key(&o, "value");
                fputs(value, s->f);
                json_end(&o, '}');
                return;
        }
        fprintf(s->f, "gpuipc_%s%s", s->family, suffix);
        for (int i = 0; i < n_labels; i++) {
                fprintf(s->f, "%s%s=\"", i ? "," : "{", keys[i]);
                text_escaped(s->f, values[i], true);
                fputc('"', s->f);
        }
        fprintf(s->f, "%s %s\n", n_labels ? "}" : "", value);
}

/* An integer carrying `digits` decimal digits below the unit, exactly: 1500 with 3 -> "1.5". */
/* Integer arithmetic, not a division in double: 300000 µs is exactly "0.3", where 300000 / 1e6
 * printed with the 17 digits a double needs to round-trip is "0.29999999999999999". */
static void scaled(uint64_t v, unsigned digits, char *buf, size_t cap)
{
        uint64_t unit = 1;

        for (unsigned i = 0; i < digits; i++)
                unit *= 10;
        if (digits == 0 || v % unit == 0) {
                snprintf(buf, cap, "%" PRIu64, v / unit);
                return;
        }
        snprintf(buf, cap, "%" PRIu64 ".%0*" PRIu64, v / unit, (int)digits, v % unit);
        /* 0.000010 -> 0.00001: the way Prometheus's own clients write bounds. */
        /* The loop stops before the point: v % unit is not 0, so some digit after it is not 0. */
        for (size_t n = strlen(buf); buf[n - 1] == '0'; n--)
                buf[n - 1] = 0;
}

/* ---- records -> families ---- */

/* Marks what it finds as used, so the pass over records nobody described does not export it a
 * second time under its raw name. A linear scan: a stats reply holds about a hundred records. */
static const gpuipc_stat_t *find(const gpuipc_stat_t *stats, int n, bool *used, const char *name)
{
        for (int i = 0; i < n; i++) {
                if (strcmp(stats[i].name, name) == 0) {
                        used[i] = true;
                        return &stats[i];
                }
        }
        return NULL;
}

/* A histogram family from the broker's bucket records (bounds in microseconds, written in seconds)
 * and its _count and _sum records, each marked used so it is not exported again as undescribed. */
static void histogram(Sink *s, const MetricDesc *d, const gpuipc_stat_t *stats, int n, bool *used)
{
        static const char *const le[] = { "le" };
        char bucket[64], count_name[64], sum_name[64], bound[32], value[32];
        const gpuipc_stat_t *count, *sum;

        snprintf(bucket, sizeof(bucket), "%s_bucket", d->stat);
        snprintf(count_name, sizeof(count_name), "%s_count", d->stat);
        snprintf(sum_name, sizeof(sum_name), "%s_sum", d->stat);
        /* Without its count and sum the family would be malformed (Prometheus rejects a histogram
         * without them): left out, and its buckets are skipped as undescribed records are. */
        count = find(stats, n, used, count_name);
        sum = find(stats, n, used, sum_name);
        if (!count || !sum)
                return;
        family_begin(s, d->metric, HISTOGRAM, d->help);
        for (int i = 0; i < n; i++) {
                const char *bound_p = bound;
                if (strcmp(stats[i].name, bucket) != 0)
                        continue;
                used[i] = true;
                /* Bounds are always microseconds (le_us), whatever unit the sum has: 6, not
                 * d->digits. */
                scaled(stats[i].le_us, 6, bound, sizeof(bound));
                snprintf(value, sizeof(value), "%" PRIu64, stats[i].value);
                sample(s, "_bucket", le, &bound_p, 1, value);
        }
        /* The +Inf bucket is the count: the broker's buckets are cumulative and it sends no +Inf. */
        snprintf(value, sizeof(value), "%" PRIu64, count->value);
        sample(s, "_bucket", le, (const char *const[]){ "+Inf" }, 1, value);
        scaled(sum->value, d->digits, value, sizeof(value));
        sample(s, "_sum", NULL, NULL, 0, value);
        snprintf(value, sizeof(value), "%" PRIu64, count->value);
        sample(s, "_count", NULL, NULL, 0, value);
}

/* Entries of one family (a labelled family's fixed values) sit together in descs[], the first one
 * carrying HELP; a family has one HELP line, so the later ones leave theirs NULL. */
static const char *help_of(const MetricDesc *d)
{
        /* A family's later entries share the first one's HELP. */
        while (!d->help)
                d--;
        return d->help;
}

/* Exports the records a descs[] entry names, under its metric name, type and unit. A record may
 * match only one entry (used[]), which is what keeps a sample from appearing in two families. */
static void described(Sink *s, const MetricDesc *d, const gpuipc_stat_t *stats, int n, bool *used)
{
        char value[32];

        if (d->type == HISTOGRAM) {
                histogram(s, d, stats, n, used);
                return;
        }
        for (int i = 0; i < n; i++) {
                const char *label_value = d->label_value ? d->label_value : stats[i].status;

                /* Bucket records (le_us set) belong to histograms only. */
                if (used[i] || strcmp(stats[i].name, d->stat) != 0 || stats[i].le_us)
                        continue;
                /* A record with a status belongs to a labelled family only, and the reverse. */
                if ((d->label && !d->label_value) != (stats[i].status[0] != 0))
                        continue;
                used[i] = true;
                family_begin(s, d->metric, d->type, help_of(d));
                scaled(stats[i].value, d->digits, value, sizeof(value));
                sample(s, "", &d->label, &label_value, d->label ? 1 : 0, value);
        }
}

/* What a metric name from a newer broker may hold before it is exported as it is: lowercase
 * [a-z0-9_], a subset of Prometheus's metric name syntax; anything else is dropped rather than
 * rewritten, so no two records can end up under one name. */
static bool name_ok(const char *s)
{
        if (!*s)
                return false;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
                        return false;
        return true;
}

/* For an undescribed record's name: "_total" means a counter, "_us"/"_ms" a duration to scale. */
static bool ends_with(const char *s, const char *suffix)
{
        size_t n = strlen(s), m = strlen(suffix);
        return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* A record of a newer broker: exported under its own name (microseconds and milliseconds in
 * seconds), a counter if it ends in _total. Histogram buckets we do not know are left out. */
static void undescribed(Sink *s, const gpuipc_stat_t *st)
{
        static const char *const status_key[] = { "status" };
        char metric[GPUIPC_MAX_NAME + 16], help[GPUIPC_MAX_NAME + 96], value[32];
        const char *status = st->status;
        unsigned digits = 0;
        size_t len = strlen(st->name);

        /* The length bound leaves metric[] room for "_seconds" in place of "_us" or "_ms". */
        if (st->le_us || !name_ok(st->name) || len > GPUIPC_MAX_NAME)
                return;
        snprintf(metric, sizeof(metric), "%s", st->name);
        if (ends_with(metric, "_us") || ends_with(metric, "_ms")) {
                digits = ends_with(metric, "_us") ? 6 : 3;
                snprintf(metric + len - 3, sizeof(metric) - (len - 3), "_seconds");
        }
        snprintf(help, sizeof(help), "The broker's %s statistic (this gpuipcctl release does not describe it).",
                 st->name);
        family_begin(s, metric, ends_with(metric, "_total") ? COUNTER : GAUGE, help);
        scaled(st->value, digits, value, sizeof(value));
        sample(s, "", status_key, &status, status[0] ? 1 : 0, value);
}

/* ---- rings -> gpuipc_ring_*{ring} ---- */

typedef enum RingValue { RING_HEAD, RING_LAG, RING_TAKEN, RING_SLOTS } RingValue;

typedef struct RingDesc {
        const char *metric;
        RingValue value;
        MetricType type;
        const char *help;
} RingDesc;

static const RingDesc ring_descs[] = {
        { "ring_head", RING_HEAD, GAUGE, "The newest frame published in the ring, from its control page (no sample "
          "while the broker cannot read it)." },
        /* The same number as a counter: frames are numbered from 1, so the head is how many were
         * published; the gauge stays for what it says (which frame), the counter is what rate() takes. */
        { "ring_frames_published_total", RING_HEAD, COUNTER, "Frames the ring's producer published since the ring "
          "was created, from its control page (no sample while the broker cannot read it; a ring created again "
          "under the same name starts from 0, a counter reset)." },
        { "ring_lag_frames", RING_LAG, GAUGE,
          "Frames the ring's slowest seated member is behind its head (no sample with nobody seated). A backpressure "
          "ring's producer waits when this reaches gpuipc_ring_slots." },
        { "ring_seats_taken", RING_TAKEN, GAUGE, "Member seats of the ring taken: by members, or kept for one after a "
          "broker restart." },
        { "ring_slots", RING_SLOTS, GAUGE,
          "Slots of the ring: frames its producer may publish ahead of its slowest member (backpressure)." },
};

/* false for a value the broker could not read (head, lag): no sample is better than a 0 that
 * would read as "caught up" on a dashboard. */
static bool ring_value(const gpuipc_ring_info_t *g, RingValue v, uint64_t *ret)
{
        switch (v) {
        case RING_HEAD: *ret = g->head; return g->head_known;
        case RING_LAG: *ret = g->lag; return g->lag_known;
        case RING_TAKEN: *ret = g->taken; return true;
        case RING_SLOTS: *ret = g->slots; return true;
        }
        return false;
}

/* Family by family, each over every ring: the text format wants a family's samples together,
 * under one HELP and TYPE. */
static void rings(Sink *s, const gpuipc_ring_info_t *items, int n)
{
        static const char *const ring_key[] = { "ring" };

        for (size_t d = 0; d < sizeof(ring_descs) / sizeof(ring_descs[0]); d++) {
                for (int i = 0; i < n; i++) {
                        const char *name = items[i].name;
                        char value[32];
                        uint64_t v;

                        /* family_begin runs only for a sample, so a family with none (no rings, or
                         * no head known) prints no HELP or TYPE line either. */
                        if (!ring_value(&items[i], ring_descs[d].value, &v))
                                continue;
                        family_begin(s, ring_descs[d].metric, ring_descs[d].type, ring_descs[d].help);
                        snprintf(value, sizeof(value), "%" PRIu64, v);
                        sample(s, "", ring_key, &name, 1, value);
                }
        }
}

/* Every family, in a fixed order: up and build_info first (they go out even when the broker did not
 * answer), then the described records, then whatever a newer broker sent that we have no entry for,
 * then the rings. A stale sample is still exported, marked by its timestamp family. */
static void write_all(Sink *s, const MetricsInput *in)
{
        const gpuipc_stat_t *stats = in->stats;
        int n = in->n_stats;
        bool up = in->up;
        static const char *const build_keys[] = { "version", "library" };
        const char *build_values[] = { GPUIPC_VERSION, gpuipc_version() };
        /* Without memory for the marks only up and build_info go out: the scrape still says the
         * exporter is alive, and no family is exported twice. */
        bool *used = calloc(n > 0 ? (size_t)n : 1, sizeof(*used));

        family_begin(s, "up", GAUGE, "1 when the broker answered this scrape in time, else 0 (then any other "
                                     "gpuipc_ family is the last sample it gave, of gpuipc_sample_timestamp_seconds).");
        sample(s, "", NULL, NULL, 0, up ? "1" : "0");
        family_begin(s, "build_info", GAUGE, "Always 1; the labels name the release of gpuipcctl and of the "
                                             "libgpuipc it uses.");
        sample(s, "", build_keys, build_values, 2, "1");
        if ((up || in->stale) && in->sampled_at > 0) {
                char when[32];

                snprintf(when, sizeof(when), "%.3f", in->sampled_at);
                family_begin(s, "sample_timestamp_seconds", GAUGE, "When the broker sent the statistics below "
                                                                   "(Unix time, seconds).");
                sample(s, "", NULL, NULL, 0, when);
        }
        if ((up || in->stale) && used) {
                for (size_t i = 0; i < sizeof(descs) / sizeof(descs[0]); i++)
                        described(s, &descs[i], stats, n, used);
                /* "buffers" is the sum of the states, exported above. */
                find(stats, n, used, "buffers");
                for (int i = 0; i < n; i++)
                        if (!used[i])
                                undescribed(s, &stats[i]);
                rings(s, in->rings, in->n_rings);
        }
        family_end(s);
        free(used);
}

/* The two formats share write_all: the Sink decides per sample how it is written. */
void metrics_write_text(FILE *f, const MetricsInput *in)
{
        Sink s = { .f = f };

        write_all(&s, in);
}

/* --json: an array of families, each {name, type, help, samples: [{name, labels, value}]}, the text
 * format's content with nothing added or left out, for scripts that do not parse the text format. */
void metrics_write_json(FILE *f, const MetricsInput *in)
{
        Sink s = { .f = f, .json = true };

        json_begin(&s.families, f, '[');
        write_all(&s, in);
        json_end(&s.families, ']');
        fputc('\n', f);
}
