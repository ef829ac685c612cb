/* Read-only subcommands: ping, ls, stat, peers, stats, metrics, and watch. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "json.h"

/* Options shared by the listing commands. */
static int parse_common(int argc, char **argv, const char **prefix, uint64_t *id, const char **name)
{
        static const struct option longopts[] = {
                { "prefix", required_argument, NULL, 'p' },
                { "id", required_argument, NULL, 'i' },
                {}
        };
        long v;
        int c;

        while ((c = getopt_long(argc, argv, "p:i:", longopts, NULL)) >= 0) {
                switch (c) {
                case 'p':
                        if (!prefix)
                                return -EINVAL;
                        *prefix = optarg;
                        break;
                case 'i':
                        if (!id || ctl_parse_int(optarg, 1, INT64_MAX, &v) < 0)
                                return -EINVAL;
                        *id = (uint64_t)v;
                        break;
                default:
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                if (!name || optind + 1 < argc)
                        return -EINVAL;
                *name = argv[optind];
        }
        return 0;
}

static int request(Ctl *ctl, ProtoMsg *req, Frame *f)
{
        int r = ctl_connect(ctl, false);

        if (r)
                return r;
        proto_set(req, PF_OP);
        r = client_request(ctl->c, req, -1, ctl->timeout_ms, f);
        if (r < 0)
                return ctl_fail(ctl, proto_op_name(req->op), r);
        return 0;
}

/* ping also takes --timeout after the command, the way probes are usually written. */
int cmd_ping(Ctl *ctl, int argc, char **argv)
{
        static const struct option longopts[] = { { "timeout", required_argument, NULL, 't' }, {} };
        uint64_t start;
        long v;
        int c, r;

        while ((c = getopt_long(argc, argv, "t:", longopts, NULL)) >= 0) {
                if (c != 't' || ctl_parse_int(optarg, 0, INT32_MAX, &v) < 0) {
                        fprintf(stderr, "usage: gpuipcctl ping [--timeout MS]\n");
                        return CTL_USAGE;
                }
                ctl->timeout_ms = (int)v;
        }
        start = client_now_ms();
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = gpuipc_ping(ctl->c, ctl->timeout_ms);
        if (r < 0)
                return ctl_fail(ctl, "ping", r);
        if (ctl->json)
                printf("{\"ok\":true,\"ms\":%" PRIu64 "}\n", client_now_ms() - start);
        else
                printf("ok (%" PRIu64 " ms)\n", client_now_ms() - start);
        return CTL_OK;
}

/* ---- records ---- */

/* Prints peer-chosen text (a label) into a table column of at least width characters: printable
 * ASCII as it is, every other byte as \xNN and a backslash as \\, so that no label can start a
 * new row, move the cursor or send the terminal an escape sequence. --json shows the text itself. */
static void print_text_cell(const char *s, size_t len, int width)
{
        int shown = 0;

        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)s[i];

                if (c == '\\')
                        shown += printf("\\\\");
                else if (c >= 0x20 && c < 0x7f)
                        shown += printf("%c", c);
                else
                        shown += printf("\\x%02x", c);
        }
        printf("%*s", width > shown ? width - shown : 0, "");
}

static void json_pstr(Json *j, const char *key, ProtoStr s)
{
        json_key(j, key);
        json_str(j, s.ptr ? s.ptr : "", s.len);
}

static void json_num(Json *j, const char *key, uint64_t v)
{
        json_key(j, key);
        json_u64(j, v);
}

static void buffer_json(Json *j, const ProtoMsg *m)
{
        Json o;

        json_next(j);
        json_begin(&o, j->f, '{');
        json_num(&o, "buffer", m->buffer);
        json_pstr(&o, "name", m->name);
        json_num(&o, "generation", m->generation);
        json_key(&o, "kind");
        json_str(&o, proto_kind_name(m->kind), strlen(proto_kind_name(m->kind)));
        json_num(&o, "size", m->size);
        json_key(&o, "state");
        json_str(&o, proto_state_name(m->state), strlen(proto_state_name(m->state)));
        json_num(&o, "refs", m->refs);
        json_num(&o, "holders", m->holders);
        json_num(&o, "owner", m->owner);
        json_num(&o, "uid", m->uid);
        json_num(&o, "pid", m->pid);
        json_pstr(&o, "device", m->device);
        json_key(&o, "writable");
        json_bool(&o, m->writable);
        json_key(&o, "broker_held");
        json_bool(&o, m->broker_held);
        json_end(&o, '}');
}

static void human_size(uint64_t n, char *buf, size_t cap)
{
        static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
        unsigned u = 0;
        double v = (double)n;

        while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
                v /= 1024;
                u++;
        }
        snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static void buffer_line(const ProtoMsg *m)
{
        char size[32];

        human_size(m->size, size, sizeof(size));
        printf("%-6" PRIu64 " %-32.*s %-6" PRIu64 " %-11s %10s %-7s %5" PRIu64 " %5" PRIu64 " %6" PRIu64 "%s%s\n",
               m->buffer, (int)m->name.len, m->name.ptr, m->generation, proto_kind_name(m->kind), size,
               proto_state_name(m->state), m->refs, m->uid, m->pid, m->broker_held ? " held" : "",
               m->owner ? "" : " orphaned");
}

/* Pages through a listing, calling fn for each record. */
static int for_each_record(Ctl *ctl, ProtoOp op, const char *prefix, void (*fn)(const ProtoMsg *, void *), void *ud)
{
        uint64_t after = 0;

        for (;;) {
                ProtoMsg req = { .op = op, .after = after, .has = PROTO_BIT(PF_AFTER) };
                Frame f = { .fd = -1 };
                ProtoIter it;
                ProtoMsg rec;
                bool more;
                int r;

                if (prefix) {
                        req.prefix = proto_str(prefix);
                        proto_set(&req, PF_PREFIX);
                }
                r = request(ctl, &req, &f);
                if (r)
                        return r;
                proto_iter_init(&it, &f.msg.items);
                while ((r = proto_iter_next(&it, &rec)) == 1)
                        fn(&rec, ud);
                more = f.msg.more;
                after = f.msg.after;
                frame_free(&f);
                if (r < 0) {
                        fprintf(stderr, "gpuipcctl: the broker's listing is malformed\n");
                        return CTL_FAILED;
                }
                if (!more)
                        return 0;
        }
}

static void ls_json_cb(const ProtoMsg *m, void *ud)
{
        buffer_json(ud, m);
}

static void ls_line_cb(const ProtoMsg *m, void *ud)
{
        (void)ud;
        buffer_line(m);
}

int cmd_ls(Ctl *ctl, int argc, char **argv)
{
        const char *prefix = NULL;
        Json j;
        int r;

        if (parse_common(argc, argv, &prefix, NULL, NULL) < 0) {
                fprintf(stderr, "usage: gpuipcctl ls [--prefix P]\n");
                return CTL_USAGE;
        }
        if (ctl->json) {
                json_begin(&j, stdout, '[');
                r = for_each_record(ctl, PROTO_OP_LIST, prefix, ls_json_cb, &j);
                json_end(&j, ']');
                putchar('\n');
                return r;
        }
        printf("%-6s %-32s %-6s %-11s %10s %-7s %5s %5s %6s\n", "ID", "NAME", "GEN", "KIND", "SIZE", "STATE", "REFS",
               "UID", "PID");
        return for_each_record(ctl, PROTO_OP_LIST, prefix, ls_line_cb, NULL);
}

int cmd_stat(Ctl *ctl, int argc, char **argv)
{
        ProtoMsg req = { .op = PROTO_OP_STAT }, rec;
        const char *name = NULL;
        Frame f = { .fd = -1 };
        uint64_t id = 0;
        ProtoIter it;
        Json j, h;
        int r;

        if (parse_common(argc, argv, NULL, &id, &name) < 0 || (!name == !id)) {
                fprintf(stderr, "usage: gpuipcctl stat NAME | --id N\n");
                return CTL_USAGE;
        }
        if (name) {
                req.name = proto_str(name);
                proto_set(&req, PF_NAME);
        } else {
                req.buffer = id;
                proto_set(&req, PF_BUFFER);
        }
        r = request(ctl, &req, &f);
        if (r)
                return r;
        if (ctl->json) {
                json_begin(&j, stdout, '[');
                buffer_json(&j, &f.msg);
                json_end(&j, ']');
                printf("\n");
                json_begin(&h, stdout, '[');
        } else {
                buffer_line(&f.msg);
                printf("holders:\n");
        }
        proto_iter_init(&it, &f.msg.items);
        while (proto_iter_next(&it, &rec) == 1) {
                if (ctl->json) {
                        Json o;
                        json_next(&h);
                        json_begin(&o, stdout, '{');
                        json_num(&o, "peer", rec.peer);
                        json_num(&o, "pid", rec.pid);
                        json_num(&o, "uid", rec.uid);
                        json_num(&o, "refs", rec.refs);
                        json_end(&o, '}');
                } else {
                        printf("  peer %-6" PRIu64 " pid %-8" PRIu64 " uid %-6" PRIu64 " refs %" PRIu64 "\n", rec.peer,
                               rec.pid, rec.uid, rec.refs);
                }
        }
        if (ctl->json) {
                json_end(&h, ']');
                printf("\n");
        }
        frame_free(&f);
        return CTL_OK;
}

static void peer_json_cb(const ProtoMsg *m, void *ud)
{
        Json *j = ud, o, g;

        json_next(j);
        json_begin(&o, j->f, '{');
        json_num(&o, "peer", m->peer);
        json_num(&o, "pid", m->pid);
        json_num(&o, "uid", m->uid);
        json_num(&o, "gid", m->gid);
        json_num(&o, "pidns", m->pidns);
        json_key(&o, "pidns_declared");
        json_bool(&o, m->pidns_declared);
        json_pstr(&o, "label", m->label);
        json_num(&o, "buffers", m->buffers);
        json_num(&o, "refs", m->refs);
        json_num(&o, "subs", m->subs);
        json_num(&o, "waits", m->waits);
        json_key(&o, "gpus");
        json_begin(&g, j->f, '[');
        for (uint32_t i = 0; i < m->n_gpus; i++) {
                json_next(&g);
                json_str(&g, m->gpus[i].ptr, m->gpus[i].len);
        }
        json_end(&g, ']');
        json_end(&o, '}');
}

static void peer_line_cb(const ProtoMsg *m, void *ud)
{
        char pidns[24];

        (void)ud;
        /* A namespace the broker has only the peer's word for is marked, as it proves nothing. */
        snprintf(pidns, sizeof(pidns), "%" PRIu64 "%s", m->pidns, m->pidns_declared ? "?" : "");
        printf("%-6" PRIu64 " %-8" PRIu64 " %-6" PRIu64 " %-6" PRIu64 " %-12s ", m->peer, m->pid, m->uid, m->gid,
               pidns);
        print_text_cell(m->label.ptr, m->label.len, 20);
        printf(" %7" PRIu64 " %5" PRIu64 " %4" PRIu64 " %5" PRIu64 " %" PRIu32 "\n", m->buffers, m->refs, m->subs,
               m->waits, m->n_gpus);
}

int cmd_peers(Ctl *ctl, int argc, char **argv)
{
        Json j;
        int r;

        if (parse_common(argc, argv, NULL, NULL, NULL) < 0) {
                fprintf(stderr, "usage: gpuipcctl peers\n");
                return CTL_USAGE;
        }
        if (ctl->json) {
                json_begin(&j, stdout, '[');
                r = for_each_record(ctl, PROTO_OP_PEERS, NULL, peer_json_cb, &j);
                json_end(&j, ']');
                putchar('\n');
                return r;
        }
        printf("%-6s %-8s %-6s %-6s %-12s %-20s %7s %5s %4s %5s %s\n", "PEER", "PID", "UID", "GID", "PIDNS", "LABEL",
               "BUFFERS", "REFS", "SUBS", "WAITS", "GPUS");
        return for_each_record(ctl, PROTO_OP_PEERS, NULL, peer_line_cb, NULL);
}

/* Calls fn(name, value) for each broker counter. */
static int for_each_stat(Ctl *ctl, void (*fn)(const ProtoMsg *, void *), void *ud)
{
        ProtoMsg req = { .op = PROTO_OP_STATS }, rec;
        Frame f = { .fd = -1 };
        ProtoIter it;
        int r = request(ctl, &req, &f);

        if (r)
                return r;
        proto_iter_init(&it, &f.msg.items);
        while (proto_iter_next(&it, &rec) == 1)
                fn(&rec, ud);
        frame_free(&f);
        return CTL_OK;
}

static void stat_member_cb(const ProtoMsg *m, void *ud)
{
        Json *j = ud;

        json_next(j);
        json_str(j, m->name.ptr, m->name.len);
        fputc(':', j->f);
        json_u64(j, m->value);
}

static void stat_line_cb(const ProtoMsg *m, void *ud)
{
        (void)ud;
        printf("%-28.*s %" PRIu64 "\n", (int)m->name.len, m->name.ptr, m->value);
}

int cmd_stats(Ctl *ctl, int argc, char **argv)
{
        Json j;
        int r;

        if (parse_common(argc, argv, NULL, NULL, NULL) < 0) {
                fprintf(stderr, "usage: gpuipcctl stats\n");
                return CTL_USAGE;
        }
        if (!ctl->json)
                return for_each_stat(ctl, stat_line_cb, NULL);
        json_begin(&j, stdout, '{');
        r = for_each_stat(ctl, stat_member_cb, &j);
        json_end(&j, '}');
        putchar('\n');
        return r;
}

/* HELP texts for the Prometheus exposition; counters end in _total. */
static const struct {
        const char *name, *help;
} metric_help[] = {
        { "peers", "Connected peers." },
        { "buffers", "Registered buffers in any state." },
        { "buffers_live", "Buffers that accept attaches." },
        { "buffers_retired", "Retired buffers waiting for their last release." },
        { "buffers_idle", "Drained buffers their producer may publish again." },
        { "buffers_orphaned", "Broker-held buffers whose producer is gone." },
        { "references", "References held by consumers." },
        { "held_fds", "Memory fds the broker holds." },
        { "waits", "Attaches and group joins waiting." },
        { "subscriptions", "Event subscriptions." },
        { "groups", "Rendezvous groups being formed." },
        { "names", "Names with a published buffer or a waiter." },
        { "open_fds", "File descriptors open in the broker process." },
        { "uptime_ms", "Milliseconds since the broker started." },
};

static void metric_cb(const ProtoMsg *m, void *ud)
{
        char name[96];
        const char *help = NULL;
        bool counter;

        (void)ud;
        snprintf(name, sizeof(name), "%.*s", (int)m->name.len, m->name.ptr);
        counter = m->name.len > 6 && strcmp(name + m->name.len - 6, "_total") == 0;
        for (size_t i = 0; i < sizeof(metric_help) / sizeof(metric_help[0]); i++)
                if (strcmp(metric_help[i].name, name) == 0)
                        help = metric_help[i].help;
        if (!help)
                help = counter ? "Events counted since the broker started." : name;
        printf("# HELP gpuipc_%s %s\n", name, help);
        printf("# TYPE gpuipc_%s %s\n", name, counter ? "counter" : "gauge");
        printf("gpuipc_%s %" PRIu64 "\n", name, m->value);
}

int cmd_metrics(Ctl *ctl, int argc, char **argv)
{
        if (parse_common(argc, argv, NULL, NULL, NULL) < 0) {
                fprintf(stderr, "usage: gpuipcctl metrics\n");
                return CTL_USAGE;
        }
        return for_each_stat(ctl, metric_cb, NULL);
}

static const char *event_name(gpuipc_event_type_t t)
{
        switch (t) {
        case GPUIPC_EVENT_PUBLISHED: return "published";
        case GPUIPC_EVENT_RETIRED: return "retired";
        case GPUIPC_EVENT_REVOKED: return "revoked";
        case GPUIPC_EVENT_DRAINED: return "drained";
        case GPUIPC_EVENT_RECONNECTED: return "reconnected";
        }
        return "unknown";
}

int cmd_watch(Ctl *ctl, int argc, char **argv)
{
        const char *prefix = "";
        gpuipc_event_t ev;
        int r;

        if (parse_common(argc, argv, &prefix, NULL, NULL) < 0) {
                fprintf(stderr, "usage: gpuipcctl watch [--prefix P]\n");
                return CTL_USAGE;
        }
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = gpuipc_subscribe(ctl->c, prefix, NULL);
        if (r < 0)
                return ctl_fail(ctl, "subscribe", r);
        for (;;) {
                r = gpuipc_next_event(ctl->c, &ev, -1);
                if (r < 0)
                        return ctl_fail(ctl, "watch", r);
                if (ctl->json) {
                        Json o;
                        json_begin(&o, stdout, '{');
                        json_key(&o, "event");
                        json_str(&o, event_name(ev.type), strlen(event_name(ev.type)));
                        json_num(&o, "buffer", ev.buffer);
                        json_num(&o, "generation", ev.generation);
                        json_key(&o, "name");
                        json_str(&o, ev.name, strlen(ev.name));
                        json_key(&o, "reason");
                        json_str(&o, ev.reason, strlen(ev.reason));
                        json_end(&o, '}');
                        putchar('\n');
                } else {
                        printf("%-9s %-32s buffer=%" PRIu64 " generation=%" PRIu64 "%s%s\n", event_name(ev.type),
                               ev.name, ev.buffer, ev.generation, ev.reason[0] ? " reason=" : "", ev.reason);
                }
                fflush(stdout);
        }
}
