/* Read-only subcommands: ping, ls, stat, peers, stats and watch (rings: cmd-rings.c). Each prints a
 * table for people or, with --json, exactly one JSON document (watch: one per event and line).
 *
 * What they must never do: change anything in the broker, or print another peer's text (names,
 * labels, reasons) raw: it goes through text.c or json.c, since any peer chooses its own. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "json.h"
#include "text.h"

/* Records asked for per listing request: the broker's own default page, big enough that a typical
 * listing is one round trip, small enough that a reply never nears the frame limit. */
#define PAGE 256

#ifndef MAX
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#endif

typedef struct InspectArgs {
        const char *prefix, *name;
        uint64_t id;
        bool ring;
} InspectArgs;

/* The options of the read-only commands (their tables say which each accepts). CTL_CONTINUE, or the
 * exit code (after --help or a usage error). */
static int parse_args(Ctl *ctl, int argc, char **argv, InspectArgs *a)
{
        long v;
        int c, r;

        *a = (InspectArgs){ 0 };
        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                switch (c) {
                case 'p': a->prefix = optarg; break;
                case 'i':
                        if (ctl_parse_int(ctl, "--id", optarg, 1, INT64_MAX, &v))
                                return CTL_USAGE;
                        a->id = (uint64_t)v;
                        break;
                case 'r': a->ring = true; break;
                }
        }
        if (c < 0)
                return r;
        return ctl_operand(ctl, argc, argv, false, &a->name);
}

/* ping also takes --timeout after the command, the way probes are usually written. */
int cmd_ping(Ctl *ctl, int argc, char **argv)
{
        const char *none = NULL;
        uint64_t start;
        long v;
        int c, r;

        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0) {
                if (ctl_parse_int(ctl, "--timeout", optarg, 0, INT32_MAX, &v))
                        return CTL_USAGE;
                ctl->timeout_ms = (int)v;
                ctl->timeout_given = true;
        }
        if (c < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, false, &none)) != CTL_CONTINUE)
                return r;
        /* Timed from before the connect: a probe wants to know how long reaching the broker took,
         * hello included, not the round trip of an open connection alone. */
        start = monotonic_ms();
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        /* --timeout bounds the connect and, again, the answer: a broker that accepts but never
         * answers fails the probe too. */
        r = gpuipc_ping(ctl->c, ctl->timeout_ms);
        if (r < 0)
                return ctl_fail(ctl, "ping", r);
        if (ctl->json)
                printf("{\"ok\":true,\"ms\":%" PRIu64 "}\n", monotonic_ms() - start);
        else
                printf("ok (%" PRIu64 " ms)\n", monotonic_ms() - start);
        return CTL_OK;
}

/* ---- buffers ---- */

/* A buffer's JSON object: every field the broker lists, under the protocol's names, so that a
 * script reading `ls --json` needs no second vocabulary. Used by ls and, inside its document, stat. */
static void buffer_json(Json *o, const void *record)
{
        const gpuipc_buffer_info_t *b = record;

        json_ku64(o, "buffer", b->buffer);
        json_kstr(o, "name", b->name);
        json_ku64(o, "generation", b->generation);
        json_kstr(o, "kind", gpuipc_kind_name(b->kind));
        json_ku64(o, "size", b->size);
        json_kstr(o, "state", gpuipc_state_name(b->state));
        json_ku64(o, "refs", b->refs);
        json_ku64(o, "holders", b->holders);
        json_ku64(o, "owner", b->owner);
        json_ku64(o, "uid", b->uid);
        json_ku64(o, "pid", b->pid);
        json_kstr_or_null(o, "device", b->device);
        json_kbool(o, "writable", b->writable);
        json_kbool(o, "broker_held", b->broker_held);
}

/* The last, headerless column says "held" / "orphaned": usually empty, so table_print leaves it
 * out of most rows (trailing empty cells print nothing). */
static const char *const buffer_headers[] = { "ID", "NAME", "GEN", "KIND", "SIZE", "STATE", "REFS", "UID", "PID", "" };
#define BUFFER_ALIGN "rllllrrrrl"

/* The table keeps what a person compares at a glance; owner, holders, device and writable are in
 * the JSON and in stat. */
static void buffer_row(Table *t, const void *record)
{
        const gpuipc_buffer_info_t *b = record;
        char size[32];

        ctl_human_size(b->size, size, sizeof(size));
        table_cell(t, "%" PRIu64, b->buffer);
        table_cell(t, "%s", b->name);
        table_cell(t, "%" PRIu64, b->generation);
        table_cell(t, "%s", gpuipc_kind_name(b->kind));
        table_cell(t, "%s", size);
        table_cell(t, "%s", gpuipc_state_name(b->state));
        table_cell(t, "%" PRIu64, b->refs);
        table_cell(t, "%" PRIu64, b->uid);
        table_cell(t, "%" PRIu64, b->pid);
        table_cell(t, "%s%s", b->broker_held ? "held" : "", b->owner ? "" : b->broker_held ? " orphaned" : "orphaned");
}

static int fetch_buffers(Ctl *ctl, const char *prefix, uint64_t *cursor, void *page, int cap)
{
        return gpuipc_list_buffers(ctl->c, prefix, cursor, page, cap);
}

static const CtlListing buffers_listing = {
        sizeof(gpuipc_buffer_info_t), PAGE, fetch_buffers, buffer_json, buffer_headers, BUFFER_ALIGN, buffer_row,
};

/* ls: buffers, then (text only) rings, under one prefix. The GPUs are not probed at connect
 * (nothing here needs CUDA), which keeps ls fast on a host whose driver is slow to load. */
int cmd_ls(Ctl *ctl, int argc, char **argv)
{
        InspectArgs a;
        int r = parse_args(ctl, argc, argv, &a);

        if (r != CTL_CONTINUE)
                return r;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = ctl_list(ctl, &buffers_listing, a.prefix, false);
        if (r < 0)
                return ctl_fail(ctl, "ls", r);
        /* --json keeps its one document, the buffers' array: `rings --json` lists the rings. */
        if (!ctl->json) {
                r = ctl_ls_rings(ctl, a.prefix);
                if (r < 0)
                        return ctl_fail(ctl, "ls (rings)", r);
        }
        return CTL_OK;
}

/* stat --json: {"buffer": {... as in ls ...}, "holders": [...]}, one document. */
static void holders_json(const gpuipc_buffer_info_t *b, const gpuipc_holder_info_t *holders, int n)
{
        Json j, o, h;

        json_begin(&j, stdout, '{');
        json_key(&j, "buffer");
        json_begin(&o, stdout, '{');
        buffer_json(&o, b);
        json_end(&o, '}');
        /* One page of holders: the buffer's "holders" is the broker's count, so a script can tell
         * when the list was cut, as the text says. */
        json_key(&j, "holders");
        json_begin(&h, stdout, '[');
        for (int i = 0; i < n; i++) {
                json_next(&h);
                json_begin(&o, stdout, '{');
                json_ku64(&o, "peer", holders[i].peer);
                json_ku64(&o, "pid", holders[i].pid);
                json_ku64(&o, "uid", holders[i].uid);
                json_ku64(&o, "refs", holders[i].refs);
                json_end(&o, '}');
        }
        json_end(&h, ']');
        json_end(&j, '}');
        putchar('\n');
}

/* The buffer as ls shows it, then its holders: the same columns as ls, so a line of stat can be
 * compared with a line of ls by eye. */
static int holders_text(const gpuipc_buffer_info_t *b, const gpuipc_holder_info_t *holders, int n)
{
        static const char *const headers[] = { "PEER", "PID", "UID", "REFS" };
        Table *buffer = table_new(buffer_headers, BUFFER_ALIGN), *held = table_new(headers, "rrrr");
        int r = -ENOMEM;

        if (buffer && held) {
                buffer_row(buffer, b);
                for (int i = 0; i < n; i++) {
                        table_cell(held, "%" PRIu64, holders[i].peer);
                        table_cell(held, "%" PRIu64, holders[i].pid);
                        table_cell(held, "%" PRIu64, holders[i].uid);
                        table_cell(held, "%" PRIu64, holders[i].refs);
                }
                r = table_print(buffer, stdout);
                if (r == 0) {
                        /* b->holders is the broker's count, n what fit in one page: saying so
                         * keeps a long list from passing for a complete one. */
                        printf("\nholders: %" PRIu64 "%s\n", b->holders,
                               (uint64_t)n < b->holders ? " (the broker listed only the first ones)" : "");
                        if (n > 0)
                                r = table_print(held, stdout);
                }
        }
        table_free(buffer);
        table_free(held);
        return r;
}

/* stat NAME | --id N | --ring NAME: one buffer and its holders (one page of them: the broker's
 * count says when there are more), or a ring. */
int cmd_stat(Ctl *ctl, int argc, char **argv)
{
        gpuipc_holder_info_t *holders;
        gpuipc_buffer_info_t b;
        char what[GPUIPC_MAX_NAME + 32], detail[GPUIPC_MAX_NAME + 64];
        InspectArgs a;
        int n, r = parse_args(ctl, argc, argv, &a);

        if (r != CTL_CONTINUE)
                return r;
        if (!a.name == !a.id)
                return ctl_usage(ctl, "give a NAME or --id N (one of them)");
        if (a.ring && !a.name)
                return ctl_usage(ctl, "--ring takes the ring's NAME, not --id");
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        if (a.name)
                snprintf(what, sizeof(what), "stat '%s'", a.name);
        else
                snprintf(what, sizeof(what), "stat --id %" PRIu64, a.id);
        if (a.ring) {
                n = ctl_stat_ring(ctl, a.name);
                return n < 0 ? ctl_fail(ctl, what, n) : CTL_OK;
        }
        holders = calloc(GPUIPC_MAX_PAGE, sizeof(*holders));
        if (!holders)
                return ctl_fail(ctl, "stat", -ENOMEM);
        n = gpuipc_stat_buffer(ctl->c, a.name, a.id, holders, GPUIPC_MAX_PAGE, &b);
        if (n < 0) {
                free(holders);
                /* Rings have names of their own: a NAME no live buffer has may be a ring's. */
                if (n == GPUIPC_E_NOT_FOUND && a.name) {
                        int e = ctl_stat_ring(ctl, a.name);
                        if (e == 0)
                                return CTL_OK;
                        /* unknown-op: a broker from before ring listings, which has no rings. */
                        if (e != GPUIPC_E_NOT_FOUND && e != GPUIPC_E_UNKNOWN_OP)
                                return ctl_fail(ctl, what, e);
                        snprintf(detail, sizeof(detail), "no live buffer and no ring is named '%s'", a.name);
                        return ctl_fail_detail(ctl, what, n, detail);
                }
                return ctl_fail(ctl, what, n);
        }
        r = 0;
        if (ctl->json)
                holders_json(&b, holders, n);
        else
                r = holders_text(&b, holders, n);
        free(holders);
        return r < 0 ? ctl_fail(ctl, what, r) : CTL_OK;
}

/* ---- peers ---- */

/* A peer's JSON object; gpus is an array even when empty, so a script need not test for it. */
static void peer_json(Json *o, const void *record)
{
        const gpuipc_peer_info_t *p = record;
        Json g;

        json_ku64(o, "peer", p->peer);
        json_ku64(o, "pid", p->pid);
        json_ku64(o, "uid", p->uid);
        json_ku64(o, "gid", p->gid);
        json_ku64(o, "pidns", p->pidns);
        json_key(o, "pidns_declared");
        json_bool(o, p->pidns_declared);
        json_ku64(o, "self_pid", p->self_pid);
        json_ku64(o, "shm_dev", p->shm_dev);
        json_ku64(o, "shm_ino", p->shm_ino);
        json_kstr(o, "label", p->label);
        json_ku64(o, "buffers", p->buffers);
        json_ku64(o, "refs", p->refs);
        json_ku64(o, "subs", p->subs);
        json_ku64(o, "waits", p->waits);
        json_ku64(o, "started_ms", p->started_ms);
        json_key(o, "gpus");
        json_begin(&g, o->f, '[');
        for (unsigned i = 0; i < p->n_gpus; i++) {
                json_next(&g);
                json_cstr(&g, p->gpus[i]);
        }
        json_end(&g, ']');
}

static const char *const peer_headers[] = { "PEER", "PID", "SELF-PID", "UID", "GID", "PIDNS", "LABEL", "BUFFERS",
                                            "REFS", "SUBS", "WAITS", "GPUS" };

static void peer_row(Table *t, const void *record)
{
        const gpuipc_peer_info_t *p = record;

        table_cell(t, "%" PRIu64, p->peer);
        table_cell(t, "%" PRIu64, p->pid);
        /* Its PID as it sees itself (cuda-legacy peers' must differ); "-": not known. */
        if (p->self_pid)
                table_cell(t, "%" PRIu64, p->self_pid);
        else
                table_cell(t, "-");
        table_cell(t, "%" PRIu64, p->uid);
        table_cell(t, "%" PRIu64, p->gid);
        /* A namespace the broker has only the peer's word for is marked, as it proves nothing. */
        table_cell(t, "%" PRIu64 "%s", p->pidns, p->pidns_declared ? "?" : "");
        table_cell(t, "%s", p->label);
        table_cell(t, "%" PRIu64, p->buffers);
        table_cell(t, "%" PRIu64, p->refs);
        table_cell(t, "%" PRIu64, p->subs);
        table_cell(t, "%" PRIu64, p->waits);
        table_cell(t, "%u", p->n_gpus);
}

/* Peers have no names, so no prefix: the broker lists every connection the policy lets this one
 * see. */
static int fetch_peers(Ctl *ctl, const char *prefix, uint64_t *cursor, void *page, int cap)
{
        (void)prefix;
        return gpuipc_list_peers(ctl->c, cursor, page, cap);
}

static const CtlListing peers_listing = {
        sizeof(gpuipc_peer_info_t), PAGE, fetch_peers, peer_json, peer_headers, "rrrrrllrrrrr", peer_row,
};

/* peers: every connection the policy shows this one (gpuipcctl's own included). */
int cmd_peers(Ctl *ctl, int argc, char **argv)
{
        InspectArgs a;
        int r = parse_args(ctl, argc, argv, &a);

        if (r != CTL_CONTINUE)
                return r;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = ctl_list(ctl, &peers_listing, NULL, false);
        return r < 0 ? ctl_fail(ctl, "peers", r) : CTL_OK;
}

/* ---- stats ---- */

/* A record's qualifier: the status it counts or the bucket's bound, as text ("" for none). */
static void stat_qualifier(const gpuipc_stat_t *s, char *buf, size_t cap)
{
        if (s->status[0])
                snprintf(buf, cap, "%s", s->status);
        else if (s->le_us)
                snprintf(buf, cap, "%" PRIu64, s->le_us);
        else
                buf[0] = 0;
}

/* One object: plain records are "name": value; a series of records under one name (errors by
 * status, histogram buckets) is "name": {"quota": 3, ...} or {"100": 42, ...} (bounds in µs). */
static void stats_json(const gpuipc_stat_t *items, int n)
{
        Json j, sub;
        char q[64];

        json_begin(&j, stdout, '{');
        for (int i = 0; i < n; i++) {
                stat_qualifier(&items[i], q, sizeof(q));
                if (!q[0]) {
                        json_ku64(&j, items[i].name, items[i].value);
                        continue;
                }
                /* The broker sends a series' records next to each other (inspect.c), so a
                 * change of name opens and closes its object; a key never appears twice. */
                if (i == 0 || strcmp(items[i - 1].name, items[i].name) != 0) {
                        json_key(&j, items[i].name);
                        json_begin(&sub, stdout, '{');
                }
                json_ku64(&sub, q, items[i].value);
                if (i + 1 == n || strcmp(items[i + 1].name, items[i].name) != 0)
                        json_end(&sub, '}');
        }
        json_end(&j, '}');
        putchar('\n');
}

/* stats: the broker's counters in one request, into one page of GPUIPC_MAX_PAGE records (any beyond
 * are left out), as name, qualifier and value. The text keeps one record a line, so
 * grep and awk work on it; the JSON nests series under their name. */
int cmd_stats(Ctl *ctl, int argc, char **argv)
{
        gpuipc_stat_t *items;
        InspectArgs a;
        char q[64];
        int n, r = parse_args(ctl, argc, argv, &a);

        if (r != CTL_CONTINUE)
                return r;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        items = calloc(GPUIPC_MAX_PAGE, sizeof(*items));
        if (!items)
                return ctl_fail(ctl, "stats", -ENOMEM);
        n = gpuipc_stats(ctl->c, items, GPUIPC_MAX_PAGE);
        if (n < 0) {
                free(items);
                return ctl_fail(ctl, "stats", n);
        }
        /* gpuipc_stats returns how many the broker sent, which may be more than it stored. */
        n = n > GPUIPC_MAX_PAGE ? GPUIPC_MAX_PAGE : n;
        if (ctl->json) {
                stats_json(items, n);
        } else {
                int name_width = 0, q_width = 0;

                /* Columns as wide as the longest name and qualifier. */
                for (int i = 0; i < n; i++) {
                        stat_qualifier(&items[i], q, sizeof(q));
                        name_width = MAX(name_width, (int)strlen(items[i].name));
                        q_width = MAX(q_width, (int)strlen(q));
                }
                for (int i = 0; i < n; i++) {
                        stat_qualifier(&items[i], q, sizeof(q));
                        /* Raw: statistic names and statuses are the broker's own ASCII words, not
                         * text a peer chose. */
                        printf("%-*s %-*s %" PRIu64 "\n", name_width, items[i].name, q_width, q, items[i].value);
                }
        }
        free(items);
        return CTL_OK;
}

/* ---- watch ---- */

/* watch: every event under a prefix until interrupted, one line (or JSON document) each, flushed
 * as it comes so a pipe sees it at once. It only ends on an error, which is its last line. */
int cmd_watch(Ctl *ctl, int argc, char **argv)
{
        gpuipc_event_t ev;
        InspectArgs a;
        int r = parse_args(ctl, argc, argv, &a);

        if (r != CTL_CONTINUE)
                return r;
        ctl->reconnect = true; /* watching goes on through a broker restart ("reconnected") */
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        /* Subscribed before the first event is read: what is published from now on is seen, and
         * nothing before it (watch shows changes; ls shows state). */
        r = gpuipc_subscribe(ctl->c, a.prefix ? a.prefix : "", NULL);
        if (r < 0)
                return ctl_fail(ctl, "subscribe", r);
        for (;;) {
                r = gpuipc_next_event(ctl->c, -1, &ev);
                if (r < 0) {
                        ctl->printed = false; /* a stream: the error is the last line */
                        return ctl_fail(ctl, "watch", r);
                }
                if (ctl->json) {
                        Json o;
                        json_begin(&o, stdout, '{');
                        /* The same five keys on every line (reason "" when there is none): a
                         * script indexes them without testing which are present. */
                        json_kstr(&o, "event", gpuipc_event_name(ev.type));
                        json_ku64(&o, "buffer", ev.buffer);
                        json_ku64(&o, "generation", ev.generation);
                        json_kstr(&o, "name", ev.name);
                        json_kstr(&o, "reason", ev.reason);
                        json_end(&o, '}');
                        putchar('\n');
                } else {
                        printf("%-9s ", gpuipc_event_name(ev.type));
                        /* A fixed column of 32, not a table: lines go out one by one as events
                         * come, so widths cannot be measured first. */
                        text_cell(stdout, ev.name, 32);
                        printf(" buffer=%" PRIu64 " generation=%" PRIu64, ev.buffer, ev.generation);
                        if (ev.reason[0]) {
                                fputs(" reason=", stdout);
                                text_safe(stdout, ev.reason);
                        }
                        putchar('\n');
                }
                fflush(stdout); /* one line per event as it happens, also into a pipe */
        }
}
