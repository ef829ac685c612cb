/* Rings as operators see them: `rings` lists them, `ls` adds their table after the buffers, and
 * `stat` shows one with its seats and how far each member lags (docs/operations.md "Rings"). A
 * ring's head and positions are what its producer and members wrote into its shared memory when
 * the broker answered, checked by the broker. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "json.h"
#include "text.h"

/* Rings asked for per request, fewer than buffers: the broker maps each listed ring's pages to read
 * it, and a short page keeps each request short for the broker's other peers. */
#define PAGE 64

static void ring_json(Json *o, const gpuipc_ring_info_t *g)
{
        json_kstr(o, "name", g->name);
        json_kstr(o, "mode", gpuipc_ring_mode_name(g->mode));
        json_kstr(o, "kind", gpuipc_kind_name(g->kind));
        json_ku64(o, "slot_size", g->slot_size);
        json_ku64(o, "slots", g->slots);
        json_ku64(o, "members", g->members);
        json_ku64(o, "taken", g->taken);
        json_ku64(o, "lease_ms", g->lease_ms);
        json_kstr(o, "device", g->device);
        json_ku64(o, "owner", g->owner);
        json_ku64(o, "uid", g->uid);
        json_ku64(o, "pid", g->pid);
        json_kbool(o, "ready", g->ready);
        json_ku64_or_null(o, "head", g->head_known, g->head);
        json_ku64_or_null(o, "lag", g->lag_known, g->lag);
        json_kstr(o, "why", g->why);
}

static void ring_header(void)
{
        printf("%-32s %-12s %-8s %5s %10s %5s %10s %8s %5s %6s\n", "RING", "MODE", "KIND", "SLOTS", "SLOT SIZE",
               "SEATS", "HEAD", "LAG", "UID", "PID");
}

static void ring_line(const gpuipc_ring_info_t *g)
{
        char size[32], seats[24], head[24], lag[24];

        ctl_human_size(g->slot_size, size, sizeof(size));
        snprintf(seats, sizeof(seats), "%u/%u", g->taken, g->members);
        /* Unknown is not zero: "?" when the broker could not read the control page, "-" when nobody
         * is seated to lag. */
        snprintf(head, sizeof(head), g->head_known ? "%" PRIu64 : "?", g->head);
        snprintf(lag, sizeof(lag), g->lag_known ? "%" PRIu64 : "-", g->lag);
        text_cell(stdout, g->name, 32);
        printf(" %-12s %-8s %5u %10s %5s %10s %8s %5" PRIu64 " %6" PRIu64 "%s\n", gpuipc_ring_mode_name(g->mode),
               gpuipc_kind_name(g->kind), g->slots, size, seats, head, lag, g->uid, g->pid,
               g->ready ? "" : " setting-up");
}

/* Every ring under prefix, as a table or as one JSON array. after_buffers: the table follows ls's
 * buffers: nothing without rings, else an empty line first. 0, or the library's error. */
static int rings_print(Ctl *ctl, const char *prefix, bool json, bool after_buffers)
{
        gpuipc_ring_info_t *page = calloc(PAGE, sizeof(*page));
        uint64_t cursor = 0;
        bool started = false;
        Json j;
        int r = 0;

        if (!page)
                return -ENOMEM;
        do {
                int n = gpuipc_list_rings(ctl->c, prefix, &cursor, page, PAGE);

                if (n < 0) {
                        r = n;
                        break;
                }
                if (!started && (json || n > 0 || !after_buffers)) {
                        if (json) {
                                json_begin(&j, stdout, '[');
                        } else {
                                if (after_buffers)
                                        putchar('\n');
                                ring_header();
                        }
                        started = ctl->printed = true;
                }
                for (int i = 0; i < n; i++) {
                        if (json) {
                                Json o;
                                json_next(&j);
                                json_begin(&o, stdout, '{');
                                ring_json(&o, &page[i]);
                                json_end(&o, '}');
                        } else {
                                ring_line(&page[i]);
                        }
                }
        } while (cursor);
        if (json && started) {
                json_end(&j, ']');
                putchar('\n');
        }
        free(page);
        return r;
}

int ctl_ls_rings(Ctl *ctl, const char *prefix)
{
        int r = rings_print(ctl, prefix, false, true);

        /* A broker older than ring listings has buffers to show all the same. */
        return r == GPUIPC_E_UNKNOWN_OP ? 0 : r;
}

int cmd_rings(Ctl *ctl, int argc, char **argv)
{
        static const struct option longopts[] = { { "prefix", required_argument, NULL, 'p' }, CTL_HELP_OPTION, {} };
        const char *prefix = NULL;
        int c, r;

        while ((c = getopt_long(argc, argv, ":p:h", longopts, NULL)) >= 0) {
                if (c == 'h')
                        return ctl_help(ctl);
                if (c != 'p')
                        return ctl_bad_option(ctl, argc, argv, c);
                prefix = optarg;
        }
        if (optind < argc)
                return ctl_usage(ctl, "unexpected argument '%s'", argv[optind]);
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = rings_print(ctl, prefix, ctl->json, false);
        return r < 0 ? ctl_fail(ctl, "rings", r) : CTL_OK;
}

/* ---- one ring and its seats ---- */

static void seat_json(Json *o, const gpuipc_ring_member_info_t *m)
{
        json_ku64(o, "seat", m->seat);
        json_ku64(o, "epoch", m->epoch);
        json_kstr(o, "state", gpuipc_seat_state_name(m->state));
        json_ku64(o, "peer", m->peer);
        json_ku64(o, "pid", m->pid);
        json_ku64(o, "uid", m->uid);
        json_kstr(o, "label", m->label);
        json_ku64_or_null(o, "position", m->position_known, m->position);
        json_ku64_or_null(o, "lag", m->position_known, m->lag);
}

static void seat_line(const gpuipc_ring_member_info_t *m)
{
        char who[64], position[24], lag[24];

        /* A waiting seat has no connection yet; another uid's may be hidden by the policy. */
        if (m->peer)
                snprintf(who, sizeof(who), "%6" PRIu64 " %8" PRIu64 " %6" PRIu64, m->peer, m->pid, m->uid);
        else
                snprintf(who, sizeof(who), "%6s %8s %6s", "-", "-", "-");
        snprintf(position, sizeof(position), m->position_known ? "%" PRIu64 : "-", m->position);
        snprintf(lag, sizeof(lag), m->position_known ? "%" PRIu64 : "-", m->lag);
        printf("%4u %8" PRIu64 " %-11s %s %10s %8s ", m->seat, m->epoch, gpuipc_seat_state_name(m->state), who,
               position, lag);
        text_safe(stdout, m->label);
        putchar('\n');
}

static void ring_stat_text(const gpuipc_ring_info_t *g, const gpuipc_ring_member_info_t *seats, int n)
{
        ring_header();
        ring_line(g);
        if (!g->head_known) {
                fputs("head unknown: ", stdout);
                text_safe(stdout, g->why);
                putchar('\n');
        }
        printf("seats: %u of %u taken; lease %" PRIu64 " ms; producer peer %" PRIu64 "\n", g->taken, g->members,
               g->lease_ms, g->owner);
        if (n == 0)
                return;
        printf("%4s %8s %-11s %6s %8s %6s %10s %8s %s\n", "SEAT", "EPOCH", "STATE", "PEER", "PID", "UID", "POSITION",
               "LAG", "LABEL");
        for (int i = 0; i < n; i++)
                seat_line(&seats[i]);
}

int ctl_stat_ring(Ctl *ctl, const char *name)
{
        gpuipc_ring_member_info_t seats[GPUIPC_RING_MAX_MEMBERS];
        gpuipc_ring_info_t g;
        int n = gpuipc_stat_ring(ctl->c, name, seats, GPUIPC_RING_MAX_MEMBERS, &g);

        if (n < 0)
                return n;
        if (ctl->json) {
                Json j, o, s;

                json_begin(&j, stdout, '{');
                json_key(&j, "ring");
                json_begin(&o, stdout, '{');
                ring_json(&o, &g);
                json_end(&o, '}');
                json_key(&j, "seats");
                json_begin(&s, stdout, '[');
                for (int i = 0; i < n; i++) {
                        json_next(&s);
                        json_begin(&o, stdout, '{');
                        seat_json(&o, &seats[i]);
                        json_end(&o, '}');
                }
                json_end(&s, ']');
                json_end(&j, '}');
                putchar('\n');
        } else {
                ring_stat_text(&g, seats, n);
        }
        ctl->printed = true;
        return 0;
}
