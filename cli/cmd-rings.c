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

/* A ring's JSON object; head and lag are null when unknown, never 0, since 0 is a real head (a
 * ring that has sent nothing) and a real lag (a member that is caught up). */
static void ring_json(Json *o, const void *record)
{
        const gpuipc_ring_info_t *g = record;

        json_kstr(o, "name", g->name);
        json_kstr(o, "mode", gpuipc_ring_mode_name(g->mode));
        json_kstr(o, "kind", gpuipc_kind_name(g->kind));
        json_ku64(o, "slot_size", g->slot_size);
        json_ku64(o, "slots", g->slots);
        json_ku64(o, "members", g->members);
        json_ku64(o, "taken", g->taken);
        json_ku64(o, "lease_ms", g->lease_ms);
        json_kstr_or_null(o, "device", g->device);
        json_ku64(o, "owner", g->owner);
        json_ku64(o, "uid", g->uid);
        json_ku64(o, "pid", g->pid);
        json_kbool(o, "ready", g->ready);
        json_ku64_or_null(o, "head", g->head_known, g->head);
        json_ku64_or_null(o, "lag", g->lag_known, g->lag);
        json_kstr(o, "why", g->why);
}

static const char *const ring_headers[] = { "RING", "MODE", "KIND", "SLOTS", "SLOT SIZE", "SEATS", "HEAD", "LAG",
                                            "UID", "PID", "" };
#define RING_ALIGN "lllrrrrrrrl"

/* The last, headerless column flags a ring that is not joinable yet (parts still coming); empty
 * for most rows, like ls's "held" column. */
static void ring_row(Table *t, const void *record)
{
        const gpuipc_ring_info_t *g = record;
        char size[32];

        ctl_human_size(g->slot_size, size, sizeof(size));
        table_cell(t, "%s", g->name);
        table_cell(t, "%s", gpuipc_ring_mode_name(g->mode));
        table_cell(t, "%s", gpuipc_kind_name(g->kind));
        table_cell(t, "%u", g->slots);
        table_cell(t, "%s", size);
        table_cell(t, "%u/%u", g->taken, g->members);
        /* Unknown is not zero: "?" when the broker could not read the control page, "-" when nobody
         * is seated to lag. */
        if (g->head_known)
                table_cell(t, "%" PRIu64, g->head);
        else
                table_cell(t, "?");
        if (g->lag_known)
                table_cell(t, "%" PRIu64, g->lag);
        else
                table_cell(t, "-");
        table_cell(t, "%" PRIu64, g->uid);
        table_cell(t, "%" PRIu64, g->pid);
        table_cell(t, "%s", g->ready ? "" : "setting-up");
}

static int fetch_rings(Ctl *ctl, const char *prefix, uint64_t *cursor, void *page, int cap)
{
        return gpuipc_list_rings(ctl->c, prefix, cursor, page, cap);
}

static const CtlListing rings_listing = {
        sizeof(gpuipc_ring_info_t), PAGE, fetch_rings, ring_json, ring_headers, RING_ALIGN, ring_row,
};

int ctl_ls_rings(Ctl *ctl, const char *prefix)
{
        int r = ctl_list(ctl, &rings_listing, prefix, true);

        /* A broker older than ring listings has buffers to show all the same. */
        return r == GPUIPC_E_UNKNOWN_OP ? 0 : r;
}

/* rings [--prefix P]: the listing alone (ls shows it after the buffers); unlike ls, an old broker's
 * unknown-op is an error here, since rings were asked for by name. */
int cmd_rings(Ctl *ctl, int argc, char **argv)
{
        const char *prefix = NULL, *none = NULL;
        int c, r;

        while ((c = ctl_next_option(ctl, argc, argv, &r)) > 0)
                prefix = optarg;
        if (c < 0)
                return r;
        if ((r = ctl_operand(ctl, argc, argv, false, &none)) != CTL_CONTINUE)
                return r;
        r = ctl_connect(ctl, false);
        if (r)
                return r;
        r = ctl_list(ctl, &rings_listing, prefix, false);
        return r < 0 ? ctl_fail(ctl, "rings", r) : CTL_OK;
}

/* ---- one ring and its seats ---- */

/* One seat: who holds it (peer 0 when it waits for a member) and how far its member is behind the
 * head; position and lag are null when the broker could not read the member's page. */
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

static const char *const seat_headers[] = { "SEAT", "EPOCH", "STATE", "PEER", "PID", "UID", "POSITION", "LAG",
                                            "LABEL" };

static void seat_row(Table *t, const gpuipc_ring_member_info_t *m)
{
        table_cell(t, "%u", m->seat);
        table_cell(t, "%" PRIu64, m->epoch);
        table_cell(t, "%s", gpuipc_seat_state_name(m->state));
        /* A waiting seat has no connection yet; another uid's may be hidden by the policy. */
        if (m->peer) {
                table_cell(t, "%" PRIu64, m->peer);
                table_cell(t, "%" PRIu64, m->pid);
                table_cell(t, "%" PRIu64, m->uid);
        } else {
                table_cell(t, "-");
                table_cell(t, "-");
                table_cell(t, "-");
        }
        if (m->position_known) {
                table_cell(t, "%" PRIu64, m->position);
                table_cell(t, "%" PRIu64, m->lag);
        } else {
                table_cell(t, "-");
                table_cell(t, "-");
        }
        /* Last: the label is the one column of free text a peer chose, and the last cell is not
         * padded, so a long label widens no other column. */
        table_cell(t, "%s", m->label);
}

/* stat --ring in text: the ring's row as rings shows it (same columns, to compare by eye), why its
 * head is unknown if it is, then the seats. */
static int ring_stat_text(const gpuipc_ring_info_t *g, const gpuipc_ring_member_info_t *seats, int n)
{
        Table *ring = table_new(ring_headers, RING_ALIGN), *seated = table_new(seat_headers, "rrlrrrrrl");
        int r = -ENOMEM;

        if (!ring || !seated)
                goto out;
        ring_row(ring, g);
        for (int i = 0; i < n; i++)
                seat_row(seated, &seats[i]);
        r = table_print(ring, stdout);
        if (r < 0)
                goto out;
        /* The broker's reason is about memory a producer wrote: printed through text_safe, as
         * any text that may carry what a peer chose. */
        if (!g->head_known) {
                fputs("head unknown: ", stdout);
                text_safe(stdout, g->why);
                putchar('\n');
        }
        printf("seats: %u of %u taken; lease %" PRIu64 " ms; producer peer %" PRIu64 "\n", g->taken, g->members,
               g->lease_ms, g->owner);
        /* No seats listed: no table, rather than a header with nothing under it. */
        if (n > 0)
                r = table_print(seated, stdout);
out:
        table_free(ring);
        table_free(seated);
        return r;
}

/* Room for every seat a ring can have (GPUIPC_RING_MAX_MEMBERS), so one reply is the whole ring:
 * no paging, and the seats are one consistent snapshot. */
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
                /* {"ring": the object rings --json lists, "seats": [...]}: one parser reads both. */
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
                int r = ring_stat_text(&g, seats, n);
                if (r < 0)
                        return r;
        }
        ctl->printed = true;
        return 0;
}
