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

typedef struct InspectArgs {
        const char *prefix, *name;
        uint64_t id;
        bool ring;
} InspectArgs;

enum { TAKES_PREFIX = 1, TAKES_ID = 2, TAKES_NAME = 4, TAKES_RING = 8 };

/* The options of the read-only commands; `takes` says which this one accepts. CTL_CONTINUE, or
 * the exit code (after --help or a usage error). */
static int parse_args(Ctl *ctl, int argc, char **argv, unsigned takes, InspectArgs *a)
{
        static const struct option longopts[] = {
                { "prefix", required_argument, NULL, 'p' },
                { "id", required_argument, NULL, 'i' },
                { "ring", no_argument, NULL, 'r' },
                CTL_HELP_OPTION,
                {}
        };
        long v;
        int c;

        *a = (InspectArgs){ 0 };
        while ((c = getopt_long(argc, argv, ":p:i:rh", longopts, NULL)) >= 0) {
                switch (c) {
                case 'p':
                        if (!(takes & TAKES_PREFIX))
                                return ctl_usage(ctl, "takes no --prefix");
                        a->prefix = optarg;
                        break;
                case 'i':
                        if (!(takes & TAKES_ID))
                                return ctl_usage(ctl, "takes no --id");
                        if (ctl_parse_int(ctl, "--id", optarg, 1, INT64_MAX, &v))
                                return CTL_USAGE;
                        a->id = (uint64_t)v;
                        break;
                case 'r':
                        if (!(takes & TAKES_RING))
                                return ctl_usage(ctl, "takes no --ring");
                        a->ring = true;
                        break;
                case 'h':
                        return ctl_help(ctl);
                default:
                        return ctl_bad_option(ctl, argc, argv, c);
                }
        }
        if (optind < argc && !(takes & TAKES_NAME))
                return ctl_usage(ctl, "unexpected argument '%s'", argv[optind]);
        if (optind + 1 < argc)
                return ctl_usage(ctl, "one name only (got '%s' and '%s')", argv[optind], argv[optind + 1]);
        if (optind < argc)
                a->name = argv[optind];
        return CTL_CONTINUE;
}

/* ping also takes --timeout after the command, the way probes are usually written. */
int cmd_ping(Ctl *ctl, int argc, char **argv)
{
        static const struct option longopts[] = { { "timeout", required_argument, NULL, 't' }, CTL_HELP_OPTION, {} };
        uint64_t start;
        long v;
        int c, r;

        while ((c = getopt_long(argc, argv, ":t:h", longopts, NULL)) >= 0) {
                if (c == 'h')
                        return ctl_help(ctl);
                if (c != 't')
                        return ctl_bad_option(ctl, argc, argv, c);
                if (ctl_parse_int(ctl, "--timeout", optarg, 0, INT32_MAX, &v))
                        return CTL_USAGE;
                ctl->timeout_ms = (int)v;
        }
        if (optind < argc)
                return ctl_usage(ctl, "unexpected argument '%s'", argv[optind]);
        start = ctl_now_ms();
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = gpuipc_ping(ctl->c, ctl->timeout_ms);
        if (r < 0)
                return ctl_fail(ctl, "ping", r);
        if (ctl->json)
                printf("{\"ok\":true,\"ms\":%" PRIu64 "}\n", ctl_now_ms() - start);
        else
                printf("ok (%" PRIu64 " ms)\n", ctl_now_ms() - start);
        return CTL_OK;
}

/* ---- buffers ---- */

static void buffer_json(Json *o, const gpuipc_buffer_info_t *b)
{
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
        json_kstr(o, "device", b->device);
        json_kbool(o, "writable", b->writable);
        json_kbool(o, "broker_held", b->broker_held);
}

static void buffer_header(void)
{
        printf("%-6s %-32s %-6s %-11s %10s %-7s %5s %5s %6s\n", "ID", "NAME", "GEN", "KIND", "SIZE", "STATE", "REFS",
               "UID", "PID");
}

static void buffer_line(const gpuipc_buffer_info_t *b)
{
        char size[32];

        ctl_human_size(b->size, size, sizeof(size));
        printf("%-6" PRIu64 " ", b->buffer);
        text_cell(stdout, b->name, 32);
        printf(" %-6" PRIu64 " %-11s %10s %-7s %5" PRIu64 " %5" PRIu64 " %6" PRIu64 "%s%s\n", b->generation,
               gpuipc_kind_name(b->kind), size, gpuipc_state_name(b->state), b->refs, b->uid, b->pid,
               b->broker_held ? " held" : "", b->owner ? "" : " orphaned");
}

int cmd_ls(Ctl *ctl, int argc, char **argv)
{
        gpuipc_buffer_info_t *page = NULL;
        uint64_t cursor = 0;
        bool started = false;
        InspectArgs a;
        Json j;
        int r = parse_args(ctl, argc, argv, TAKES_PREFIX, &a);

        if (r != CTL_CONTINUE)
                return r;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        page = calloc(PAGE, sizeof(*page));
        if (!page)
                return ctl_fail(ctl, "ls", -ENOMEM);
        /* The first page comes before any output: a refusal is then an error document of its own. */
        do {
                int n = gpuipc_list_buffers(ctl->c, a.prefix, &cursor, page, PAGE);

                if (n < 0) {
                        r = ctl_fail(ctl, "ls", n);
                        break;
                }
                if (!started) {
                        if (ctl->json)
                                json_begin(&j, stdout, '[');
                        else
                                buffer_header();
                        started = ctl->printed = true;
                }
                for (int i = 0; i < n; i++) {
                        if (ctl->json) {
                                Json o;
                                json_next(&j);
                                json_begin(&o, stdout, '{');
                                buffer_json(&o, &page[i]);
                                json_end(&o, '}');
                        } else {
                                buffer_line(&page[i]);
                        }
                }
        } while (cursor);
        if (ctl->json && started) {
                json_end(&j, ']');
                putchar('\n');
        }
        free(page);
        /* --json keeps its one document, the buffers' array: `rings --json` lists the rings. */
        if (r == CTL_OK && !ctl->json) {
                int e = ctl_ls_rings(ctl, a.prefix);
                if (e < 0)
                        r = ctl_fail(ctl, "ls (rings)", e);
        }
        return r;
}

int cmd_stat(Ctl *ctl, int argc, char **argv)
{
        gpuipc_holder_info_t *holders;
        gpuipc_buffer_info_t b;
        char what[GPUIPC_MAX_NAME + 32], detail[GPUIPC_MAX_NAME + 64];
        InspectArgs a;
        int n, r = parse_args(ctl, argc, argv, TAKES_ID | TAKES_NAME | TAKES_RING, &a);

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
        if (ctl->json) {
                Json j, o, h;

                json_begin(&j, stdout, '{');
                json_key(&j, "buffer");
                json_begin(&o, stdout, '{');
                buffer_json(&o, &b);
                json_end(&o, '}');
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
        } else {
                buffer_header();
                buffer_line(&b);
                printf("holders: %" PRIu64 "%s\n", b.holders,
                       (uint64_t)n < b.holders ? " (the broker listed only the first ones)" : "");
                for (int i = 0; i < n; i++)
                        printf("  peer %-6" PRIu64 " pid %-8" PRIu64 " uid %-6" PRIu64 " refs %" PRIu64 "\n",
                               holders[i].peer, holders[i].pid, holders[i].uid, holders[i].refs);
        }
        free(holders);
        return CTL_OK;
}

/* ---- peers ---- */

static void peer_json(Json *o, const gpuipc_peer_info_t *p)
{
        Json g;

        json_ku64(o, "peer", p->peer);
        json_ku64(o, "pid", p->pid);
        json_ku64(o, "uid", p->uid);
        json_ku64(o, "gid", p->gid);
        json_ku64(o, "pidns", p->pidns);
        json_key(o, "pidns_declared");
        json_bool(o, p->pidns_declared);
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

static void peer_line(const gpuipc_peer_info_t *p)
{
        char pidns[24];

        /* A namespace the broker has only the peer's word for is marked, as it proves nothing. */
        snprintf(pidns, sizeof(pidns), "%" PRIu64 "%s", p->pidns, p->pidns_declared ? "?" : "");
        printf("%-6" PRIu64 " %-8" PRIu64 " %-6" PRIu64 " %-6" PRIu64 " %-12s ", p->peer, p->pid, p->uid, p->gid,
               pidns);
        text_cell(stdout, p->label, 20);
        printf(" %7" PRIu64 " %5" PRIu64 " %4" PRIu64 " %5" PRIu64 " %u\n", p->buffers, p->refs, p->subs, p->waits,
               p->n_gpus);
}

int cmd_peers(Ctl *ctl, int argc, char **argv)
{
        gpuipc_peer_info_t *page;
        uint64_t cursor = 0;
        bool started = false;
        InspectArgs a;
        Json j;
        int r = parse_args(ctl, argc, argv, 0, &a);

        if (r != CTL_CONTINUE)
                return r;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        page = calloc(PAGE, sizeof(*page));
        if (!page)
                return ctl_fail(ctl, "peers", -ENOMEM);
        do {
                int n = gpuipc_list_peers(ctl->c, &cursor, page, PAGE);

                if (n < 0) {
                        r = ctl_fail(ctl, "peers", n);
                        break;
                }
                if (!started) {
                        if (ctl->json)
                                json_begin(&j, stdout, '[');
                        else
                                printf("%-6s %-8s %-6s %-6s %-12s %-20s %7s %5s %4s %5s %s\n", "PEER", "PID", "UID",
                                       "GID", "PIDNS", "LABEL", "BUFFERS", "REFS", "SUBS", "WAITS", "GPUS");
                        started = ctl->printed = true;
                }
                for (int i = 0; i < n; i++) {
                        if (ctl->json) {
                                Json o;
                                json_next(&j);
                                json_begin(&o, stdout, '{');
                                peer_json(&o, &page[i]);
                                json_end(&o, '}');
                        } else {
                                peer_line(&page[i]);
                        }
                }
        } while (cursor);
        if (ctl->json && started) {
                json_end(&j, ']');
                putchar('\n');
        }
        free(page);
        return r;
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

int cmd_stats(Ctl *ctl, int argc, char **argv)
{
        gpuipc_stat_t *items;
        InspectArgs a;
        char q[64];
        int n, r = parse_args(ctl, argc, argv, 0, &a);

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
        n = n > GPUIPC_MAX_PAGE ? GPUIPC_MAX_PAGE : n;
        if (ctl->json) {
                stats_json(items, n);
        } else {
                for (int i = 0; i < n; i++) {
                        stat_qualifier(&items[i], q, sizeof(q));
                        printf("%-28s %-10s %" PRIu64 "\n", items[i].name, q, items[i].value);
                }
        }
        free(items);
        return CTL_OK;
}

/* ---- watch ---- */

int cmd_watch(Ctl *ctl, int argc, char **argv)
{
        gpuipc_event_t ev;
        InspectArgs a;
        int r = parse_args(ctl, argc, argv, TAKES_PREFIX, &a);

        if (r != CTL_CONTINUE)
                return r;
        ctl->reconnect = true; /* watching goes on through a broker restart ("reconnected") */
        r = ctl_connect(ctl, false);
        if (r)
                return r;
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
                        json_kstr(&o, "event", gpuipc_event_name(ev.type));
                        json_ku64(&o, "buffer", ev.buffer);
                        json_ku64(&o, "generation", ev.generation);
                        json_kstr(&o, "name", ev.name);
                        json_kstr(&o, "reason", ev.reason);
                        json_end(&o, '}');
                        putchar('\n');
                } else {
                        printf("%-9s ", gpuipc_event_name(ev.type));
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
