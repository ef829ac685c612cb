/* Rings, the control plane (gpuipc.h, docs/design.md "Rings"): making and joining a ring, what the
 * broker says about its members, renewing a seat whose membership ended, telling the broker of an
 * eviction, taking a ring back after a reconnect, closing, and the member's ring fd. All of it
 * talks to the broker or allocates, so it runs under the connection's lock, in the caller's thread
 * or in the connection's ring thread (ring-thread.c); the frames themselves go through the data
 * plane (ring-data.c, ring-stream-data.c), which never waits for any of this.
 *
 * The broker is asked only to set up, join, leave, evict and close. A producer hears of members
 * joining and leaving as events; whoever reads them (the ring thread as soon as they arrive, or any
 * call of the caller's that reads the socket first) seats or unseats the member at once, under
 * r->lock. Renewing a seat needs requests of its own, so it runs after the events were read
 * (ClientHooks.after_events), and only in the ring thread: its messages are the thread's, never
 * the caller's gpuipc_errmsg(). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "futex.h"
#include "internal.h"
#include "macro.h"
#include "ring.h"
#include "ring-internal.h"

#define RING_RENEW_RETRY_MS 50    /* a seat renewal that failed is tried again after this */
#define NOTIFIER_LOOK_MS 200      /* a ring fd's helper thread looks at the ring at least this often */
#define RING_JOIN_RETRY_MS 20     /* a joiner asks again this often while the ring does not exist */
#define RING_DEFAULT_SLOTS 4
#define RING_DEFAULT_MEMBERS 4
#define RING_DEFAULT_LEASE_MS 2000

static gpuipc_ring_t *ring_by_name(gpuipc_t *c, const char *name, uint32_t len)
{
        list_for_each(pos, &c->rings) {
                gpuipc_ring_t *r = list_entry(pos, gpuipc_ring_t, link);
                if (strlen(r->name) == len && memcmp(r->name, name, len) == 0)
                        return r;
        }
        return NULL;
}

static int simple_ring_request(gpuipc_t *c, ProtoOp op, const char *name)
{
        Frame f = { .fd = -1 };
        ProtoMsg req;
        int r;

        proto_request_init(&req, op);
        proto_set_name(&req, proto_str(name));
        r = client_request(c, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f);

        if (r == 0)
                frame_free(&f);
        return r;
}

/* Undoes a ring half made or half joined without waiting for the answer: the failure that made us
 * undo it is what the caller hears (the broker's reply, arriving later, is dropped). */
static void ring_undo(gpuipc_t *c, ProtoOp op, const char *name)
{
        ProtoMsg req;

        proto_request_init(&req, op);
        proto_set_name(&req, proto_str(name));
        (void)client_send_nowait(c, &req);
}

/* ---- membership (events from the broker) ---- */

void ring_mark_gone(gpuipc_ring_t *r, const char *why)
{
        uint64_t one = 1;

        if (__atomic_load_n(&r->gone, __ATOMIC_ACQUIRE))
                return;
        snprintf(r->gone_why, sizeof(r->gone_why), "%s", why);
        __atomic_store_n(&r->gone, 1, __ATOMIC_RELEASE);
        /* A take asleep on the doorbell, and an event loop on the ring fd, look again. */
        futex_wake(&r->ctl->doorbell, INT_MAX);
        if (r->efd >= 0)
                (void)!write(r->efd, &one, sizeof(one));
}

void ring_on_event(gpuipc_t *c, const ProtoMsg *m)
{
        gpuipc_ring_t *r = ring_by_name(c, m->name.ptr, m->name.len);
        uint32_t i;

        if (!r || !proto_has(m, PF_INDEX))
                return; /* a ring we closed already */
        if (!r->producer) {
                if (m->event == PROTO_EV_MEMBER_LEFT && m->index == r->index && m->generation == r->epoch) {
                        char why[sizeof(r->gone_why)];

                        proto_str_copy(m->reason, why, sizeof(why));
                        ring_mark_gone(r, why);
                }
                return;
        }
        if (m->index >= r->n_members)
                return;
        i = (uint32_t)m->index;
        pthread_mutex_lock(&r->lock);
        if (m->event == PROTO_EV_MEMBER_JOINED) {
                ring_seat_activate(r, i, m->generation);
                r->max_epoch = MAX(r->max_epoch, m->generation);
        } else {
                if (r->seat[i].active && r->seat[i].epoch == m->generation)
                        ring_seat_deactivate(r, i);
                /* Whichever membership it was, the broker let go of the seat's page with it (and
                 * hands the seat out again only with new ones): renewed after the events. */
                r->seat[i].renew = true;
                r->renew_pending = true;
        }
        pthread_mutex_unlock(&r->lock);
}

static int register_part(gpuipc_ring_t *r, uint32_t index, gpuipc_buffer_t *b, bool writable, bool restore);

/* Makes seat i's new page (and counters) and lets go of the old ones; they are registered next.
 * The seat is inactive, so the data plane reads neither; the old page is kept until the seat's
 * next renewal, since the producer may be just going to sleep on its wake word. */
static int seat_replace(gpuipc_ring_t *r, uint32_t i)
{
        gpuipc_buffer_t *fresh = NULL, *older;
        int e;

        if (r->seat[i].replaced)
                return 0;
        e = gpuipc_buffer_alloc(r->conn, GPUIPC_KIND_MEMFD, RING_PAGE, 0, &fresh);
        if (e == 0 && r->mode == RING_STREAM)
                e = ring_stream_seat_renew(r, i);
        if (e < 0) {
                if (fresh)
                        (void)gpuipc_buffer_free(r->conn, fresh);
                return e;
        }
        pthread_mutex_lock(&r->lock);
        older = r->old_page[i];
        r->old_page[i] = r->page_buf[i];
        r->page_buf[i] = fresh;
        r->seat[i].replaced = true;
        pthread_mutex_unlock(&r->lock);
        /* The broker forgets it; a member that left may keep its own mapping of it. */
        if (older)
                (void)gpuipc_buffer_free(r->conn, older);
        return 0;
}

/* Seat i's membership ended: a new page and counters, registered under its part indices, so that
 * the broker may hand the seat out again. */
static int seat_renew(gpuipc_ring_t *r, uint32_t i)
{
        uint32_t page = 1 + r->n_slots + i;
        int e = seat_replace(r, i);

        if (e == 0 && !r->page_buf[i]->registered)
                e = register_part(r, page, r->page_buf[i], true, false);
        if (e == 0 && r->mode == RING_STREAM && !r->counter_buf[i]->registered)
                e = register_part(r, page + r->n_members, r->counter_buf[i], true, false);
        if (e == 0) {
                pthread_mutex_lock(&r->lock);
                r->seat[i].renew = r->seat[i].replaced = false;
                pthread_mutex_unlock(&r->lock);
        }
        return e;
}

/* Renews the seats whose memberships ended (never from event dispatch, nor from within itself); a
 * failure is tried again a little later. */
static void ring_renew_seats(gpuipc_ring_t *r)
{
        if (!r->renew_pending || r->renewing || monotonic_ms() < r->renew_retry_ms)
                return;
        r->renewing = true;
        r->renew_pending = false;
        for (uint32_t i = 0; i < r->n_members; i++)
                if (r->seat[i].renew && seat_renew(r, i) < 0) {
                        r->renew_pending = true;
                        r->renew_retry_ms = monotonic_ms() + RING_RENEW_RETRY_MS;
                }
        r->renewing = false;
}

/* Tells the broker of the members the data plane evicted (it only keeps its books). */
static void ring_send_evictions(gpuipc_ring_t *r)
{
        uint64_t epoch[RING_MAX_MEMBERS] = { 0 };

        pthread_mutex_lock(&r->lock);
        for (uint32_t i = 0; r->evict_pending && i < r->n_members; i++) {
                epoch[i] = r->seat[i].evict_epoch;
                r->seat[i].evict_epoch = 0;
        }
        r->evict_pending = false;
        pthread_mutex_unlock(&r->lock);
        for (uint32_t i = 0; i < r->n_members; i++) {
                ProtoMsg req;
                Frame f = { .fd = -1 };

                if (!epoch[i])
                        continue;
                proto_request_init(&req, PROTO_OP_RING_EVICT);
                proto_set_name(&req, proto_str(r->name));
                proto_set_index(&req, i);
                proto_set_generation(&req, epoch[i]);
                if (client_request(r->conn, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f) == 0)
                        frame_free(&f);
        }
}

/* Whether the control plane has work that needs requests (the ring thread's). */
static bool ring_has_work(const gpuipc_ring_t *r)
{
        return r->producer && (r->renew_pending || __atomic_load_n(&r->evict_pending, __ATOMIC_ACQUIRE) ||
                               __atomic_load_n(&r->n_retired, __ATOMIC_ACQUIRE));
}

int ring_control_timeout(gpuipc_t *c)
{
        list_for_each(pos, &c->rings)
                if (ring_has_work(list_entry(pos, gpuipc_ring_t, link)))
                        return RING_RENEW_RETRY_MS;
        return -1;
}

/* ClientHooks.after_events: the frames read were handled. A member whose producer's parts were
 * revoked (it died) is told at once, wherever the events were read; what needs requests is the ring
 * thread's, which is woken for it when someone else read them. */
void ring_after_events(gpuipc_t *c)
{
        bool work = false, mine = ring_thread_is_self(c);

        list_for_each(pos, &c->rings) {
                gpuipc_ring_t *r = list_entry(pos, gpuipc_ring_t, link);

                if (!r->producer) {
                        if (r->ctl_buf && r->ctl_buf->revoked)
                                ring_mark_gone(r, "its producer is gone");
                        continue;
                }
                if (!mine) {
                        work |= ring_has_work(r);
                        continue;
                }
                if (__atomic_load_n(&r->evict_pending, __ATOMIC_ACQUIRE))
                        ring_send_evictions(r);
                ring_renew_seats(r);
                if (r->mode == RING_STREAM)
                        ring_stream_reap(r, false);
        }
        if (work)
                ring_thread_kick(c);
}

/* ---- producer ---- */

static void ring_free(gpuipc_ring_t *r)
{
        gpuipc_t *c = r->conn;

        ring_stream_reap(r, true);
        ring_stream_close(r);
        for (uint32_t i = 0; i < r->n_members; i++)
                if (r->counter_buf[i])
                        gpuipc_buffer_free(c, r->counter_buf[i]);
        if (r->counter_part)
                gpuipc_release(c, r->counter_part);
        for (uint32_t i = 0; i < r->n_slots; i++)
                if (r->slot[i])
                        (r->producer ? gpuipc_buffer_free : gpuipc_release)(c, r->slot[i]);
        for (uint32_t i = 0; i < r->n_members; i++) {
                if (r->page_buf[i])
                        gpuipc_buffer_free(c, r->page_buf[i]);
                if (r->old_page[i])
                        gpuipc_buffer_free(c, r->old_page[i]);
        }
        if (r->page_part)
                gpuipc_release(c, r->page_part);
        if (r->ctl_buf)
                (r->producer ? gpuipc_buffer_free : gpuipc_release)(c, r->ctl_buf);
        list_unlink(&r->link);
        pthread_mutex_destroy(&r->lock);
        free(r);
}

/* A ring of c, not set up yet: linked into c->rings, so that ring_free undoes whatever follows. */
static gpuipc_ring_t *ring_new(gpuipc_t *c, const char *name, bool producer)
{
        gpuipc_ring_t *r = calloc(1, sizeof(*r));

        if (!r)
                return NULL;
        r->conn = c;
        r->producer = producer;
        snprintf(r->name, sizeof(r->name), "%s", name);
        r->next = 1;
        r->writing = r->taken = -1;
        r->efd = -1;
        pthread_mutex_init(&r->lock, NULL);
        list_append(&c->rings, &r->link);
        return r;
}

/* Registers part `index` (0: the control page, then the slots, the member pages and a stream ring's
 * counters); restore: again after a restart, under its id and generation. */
static int register_part(gpuipc_ring_t *r, uint32_t index, gpuipc_buffer_t *b, bool writable, bool restore)
{
        gpuipc_t *c = r->conn;
        ProtoMsg req;
        Frame f = { .fd = -1 };
        int fd = -1, e;

        b->ring_part = true;
        b->writable = writable;
        e = kind_ops(b->kind)->export(c, b, writable, &fd);
        if (e < 0)
                return e;
        proto_request_init(&req, PROTO_OP_RING_PART);
        proto_set_name(&req, proto_str(r->name));
        proto_set_index(&req, index);
        proto_set_kind(&req, (ProtoKind)b->kind);
        proto_set_size(&req, b->size);
        proto_set_buffer(&req, b->id);
        proto_set_writable(&req, writable);
        if (restore && b->generation) { /* a part renewed but never registered is new to any broker */
                proto_set_restored(&req, true);
                proto_set_generation(&req, b->generation);
        }
        if (b->device[0])
                proto_set_device(&req, proto_str(b->device));
        e = client_request(c, &req, fd, CLIENT_REQUEST_TIMEOUT_MS, &f);
        if (e < 0)
                return e;
        b->registered = true;
        b->state = PROTO_STATE_LIVE;
        b->generation = f.msg.generation;
        ring_part_name(b->name, sizeof(b->name), r->name, index, r->n_slots, r->n_members);
        frame_free(&f);
        return 0;
}

/* The seats a restored ring declares: those we count as seated, so that their members can take
 * them back. */
static int declare_seats(gpuipc_ring_t *r, ProtoItems *seats)
{
        int e = 0;

        pthread_mutex_lock(&r->lock);
        for (uint32_t i = 0; e == 0 && i < r->n_members; i++) {
                ProtoMsg rec;

                proto_record_init(&rec);
                proto_set_index(&rec, i);
                proto_set_generation(&rec, r->seat[i].epoch);
                if (r->seat[i].active && !proto_items_add(seats, &rec))
                        e = -ENOMEM;
        }
        pthread_mutex_unlock(&r->lock);
        return e;
}

/* Declares the ring to the broker; restore: again after a restart, with its seats. */
static int ring_declare(gpuipc_ring_t *r, bool restore)
{
        ProtoMsg req;
        Frame f = { .fd = -1 };
        ProtoItems seats;
        int e;

        proto_request_init(&req, PROTO_OP_RING_CREATE);
        proto_items_init(&seats, PROTO_MAX_BODY / 2);
        if (restore) {
                e = declare_seats(r, &seats);
                if (e < 0) {
                        proto_items_free(&seats);
                        return e;
                }
                proto_set_restored(&req, true);
                proto_set_generation(&req, r->max_epoch);
                proto_set_items(&req, proto_items_finish(&seats));
        }
        proto_set_name(&req, proto_str(r->name));
        proto_set_kind(&req, (ProtoKind)r->kind);
        proto_set_size(&req, r->slot_size);
        proto_set_slots(&req, r->n_slots);
        proto_set_members(&req, r->n_members);
        proto_set_mode(&req, r->mode == RING_LATEST   ? PROTO_MODE_LATEST
                             : r->mode == RING_STREAM ? PROTO_MODE_STREAM
                                                      : PROTO_MODE_BACKPRESSURE);
        proto_set_timeout_ms(&req, r->lease_ms);
        if (r->slot[0]->device[0])
                proto_set_device(&req, proto_str(r->slot[0]->device));
        e = client_request(r->conn, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f);
        proto_items_free(&seats);
        if (e == 0)
                frame_free(&f);
        return e;
}

/* Registers every part: the control page, the slots, the member pages, the counters (members write
 * their own, so they are exported writable). */
static int register_parts(gpuipc_ring_t *r, bool restore)
{
        uint32_t part = 0;
        int e = register_part(r, part++, r->ctl_buf, false, restore);

        for (uint32_t i = 0; e == 0 && i < r->n_slots; i++)
                e = register_part(r, part++, r->slot[i], false, restore);
        for (uint32_t i = 0; e == 0 && i < r->n_members; i++)
                e = register_part(r, part++, r->page_buf[i], true, restore);
        for (uint32_t i = 0; e == 0 && r->mode == RING_STREAM && i < r->n_members; i++)
                e = register_part(r, part++, r->counter_buf[i], true, restore);
        return e;
}

/* The options of a new ring, checked; 0 or GPUIPC_E_INVALID with the reason. */
static int create_options(gpuipc_t *c, const gpuipc_ring_options_t *opts, gpuipc_ring_options_t *o)
{
        if (client_copy_options(o, sizeof(*o), opts) < 0) {
                client_errmsg(c, "gpuipc_ring_options_t.struct_size is 0: set it to sizeof(gpuipc_ring_options_t)");
                return GPUIPC_E_INVALID;
        }
        if (!o->kind)
                o->kind = GPUIPC_KIND_MEMFD;
        if (o->slot_size == 0 || (o->kind != GPUIPC_KIND_MEMFD && o->kind != GPUIPC_KIND_CUDA_VMM) ||
            o->slots > RING_MAX_SLOTS || o->max_members > RING_MAX_MEMBERS || o->mode > GPUIPC_RING_STREAM) {
                client_errmsg(c, "a ring needs a slot size, memfd or cuda-vmm slots, at most %d slots and %d members",
                              RING_MAX_SLOTS, RING_MAX_MEMBERS);
                return GPUIPC_E_INVALID;
        }
        if (o->mode == GPUIPC_RING_STREAM && o->kind != GPUIPC_KIND_CUDA_VMM) {
                client_errmsg(c, "a stream-ordered ring needs cuda-vmm slots (its doorbells live in GPU memory)");
                return GPUIPC_E_INVALID;
        }
        return 0;
}

/* Allocates the ring's memory and writes its control page. */
static int create_parts(gpuipc_ring_t *r, const gpuipc_ring_options_t *o)
{
        gpuipc_t *c = r->conn;
        int e = gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, RING_PAGE, 0, &r->ctl_buf);

        for (uint32_t i = 0; e == 0 && i < r->n_members; i++)
                e = gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, RING_PAGE, 0, &r->page_buf[i]);
        for (uint32_t i = 0; e == 0 && i < r->n_slots; i++)
                e = gpuipc_buffer_alloc(c, o->kind, o->slot_size, o->device, &r->slot[i]);
        if (e == 0 && r->mode == RING_STREAM)
                e = ring_stream_alloc(r, o->device);
        if (e < 0)
                return e;
        r->ctl = gpuipc_buffer_ptr(r->ctl_buf);
        r->ctl->magic = RING_MAGIC;
        r->ctl->version = RING_LAYOUT_VERSION;
        r->ctl->n_slots = r->n_slots;
        r->ctl->n_members = r->n_members;
        r->ctl->mode = r->mode;
        r->ctl->slot_size = r->slot_size;
        return 0;
}

_public_ int gpuipc_ring_create(gpuipc_t *c, const char *name, const gpuipc_ring_options_t *opts,
                                gpuipc_ring_t **ret)
{
        gpuipc_ring_options_t o = { 0 };
        gpuipc_ring_t *r;
        int e;

        if (!c || !name || !opts || !ret)
                return GPUIPC_E_INVALID;
        CLIENT_LOCKED(c);
        e = client_check_name(c, name, "ring name", false, RING_NAME_MAX);
        if (e == 0)
                e = create_options(c, opts, &o);
        if (e < 0)
                return e;
        r = ring_new(c, name, true);
        if (!r)
                return -ENOMEM;
        r->mode = o.mode == GPUIPC_RING_LATEST ? RING_LATEST
                  : o.mode == GPUIPC_RING_STREAM ? RING_STREAM : RING_BACKPRESSURE;
        r->n_slots = o.slots ? o.slots : RING_DEFAULT_SLOTS;
        r->n_members = o.max_members ? o.max_members : RING_DEFAULT_MEMBERS;
        r->lease_ms = o.lease_ms ? o.lease_ms : RING_DEFAULT_LEASE_MS;
        r->slot_size = o.slot_size;
        r->kind = o.kind;
        e = create_parts(r, &o);
        if (e == 0)
                e = ring_thread_start(c);
        if (e == 0)
                e = ring_declare(r, false);
        if (e < 0) {
                /* A declaration the broker did not answer in time may still be carried out: its
                 * close follows it, or the name stays taken by a ring that never gets its parts. */
                if (e == GPUIPC_E_TIMEOUT)
                        ring_undo(c, PROTO_OP_RING_CLOSE, r->name);
                ring_free(r);
                return e;
        }
        e = register_parts(r, false);
        if (e < 0) {
                ring_undo(c, PROTO_OP_RING_CLOSE, r->name);
                ring_free(r);
                return e;
        }
        *ret = r;
        return 0;
}

/* ---- member ---- */

/* Attaches part `index` by id into its place (ring_free lets go of it again): page and counter are
 * our seat's. */
static int part_at(gpuipc_ring_t *r, uint32_t index, uint64_t id, uint32_t page, uint32_t counter)
{
        gpuipc_buffer_t **place = index == 0 ? &r->ctl_buf : index <= r->n_slots ? &r->slot[index - 1]
                                  : index == page ? &r->page_part
                                  : index == counter && r->mode == RING_STREAM ? &r->counter_part : NULL;
        size_t want = index > 0 && index <= r->n_slots ? r->slot_size : RING_PAGE;
        int e;

        if (!place || *place)
                return GPUIPC_E_BAD_REPLY; /* not a part of ours, or named twice */
        e = gpuipc_attach_id(r->conn, id, place);
        if (e < 0)
                return e;
        (*place)->ring_part = true; /* after a restart, the ring takes its seat back: no reclaim */
        if (index == counter) {
                if (gpuipc_buffer_kind(*place) != GPUIPC_KIND_CUDA_VMM || !(*place)->writable ||
                    gpuipc_buffer_size(*place) < RING_COUNTER_BYTES) {
                        client_errmsg(r->conn, "ring '%s': its counters are not a writable cuda-vmm buffer of "
                                      "%d bytes or more", r->name, RING_COUNTER_BYTES);
                        return GPUIPC_E_BAD_REPLY;
                }
                r->ordinal = (*place)->ordinal;
                return 0;
        }
        if (gpuipc_buffer_size(*place) != want) {
                client_errmsg(r->conn, "ring '%s': part %u has %zu bytes, not %zu", r->name, index,
                              gpuipc_buffer_size(*place), want);
                return GPUIPC_E_BAD_REPLY;
        }
        return 0;
}

/* Attaches the parts the join reply names. */
static int attach_parts(gpuipc_ring_t *r, const ProtoMsg *m)
{
        uint32_t page = 1 + r->n_slots + r->index, counter = page + r->n_members;
        uint32_t want = r->n_slots + (r->mode == RING_STREAM ? 3 : 2);
        ProtoIter it;
        ProtoMsg rec;
        int e, n = 0;

        proto_iter_init(&it, &m->items);
        while ((e = proto_iter_next(&it, &rec)) == 1) {
                if (!proto_has(&rec, PF_INDEX) || !proto_has(&rec, PF_BUFFER) || rec.index > counter)
                        return GPUIPC_E_BAD_REPLY;
                e = part_at(r, (uint32_t)rec.index, rec.buffer, page, counter);
                if (e < 0)
                        return e;
                n++;
        }
        if (e < 0 || n != (int)want || !r->ctl_buf || !r->page_part || (r->mode == RING_STREAM && !r->counter_part))
                return GPUIPC_E_BAD_REPLY;
        for (uint32_t i = 0; i < r->n_slots; i++)
                if (!r->slot[i])
                        return GPUIPC_E_BAD_REPLY;
        return 0;
}

static int join_request(gpuipc_t *c, const char *name, uint64_t deadline, Frame *f)
{
        for (;;) {
                ProtoMsg req;
                int e;

                proto_request_init(&req, PROTO_OP_RING_JOIN);
                proto_set_name(&req, proto_str(name));
                e = client_request(c, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, f);
                if (e != GPUIPC_E_NOT_FOUND || client_remaining_ms(deadline) == 0)
                        return e;
                (void)client_pump(c, ring_min_timeout(client_remaining_ms(deadline), RING_JOIN_RETRY_MS));
        }
}

/* The ring the join reply f describes: its geometry checked, its parts attached, its control page
 * checked against what the broker said. */
static int join_setup(gpuipc_ring_t *r, Frame *f)
{
        Frame copy = *f; /* the reply's items point into the receive buffer: copied before attaching */
        uint8_t *items;
        int e;

        r->index = (uint32_t)f->msg.index;
        r->epoch = f->msg.generation;
        r->n_slots = (uint32_t)f->msg.slots;
        r->n_members = (uint32_t)f->msg.members;
        r->slot_size = f->msg.size;
        r->mode = f->msg.mode == PROTO_MODE_LATEST ? RING_LATEST
                  : f->msg.mode == PROTO_MODE_STREAM ? RING_STREAM : RING_BACKPRESSURE;
        r->lease_ms = (uint32_t)f->msg.timeout_ms;
        if (r->n_slots == 0 || r->n_slots > RING_MAX_SLOTS || r->n_members == 0 || r->n_members > RING_MAX_MEMBERS ||
            r->index >= r->n_members)
                return GPUIPC_E_BAD_REPLY;
        items = malloc(f->msg.items.len ? f->msg.items.len : 1);
        if (!items)
                return -ENOMEM;
        memcpy(items, f->msg.items.ptr, f->msg.items.len);
        copy.msg.items.ptr = items;
        e = attach_parts(r, &copy.msg);
        free(items);
        if (e < 0)
                return e;
        r->ctl = gpuipc_buffer_ptr(r->ctl_buf);
        r->page = gpuipc_buffer_ptr(r->page_part);
        {
                const RingShape shape = { r->n_slots, r->n_members, r->slot_size, r->mode };
                char why[256];

                if (ring_ctl_check(r->ctl, &shape, why, sizeof(why))) {
                        client_errmsg(r->conn, "ring '%s': its producer's control page is broken: %s", r->name, why);
                        return GPUIPC_E_BAD_REPLY;
                }
        }
        return r->mode == RING_STREAM ? ring_stream_join(r) : 0;
}

_public_ int gpuipc_ring_join(gpuipc_t *c, const char *name, int timeout_ms, gpuipc_ring_t **ret)
{
        uint64_t deadline = client_deadline(timeout_ms);
        Frame f = { .fd = -1 };
        gpuipc_ring_t *r;
        int e;

        if (!c || !name || !ret)
                return GPUIPC_E_INVALID;
        CLIENT_LOCKED(c);
        e = client_check_name(c, name, "ring name", false, RING_NAME_MAX);
        if (e == 0)
                e = join_request(c, name, deadline, &f);
        if (e < 0)
                return e;
        r = ring_new(c, name, false);
        e = r ? join_setup(r, &f) : -ENOMEM;
        frame_free(&f);
        if (e == 0)
                e = ring_thread_start(c);
        if (e < 0) {
                char why[sizeof(c->errmsg)];

                /* Letting go of the parts makes requests, which would clear why the join failed. */
                memcpy(why, c->errmsg, sizeof(why));
                ring_undo(c, PROTO_OP_RING_LEAVE, name);
                if (r)
                        ring_free(r);
                memcpy(c->errmsg, why, sizeof(why));
                return e;
        }
        *ret = r;
        return 0;
}

/* The helper thread behind gpuipc_ring_fd: sleeps on the doorbell like a member, and makes the fd
 * readable whenever head moves or the ring ends (the ring thread also writes the fd when the
 * broker's news ends it). It reads shared memory and writes the fd, nothing else. */
static void *notifier_main(void *arg)
{
        gpuipc_ring_t *r = arg;
        uint64_t seen_head = r->notified_head, one = 1;

        (void)pthread_setname_np(pthread_self(), "gpuipc-ringfd");
        forkgate_leave(); /* started: gpuipc_ring_fd passed the gate for the runtime's setup */
        /* Outside the gate from here: it only reads shared memory, writes the fd and sleeps. */
        while (!r->stop) {
                uint32_t seen = __atomic_load_n(&r->ctl->doorbell, __ATOMIC_ACQUIRE);
                uint64_t head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE);

                if (head != seen_head || ring_member_gone(r)) {
                        seen_head = head;
                        (void)!write(r->efd, &one, sizeof(one));
                }
                /* Until the member is seated the producer does not read its page: nobody would wake
                 * us, so look often. */
                __atomic_fetch_add(&r->page->sleeping, 1, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                if (__atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE) == seen_head && !r->stop)
                        (void)futex_wait(&r->ctl->doorbell, seen,
                                         __atomic_load_n(&r->seated, __ATOMIC_ACQUIRE) ? NOTIFIER_LOOK_MS : 1);
                __atomic_fetch_sub(&r->page->sleeping, 1, __ATOMIC_RELEASE);
        }
        forkgate_enter(); /* ending: notifier_stop lets go once the runtime is done with us */
        return NULL;
}

_public_ int gpuipc_ring_fd(gpuipc_ring_t *r)
{
        int efd;

        if (!r || r->producer)
                return GPUIPC_E_INVALID;
        CLIENT_LOCKED(r->conn);
        if (r->notifier_on)
                return r->efd;
        /* Readable from the start: frames may be waiting already. Then the thread says so whenever
         * head moves past what it saw, counting from before it starts (it may start late). */
        efd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK);
        if (efd < 0)
                return -errno;
        r->notified_head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE);
        r->efd = efd;
        forkgate_enter(); /* for the thread, which leaves once it runs */
        if (pthread_create(&r->notifier, NULL, notifier_main, r) != 0) {
                forkgate_leave();
                r->efd = safe_close(r->efd);
                return -EAGAIN;
        }
        r->notifier_on = true;
        return r->efd;
}

static void notifier_stop(gpuipc_ring_t *r)
{
        if (!r->notifier_on)
                return;
        r->stop = true;
        futex_wake(&r->ctl->doorbell, INT_MAX); /* wakes it (and, harmlessly, anyone else asleep there) */
        pthread_join(r->notifier, NULL);
        forkgate_leave(); /* what the thread passed the gate for on its way out */
        r->notifier_on = false;
        r->efd = safe_close(r->efd);
}

/* Producer: says in the control page that the ring is closed, and wakes members asleep on it. */
static void ring_mark_closed(gpuipc_ring_t *r)
{
        __atomic_store_n(&r->ctl->closed, 1, __ATOMIC_RELEASE);
        __atomic_fetch_add(&r->ctl->doorbell, 1, __ATOMIC_RELEASE);
        futex_wake(&r->ctl->doorbell, INT_MAX);
}

_public_ void gpuipc_ring_close(gpuipc_ring_t *r)
{
        gpuipc_t *c;

        if (!r)
                return;
        c = r->conn;
        CLIENT_LOCKED(c);
        if (r->producer) {
                /* Members see it in the control page at once; the broker forgets the ring, and the
                 * parts go as any buffer: once the last member let go of them. */
                ring_mark_closed(r);
                if (!c->broken)
                        (void)simple_ring_request(c, PROTO_OP_RING_CLOSE, r->name);
        } else {
                notifier_stop(r);
                if (r->taken >= 0)
                        (void)gpuipc_ring_release(r); /* a stream ring's stays queued: no stream to put it in */
                if (!r->gone && !c->broken)
                        (void)simple_ring_request(c, PROTO_OP_RING_LEAVE, r->name);
        }
        ring_free(r);
}

/* Rejoins our seat after a reconnect: at once, or pending until the producer declares its ring
 * again (the broker keeps our claim through its restart grace). */
static int ring_restore_member(gpuipc_ring_t *r)
{
        ProtoMsg req;
        Frame f = { .fd = -1 };
        int e;

        if (__atomic_load_n(&r->gone, __ATOMIC_ACQUIRE))
                return 0;
        proto_request_init(&req, PROTO_OP_RING_JOIN);
        proto_set_name(&req, proto_str(r->name));
        proto_set_restored(&req, true);
        proto_set_index(&req, r->index);
        proto_set_generation(&req, r->epoch);
        e = client_request(r->conn, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f);
        if (e == GPUIPC_E_DISCONNECTED)
                return e;
        if (e < 0) {
                char why[sizeof(r->gone_why)];

                snprintf(why, sizeof(why), "its seat could not be taken back after the broker restarted: %.180s",
                         client_errbuf(r->conn));
                ring_mark_gone(r, why);
                return 0;
        }
        frame_free(&f);
        return 0;
}

/* A producer's ring after a reconnect: seats to renew get their new parts now (the old ones must
 * not come back), then the ring and every part are declared again. */
static int ring_restore_producer(gpuipc_ring_t *r)
{
        int e = 0;

        for (uint32_t i = 0; e == 0 && i < r->n_members; i++)
                if (r->seat[i].renew)
                        e = seat_replace(r, i);
        if (e == 0)
                e = ring_declare(r, true);
        if (e == 0)
                e = register_parts(r, true);
        if (e == 0) {
                pthread_mutex_lock(&r->lock);
                for (uint32_t i = 0; i < r->n_members; i++)
                        r->seat[i].renew = r->seat[i].replaced = false;
                pthread_mutex_unlock(&r->lock);
        }
        return e;
}

int ring_after_reconnect(gpuipc_t *c)
{
        list_for_each(pos, &c->rings) {
                gpuipc_ring_t *r = list_entry(pos, gpuipc_ring_t, link);
                int e = r->producer ? ring_restore_producer(r) : ring_restore_member(r);

                /* A producer whose ring cannot come back goes on in shared memory; members that lose
                 * their seat hear so from the broker when the grace ends. */
                if (e == GPUIPC_E_DISCONNECTED)
                        return e;
        }
        return 0;
}

void ring_close_all(gpuipc_t *c)
{
        while (!list_empty(&c->rings))
                gpuipc_ring_close(list_entry(c->rings.next, gpuipc_ring_t, link));
}

void ring_abandon_all(gpuipc_t *c)
{
        while (!list_empty(&c->rings)) {
                gpuipc_ring_t *r = list_entry(c->rings.next, gpuipc_ring_t, link);

                /* Members see the ring closed at once, as after gpuipc_ring_close (their takes end, not
                 * fail): the control page is host memory of ours, and it stays mapped. */
                if (r->producer)
                        ring_mark_closed(r);
                notifier_stop(r); /* its thread reads the control page: it goes before the ring */
                list_unlink(&r->link);
                pthread_mutex_destroy(&r->lock);
                free(r);
        }
}
