/* Rings (gpuipc.h, docs/design.md "Rings"): a producer's slots and a control page in shared
 * memory, member pages each member alone writes, futex doorbells. The broker is asked only to set
 * up, join, leave, evict and close; frames go through shared memory alone.
 *
 * Who writes what (proto/ring.h): the producer writes the control page and the slots, member i its
 * page. Each side reads the other's memory as untrusted input: the producer through
 * ring_member_view, a member checking every index and sequence number before use. So a member that
 * scribbles over its own page can stall its own frames (and the producer up to the lease), never
 * another member's, and a member never returns a frame it cannot vouch for.
 *
 * Every hand-over is a store, a sequentially consistent fence, and a load on each side:
 *   - a held frame: the producer marks the slot it is about to write (slot_seq = 0), fences, then
 *     looks at what members hold; a member says what it holds (held / released), fences, then checks
 *     the slot still holds that frame. One of the two sees the other, so no frame is overwritten
 *     while a member holds it, or the member learns it did not get it;
 *   - a doorbell: a member says it sleeps, fences, looks at head once more, then futex-waits on the
 *     doorbell value it read before; the producer moves head and the doorbell, fences, then wakes
 *     whoever said it sleeps. Nobody sleeps through a publish. */
#include <errno.h>
#include <poll.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "futex.h"
#include "internal.h"
#include "macro.h"
#include "ring.h"
#include "ring-internal.h"

#define RING_PUMP_MS 1           /* a ring call reads the socket at most this often */
#define RING_RENEW_RETRY_MS 50    /* a seat renewal that failed is tried again after this */
#define NOTIFIER_LOOK_MS 200      /* a ring fd's helper thread looks at the socket at least this often */
#define RING_SLEEP_SLICE_MS 10   /* ... and never sleeps longer than this without looking */
#define RING_JOIN_RETRY_MS 20    /* a joiner asks again this often while the ring does not exist */
#define RING_DEFAULT_SLOTS 4
#define RING_DEFAULT_MEMBERS 4
#define RING_DEFAULT_LEASE_MS 2000

int ring_remaining_ms(uint64_t deadline)
{
        uint64_t now = client_now_ms();

        if (deadline == UINT64_MAX)
                return -1;
        return now >= deadline ? 0 : (int)MIN(deadline - now, (uint64_t)INT32_MAX);
}

uint64_t ring_deadline_of(int timeout_ms)
{
        return timeout_ms < 0 ? UINT64_MAX : client_now_ms() + (uint64_t)timeout_ms;
}

int ring_min_timeout(int a, int b)
{
        if (a < 0)
                return b;
        if (b < 0)
                return a;
        return a < b ? a : b;
}

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

/* ---- membership (events from the broker) ---- */

static void seat_activate(gpuipc_ring_t *r, uint32_t i, uint64_t epoch)
{
        volatile RingMemberSlot *s = &r->ctl->member[i];

        /* A stream ring's counters are reset before the member can see its seat. Should that fail
         * (a CUDA error), the seat is not handed out: the member's join then times out, with the
         * error in our errmsg. */
        if (r->mode == RING_STREAM && ring_stream_seat_reset(r, i, r->next) < 0)
                return;
        /* A new member takes frames from the next publish on. start and epoch are stored before the
         * state (release): a member that reads its epoch there also reads its start. */
        r->seat[i] = (Seat){ .active = true, .epoch = epoch, .start = r->next };
        s->start = r->next;
        __atomic_store_n(&s->epoch, epoch, __ATOMIC_RELEASE);
        __atomic_store_n(&s->state, RING_MEMBER_ACTIVE, __ATOMIC_RELEASE);
}

static void seat_deactivate(gpuipc_ring_t *r, uint32_t i)
{
        r->seat[i].active = false;
        __atomic_store_n(&r->ctl->member[i].state, RING_MEMBER_FREE, __ATOMIC_RELEASE);
        /* Our stream must not stay queued behind a member that left. */
        if (r->mode == RING_STREAM)
                ring_stream_seat_unblock(r, i);
}

void ring_on_event(gpuipc_t *c, const ProtoMsg *m)
{
        gpuipc_ring_t *r = ring_by_name(c, m->name.ptr, m->name.len);

        if (!r || !proto_has(m, PF_INDEX))
                return; /* a ring we closed already */
        if (!r->producer) {
                if (m->event == PROTO_EV_MEMBER_LEFT && m->index == r->index && m->generation == r->epoch) {
                        r->gone = true;
                        proto_str_copy(m->reason, r->gone_why, sizeof(r->gone_why));
                }
                return;
        }
        if (m->index >= r->n_members)
                return;
        if (m->event == PROTO_EV_MEMBER_JOINED) {
                seat_activate(r, (uint32_t)m->index, m->generation);
                r->max_epoch = MAX(r->max_epoch, m->generation);
                return;
        }
        if (r->seat[m->index].active && r->seat[m->index].epoch == m->generation)
                seat_deactivate(r, (uint32_t)m->index);
        /* Whichever membership it was, the broker let go of the seat's page with it (and hands the
         * seat out again only with new ones): renewed by ring_renew_seats, outside event dispatch. */
        r->seat[m->index].renew = true;
        r->renew_pending = true;
}

static int register_part(gpuipc_ring_t *r, uint32_t index, gpuipc_buffer_t *b, bool writable, bool restore);

/* Makes seat i's new page (and counters) and lets go of the old ones; they are registered next. */
static int seat_replace(gpuipc_ring_t *r, uint32_t i)
{
        gpuipc_buffer_t *fresh = NULL;
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
        /* The broker forgets the old page; a member that left may keep its own mapping of it. */
        (void)gpuipc_buffer_free(r->conn, r->page_buf[i]);
        r->page_buf[i] = fresh;
        r->seat[i].replaced = true;
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
        if (e == 0)
                r->seat[i].renew = r->seat[i].replaced = false;
        return e;
}

/* Renews the seats whose memberships ended. Called where requests may be made (never from event
 * dispatch, nor from within itself); a failure is retried a little later, and leaves the caller's
 * error message as it was. */
static void ring_renew_seats(gpuipc_ring_t *r)
{
        gpuipc_t *c = r->conn;
        char saved[sizeof(c->errmsg)];

        if (!r->producer || !r->renew_pending || r->renewing || client_now_ms() < r->renew_retry_ms)
                return;
        memcpy(saved, c->errmsg, sizeof(saved));
        r->renewing = true;
        r->renew_pending = false;
        for (uint32_t i = 0; i < r->n_members; i++)
                if (r->seat[i].renew && seat_renew(r, i) < 0) {
                        r->renew_pending = true;
                        r->renew_retry_ms = client_now_ms() + RING_RENEW_RETRY_MS;
                }
        r->renewing = false;
        memcpy(c->errmsg, saved, sizeof(saved));
}

void ring_after_events(gpuipc_t *c)
{
        list_for_each(pos, &c->rings)
                ring_renew_seats(list_entry(pos, gpuipc_ring_t, link));
}

/* Both sides read the socket now and then in their ring calls, never more than once a millisecond
 * and never waiting: that is how a producer learns of members joining and leaving without a round
 * trip per frame, and how either side notices a broker restart and takes its ring or seat back
 * within the restart grace even when frames never keep it waiting. */
void ring_maybe_pump(gpuipc_ring_t *r, bool now)
{
        uint64_t t = client_now_ms();

        if (now || t - r->last_pump_ms >= RING_PUMP_MS) {
                r->last_pump_ms = t;
                (void)client_pump(r->conn, 0);
        }
        ring_renew_seats(r);
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
        for (uint32_t i = 0; i < r->n_members; i++)
                if (r->page_buf[i])
                        gpuipc_buffer_free(c, r->page_buf[i]);
        if (r->page_part)
                gpuipc_release(c, r->page_part);
        if (r->ctl_buf)
                (r->producer ? gpuipc_buffer_free : gpuipc_release)(c, r->ctl_buf);
        list_unlink(&r->link);
        free(r);
}

/* Registers part `index` (0: the control page, then the slots, the member pages and a stream ring's
 * counters); restore:
 * again after a restart, under its id and generation. */
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
        if (b->device[0]) {
                proto_set_device(&req, proto_str(b->device));
        }
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

/* Declares the ring to the broker; restore: again after a restart, with the seats we count as
 * seated, so that their members can take them back. */
static int ring_declare(gpuipc_ring_t *r, bool restore)
{
        ProtoMsg req;
        Frame f = { .fd = -1 };
        ProtoItems seats;
        int e;

        proto_request_init(&req, PROTO_OP_RING_CREATE);
        proto_items_init(&seats, PROTO_MAX_BODY / 2);
        if (restore) {
                for (uint32_t i = 0; i < r->n_members; i++) {
                        ProtoMsg rec;

                        proto_record_init(&rec);
                        proto_set_index(&rec, i);
                        proto_set_generation(&rec, r->seat[i].epoch);
                        if (r->seat[i].active && !proto_items_add(&seats, &rec)) {
                                proto_items_free(&seats);
                                return -ENOMEM;
                        }
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
        if (r->slot[0]->device[0]) {
                proto_set_device(&req, proto_str(r->slot[0]->device));
        }
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

_public_ int gpuipc_ring_create(gpuipc_t *c, const char *name, const gpuipc_ring_options_t *opts,
                                gpuipc_ring_t **ret)
{
        gpuipc_ring_options_t o = { 0 };
        gpuipc_ring_t *r;
        int e;

        if (!c || !name || !opts || !ret)
                return GPUIPC_E_INVALID;
        e = client_check_name(c, name, "ring name", false, RING_NAME_MAX);
        if (e < 0)
                return e;
        if (client_copy_options(&o, sizeof(o), opts) < 0) {
                client_errmsg(c, "gpuipc_ring_options_t.struct_size is 0: set it to sizeof(gpuipc_ring_options_t)");
                return GPUIPC_E_INVALID;
        }
        if (!o.kind)
                o.kind = GPUIPC_KIND_MEMFD;
        if (o.slot_size == 0 || (o.kind != GPUIPC_KIND_MEMFD && o.kind != GPUIPC_KIND_CUDA_VMM) ||
            o.slots > RING_MAX_SLOTS || o.max_members > RING_MAX_MEMBERS || o.mode > GPUIPC_RING_STREAM) {
                client_errmsg(c, "a ring needs a slot size, memfd or cuda-vmm slots, at most %d slots and %d members",
                              RING_MAX_SLOTS, RING_MAX_MEMBERS);
                return GPUIPC_E_INVALID;
        }
        if (o.mode == GPUIPC_RING_STREAM && o.kind != GPUIPC_KIND_CUDA_VMM) {
                client_errmsg(c, "a stream-ordered ring needs cuda-vmm slots (its doorbells live in GPU memory)");
                return GPUIPC_E_INVALID;
        }
        r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->conn = c;
        r->producer = true;
        snprintf(r->name, sizeof(r->name), "%s", name);
        r->mode = o.mode == GPUIPC_RING_LATEST ? RING_LATEST
                  : o.mode == GPUIPC_RING_STREAM ? RING_STREAM : RING_BACKPRESSURE;
        r->n_slots = o.slots ? o.slots : RING_DEFAULT_SLOTS;
        r->n_members = o.max_members ? o.max_members : RING_DEFAULT_MEMBERS;
        r->lease_ms = o.lease_ms ? o.lease_ms : RING_DEFAULT_LEASE_MS;
        r->slot_size = o.slot_size;
        r->kind = o.kind;
        r->next = 1;
        r->writing = -1;
        r->taken = -1;
        r->efd = -1;
        list_append(&c->rings, &r->link);

        e = gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, RING_PAGE, 0, &r->ctl_buf);
        for (uint32_t i = 0; e == 0 && i < r->n_members; i++)
                e = gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, RING_PAGE, 0, &r->page_buf[i]);
        for (uint32_t i = 0; e == 0 && i < r->n_slots; i++)
                e = gpuipc_buffer_alloc(c, o.kind, o.slot_size, o.device, &r->slot[i]);
        if (e == 0 && r->mode == RING_STREAM)
                e = ring_stream_alloc(r, o.device);
        if (e < 0)
                goto fail;
        r->ctl = gpuipc_buffer_ptr(r->ctl_buf);
        r->ctl->magic = RING_MAGIC;
        r->ctl->version = RING_LAYOUT_VERSION;
        r->ctl->n_slots = r->n_slots;
        r->ctl->n_members = r->n_members;
        r->ctl->mode = r->mode;
        r->ctl->slot_size = r->slot_size;

        e = ring_declare(r, false);
        if (e < 0)
                goto fail;
        e = register_parts(r, false);
        if (e < 0) {
                char why[sizeof(c->errmsg)];

                memcpy(why, c->errmsg, sizeof(why));
                (void)simple_ring_request(c, PROTO_OP_RING_CLOSE, r->name);
                memcpy(c->errmsg, why, sizeof(why));
                goto fail;
        }
        *ret = r;
        return 0;

fail:
        ring_free(r);
        return e;
}

/* Backpressure: which active member still holds the frame that frame r->next overwrites, or -1. */
static int ring_blocker(gpuipc_ring_t *r, uint64_t head)
{
        for (uint32_t i = 0; i < r->n_members; i++) {
                Seat *s = &r->seat[i];
                RingMemberView v;

                if (!s->active)
                        continue;
                v = ring_member_view(gpuipc_buffer_ptr(r->page_buf[i]), s->epoch, s->start, head);
                if (!ring_member_lets(&v, s->start, r->next, r->n_slots))
                        return (int)i;
                s->blocking_since = 0;
        }
        return -1;
}

/* The producer gives up on member i: it held the ring up past the lease. */
void ring_evict(gpuipc_ring_t *r, uint32_t i)
{
        ProtoMsg req;
        Frame f = { .fd = -1 };

        seat_deactivate(r, i);
        proto_request_init(&req, PROTO_OP_RING_EVICT);
        proto_set_name(&req, proto_str(r->name));
        proto_set_index(&req, i);
        proto_set_generation(&req, r->seat[i].epoch);
        /* The broker only keeps its books here; the member already counts as gone for us. */
        if (client_request(r->conn, &req, -1, CLIENT_REQUEST_TIMEOUT_MS, &f) == 0)
                frame_free(&f);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
}

static uint64_t monotonic_ns(void)
{
        struct timespec t;

        clock_gettime(CLOCK_MONOTONIC, &t);
        return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Busy-waits up to spin_us (and limit_ms) for member b to let frame r->next through. */
static bool spin_until_free(gpuipc_ring_t *r, uint64_t head, int b, int limit_ms)
{
        uint64_t t0 = monotonic_ns(), spin_ns = (uint64_t)r->spin_us * 1000;

        if (limit_ms >= 0 && (uint64_t)limit_ms * 1000000 < spin_ns)
                spin_ns = (uint64_t)limit_ms * 1000000;
        do {
                if (ring_blocker(r, head) != b)
                        return true;
                cpu_relax();
        } while (monotonic_ns() - t0 < spin_ns);
        return false;
}

/* Backpressure: waits until the slot of frame r->next is free. */
static int wait_for_members(gpuipc_ring_t *r, uint64_t deadline)
{
        unsigned fruitless = 0;

        for (;;) {
                uint64_t head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE), now;
                int b = ring_blocker(r, head), left;
                volatile RingMember *page;
                uint32_t word;

                if (b < 0)
                        return 0;
                now = client_now_ms();
                if (!r->seat[b].blocking_since)
                        r->seat[b].blocking_since = now;
                if (now - r->seat[b].blocking_since >= r->lease_ms) {
                        ring_evict(r, (uint32_t)b);
                        continue;
                }
                left = ring_remaining_ms(deadline);
                if (left == 0) {
                        client_errmsg(r->conn, "ring '%s': member %d still holds frame %llu", r->name, b,
                                      (unsigned long long)(r->next - r->n_slots));
                        return GPUIPC_E_TIMEOUT;
                }
                if (r->spin_us && spin_until_free(r, head, b, left))
                        continue;
                /* Sleep on its release word: say so, fence, look once more, then wait. */
                page = gpuipc_buffer_ptr(r->page_buf[b]);
                word = __atomic_load_n(&page->wake, __ATOMIC_ACQUIRE);
                __atomic_store_n(&r->ctl->producer_waiting, 1, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                if (ring_blocker(r, head) == b) {
                        int slice = ring_min_timeout(left, RING_SLEEP_SLICE_MS);
                        slice = ring_min_timeout(slice, (int)(r->seat[b].blocking_since + r->lease_ms - now));
                        if (futex_wait(&page->wake, word, slice) == 0 && ++fruitless % 64 == 0)
                                usleep(1000); /* a member that bumps its word for nothing costs us little */
                }
                __atomic_store_n(&r->ctl->producer_waiting, 0, __ATOMIC_RELAXED);
                ring_maybe_pump(r, false);
        }
}

/* Latest mode: a slot nobody holds, not the newest frame's; marked as being written. The producer
 * says it means to write a slot (intent), fences, then looks at what members hold; a member says
 * what it holds, fences, then checks nobody means to write it. slot_seq itself changes only once
 * the producer is sure, so a member's check on release is exact. */
static int pick_free_slot(gpuipc_ring_t *r)
{
        uint64_t head = __atomic_load_n(&r->ctl->head, __ATOMIC_RELAXED);
        uint32_t head_slot = r->ctl->head_slot;
        bool tried[RING_MAX_SLOTS] = { false };

        for (uint32_t round = 0; round < r->n_slots; round++) {
                int best = -1;
                uint64_t old;
                bool pinned = false;

                /* The oldest frame first (never-written slots have 0). */
                for (uint32_t s = 0; s < r->n_slots; s++)
                        if (!tried[s] && !(head && s == head_slot) &&
                            (best < 0 || r->ctl->slot_seq[s] < r->ctl->slot_seq[best]))
                                best = (int)s;
                if (best < 0)
                        break;
                tried[best] = true;
                old = r->ctl->slot_seq[best];
                __atomic_store_n(&r->ctl->intent[best], 1, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                for (uint32_t i = 0; old && i < r->n_members && !pinned; i++) {
                        RingMemberView v;

                        if (!r->seat[i].active)
                                continue;
                        v = ring_member_view(gpuipc_buffer_ptr(r->page_buf[i]), r->seat[i].epoch, r->seat[i].start,
                                             head);
                        pinned = v.valid && v.held == old;
                }
                if (!pinned) {
                        __atomic_store_n(&r->ctl->slot_seq[best], 0, __ATOMIC_RELAXED);
                        __atomic_thread_fence(__ATOMIC_SEQ_CST);
                        return best;
                }
                __atomic_store_n(&r->ctl->intent[best], 0, __ATOMIC_RELEASE); /* still theirs */
        }
        client_errmsg(r->conn, "ring '%s': every slot is held by a member", r->name);
        return GPUIPC_E_BUSY;
}

/* The host calls (acquire/publish, take/release): r on the right side, and not stream-ordered. */
static int host_call(gpuipc_ring_t *r, bool producer)
{
        if (!r || r->producer != producer)
                return GPUIPC_E_INVALID;
        if (r->mode == RING_STREAM) {
                client_errmsg(r->conn, "ring '%s' is stream-ordered: use gpuipc_ring_stream_%s", r->name,
                              producer ? "acquire/publish" : "take/release");
                return GPUIPC_E_STATE;
        }
        return 0;
}

_public_ int gpuipc_ring_acquire(gpuipc_ring_t *r, int timeout_ms, gpuipc_buffer_t **ret_slot)
{
        int s, e;

        e = host_call(r, true);
        if (e < 0 || !ret_slot)
                return e < 0 ? e : GPUIPC_E_INVALID;
        if (r->writing < 0) {
                ring_maybe_pump(r, false);
                if (r->mode == RING_BACKPRESSURE) {
                        e = wait_for_members(r, ring_deadline_of(timeout_ms));
                        if (e < 0)
                                return e;
                        s = (int)((r->next - 1) % r->n_slots);
                        /* Mark it: a member that took the old frame learns it was overwritten. */
                        __atomic_store_n(&r->ctl->slot_seq[s], 0, __ATOMIC_RELAXED);
                        __atomic_thread_fence(__ATOMIC_SEQ_CST);
                } else {
                        s = pick_free_slot(r);
                        if (s < 0)
                                return s;
                }
                r->writing = s;
        }
        *ret_slot = r->slot[r->writing];
        return 0;
}

_public_ int gpuipc_ring_publish(gpuipc_ring_t *r, uint64_t *ret_frame)
{
        volatile RingCtl *ctl;
        bool wake = false;
        uint64_t n;
        int s, e;

        e = host_call(r, true);
        if (e < 0)
                return e;
        if (r->writing < 0) {
                client_errmsg(r->conn, "ring '%s': acquire a slot before publishing", r->name);
                return GPUIPC_E_STATE;
        }
        ctl = r->ctl;
        s = r->writing;
        n = r->next;
        if (kind_ops(r->slot[s]->kind)->sync) {
                e = kind_ops(r->slot[s]->kind)->sync(r->conn, r->slot[s]);
                if (e < 0)
                        return e;
        }
        __atomic_store_n(&ctl->slot_seq[s], n, __ATOMIC_RELEASE);
        __atomic_store_n(&ctl->intent[s], 0, __ATOMIC_RELEASE);
        __atomic_store_n(&ctl->head_slot, (uint32_t)s, __ATOMIC_RELAXED);
        __atomic_store_n(&ctl->head, n, __ATOMIC_RELEASE);
        __atomic_fetch_add(&ctl->doorbell, 1, __ATOMIC_RELEASE);
        /* Against a member that is about to sleep: it said so (sleeping), then looks at head. */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        for (uint32_t i = 0; i < r->n_members && !wake; i++) {
                RingMemberView v;

                if (!r->seat[i].active)
                        continue;
                v = ring_member_view(gpuipc_buffer_ptr(r->page_buf[i]), r->seat[i].epoch, r->seat[i].start, n);
                wake = v.sleeping;
        }
        if (wake)
                futex_wake(&ctl->doorbell, INT_MAX);
        r->writing = -1;
        r->next++;
        if (ret_frame)
                *ret_frame = n;
        ring_maybe_pump(r, false);
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
                if (e != GPUIPC_E_NOT_FOUND || ring_remaining_ms(deadline) == 0)
                        return e;
                (void)client_pump(c, ring_min_timeout(ring_remaining_ms(deadline), RING_JOIN_RETRY_MS));
        }
}

/* Has the producer let us in yet (our epoch in our seat of the control page)? It does so in its next
 * ring call after the broker told it we joined; we take frames from then on. Our page then says
 * that everything before our first frame counts as released; the epoch last, so that the producer
 * believes the page only once it is ours. */
bool ring_check_seated(gpuipc_ring_t *r)
{
        volatile RingMemberSlot *s = &r->ctl->member[r->index];

        if (r->seated)
                return true;
        if (__atomic_load_n(&s->epoch, __ATOMIC_ACQUIRE) != r->epoch)
                return false;
        r->cursor = r->mode != RING_LATEST ? s->start : 0;
        r->page->released = r->mode != RING_LATEST && r->cursor ? r->cursor - 1 : 0;
        r->page->held = 0;
        __atomic_store_n(&r->page->epoch, r->epoch, __ATOMIC_RELEASE);
        r->seated = true;
        return true;
}

_public_ int gpuipc_ring_join(gpuipc_t *c, const char *name, int timeout_ms, gpuipc_ring_t **ret)
{
        uint64_t deadline = ring_deadline_of(timeout_ms);
        Frame f = { .fd = -1 };
        gpuipc_ring_t *r;
        int e;

        if (!c || !name || !ret)
                return GPUIPC_E_INVALID;
        e = client_check_name(c, name, "ring name", false, RING_NAME_MAX);
        if (e < 0)
                return e;
        e = join_request(c, name, deadline, &f);
        if (e < 0)
                return e;
        r = calloc(1, sizeof(*r));
        if (!r) {
                frame_free(&f);
                (void)simple_ring_request(c, PROTO_OP_RING_LEAVE, name);
                return -ENOMEM;
        }
        r->conn = c;
        snprintf(r->name, sizeof(r->name), "%s", name);
        r->index = (uint32_t)f.msg.index;
        r->epoch = f.msg.generation;
        r->n_slots = (uint32_t)f.msg.slots;
        r->n_members = (uint32_t)f.msg.members;
        r->slot_size = f.msg.size;
        r->mode = f.msg.mode == PROTO_MODE_LATEST ? RING_LATEST
                  : f.msg.mode == PROTO_MODE_STREAM ? RING_STREAM : RING_BACKPRESSURE;
        r->lease_ms = (uint32_t)f.msg.timeout_ms;
        r->writing = r->taken = -1;
        r->efd = -1;
        list_append(&c->rings, &r->link);
        if (r->n_slots == 0 || r->n_slots > RING_MAX_SLOTS || r->n_members == 0 || r->n_members > RING_MAX_MEMBERS ||
            r->index >= r->n_members) {
                e = GPUIPC_E_BAD_REPLY;
        } else {
                Frame copy = f; /* the reply's items point into the receive buffer: attach them first */
                uint8_t *items = malloc(f.msg.items.len ? f.msg.items.len : 1);

                e = items ? 0 : -ENOMEM;
                if (items) {
                        memcpy(items, f.msg.items.ptr, f.msg.items.len);
                        copy.msg.items.ptr = items;
                        e = attach_parts(r, &copy.msg);
                        free(items);
                }
        }
        frame_free(&f);
        if (e == 0) {
                r->ctl = gpuipc_buffer_ptr(r->ctl_buf);
                r->page = gpuipc_buffer_ptr(r->page_part);
                const RingShape shape = { r->n_slots, r->n_members, r->slot_size, r->mode };
                char why[256];

                if (ring_ctl_check(r->ctl, &shape, why, sizeof(why))) {
                        client_errmsg(c, "ring '%s': its producer's control page is broken: %s", name, why);
                        e = GPUIPC_E_BAD_REPLY;
                } else if (r->mode == RING_STREAM) {
                        e = ring_stream_join(r);
                }
        }
        if (e < 0) {
                char why[sizeof(c->errmsg)];

                memcpy(why, c->errmsg, sizeof(why));
                (void)simple_ring_request(c, PROTO_OP_RING_LEAVE, name);
                ring_free(r);
                memcpy(c->errmsg, why, sizeof(why));
                return e;
        }
        *ret = r;
        return 0;
}

/* Was this member evicted (its seat given up by the producer)? */
bool ring_member_evicted(gpuipc_ring_t *r)
{
        volatile RingMemberSlot *s = &r->ctl->member[r->index];

        return r->seated && (__atomic_load_n(&s->epoch, __ATOMIC_ACQUIRE) != r->epoch ||
                             __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != RING_MEMBER_ACTIVE);
}

/* Why this member may take nothing any more, or NULL. */
const char *ring_member_gone(gpuipc_ring_t *r)
{
        if (r->gone)
                return r->gone_why;
        if (gpuipc_buffer_revoked(r->ctl_buf))
                return "its producer is gone";
        if (ring_member_evicted(r))
                return "this member lost its seat (its producer evicted it: it held the ring up past its lease, "
                       "or did not take its seat back within a broker restart's grace)";
        if (__atomic_load_n(&r->ctl->closed, __ATOMIC_ACQUIRE))
                return "the producer closed the ring";
        return NULL;
}

int ring_member_may_take(gpuipc_ring_t *r)
{
        if (r->taken < 0)
                return 0;
        client_errmsg(r->conn, "ring '%s': release frame %llu first", r->name, (unsigned long long)r->taken_frame);
        return GPUIPC_E_STATE;
}

int ring_member_alive(gpuipc_ring_t *r)
{
        const char *why;

        /* News from the broker (eviction, revocation, a restart) comes over the socket. */
        ring_maybe_pump(r, false);
        why = ring_member_gone(r);
        if (!why)
                return 0;
        client_errmsg(r->conn, "ring '%s': %s", r->name, why);
        return GPUIPC_E_REVOKED;
}

/* One attempt: 1 with the frame taken, 0 when there is none yet, or an error. */
static int try_take(gpuipc_ring_t *r)
{
        volatile RingCtl *ctl = r->ctl;
        uint64_t head, seq;
        uint32_t s;

        if (!ring_check_seated(r))
                return 0;
        head = __atomic_load_n(&ctl->head, __ATOMIC_ACQUIRE);
        if (r->mode == RING_BACKPRESSURE) {
                if (head < r->cursor)
                        return 0;
                s = (uint32_t)((r->cursor - 1) % r->n_slots);
                seq = __atomic_load_n(&ctl->slot_seq[s], __ATOMIC_ACQUIRE);
                if (seq != r->cursor) {
                        client_errmsg(r->conn, "ring '%s': frame %llu was overwritten before this member took it",
                                      r->name, (unsigned long long)r->cursor);
                        return GPUIPC_E_REVOKED;
                }
                r->taken = (int)s;
                r->taken_frame = r->cursor;
                return 1;
        }
        for (;;) {
                if (head == 0 || head <= r->cursor)
                        return 0;
                s = __atomic_load_n(&ctl->head_slot, __ATOMIC_RELAXED);
                if (s >= r->n_slots) {
                        client_errmsg(r->conn, "ring '%s': its control page names slot %u of %u", r->name, s,
                                      r->n_slots);
                        return GPUIPC_E_BAD_REPLY;
                }
                /* Say what we hold, fence, then check nobody means to overwrite it and it is still
                 * there (the producer does the reverse: intent, fence, what members hold). */
                __atomic_store_n(&r->page->held, head, __ATOMIC_RELAXED);
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                if (!__atomic_load_n(&ctl->intent[s], __ATOMIC_ACQUIRE) &&
                    __atomic_load_n(&ctl->slot_seq[s], __ATOMIC_ACQUIRE) == head) {
                        r->taken = (int)s;
                        r->taken_frame = head;
                        return 1;
                }
                __atomic_store_n(&r->page->held, 0, __ATOMIC_RELEASE);
                head = __atomic_load_n(&ctl->head, __ATOMIC_ACQUIRE);
        }
}

/* Sleeps until the doorbell moves from `seen` (or timeout_ms), unless a frame is there already. Not
 * seated yet, we cannot say we sleep (the producer reads our page only once we are): its publish
 * rings the doorbell then anyway, but nobody wakes us for it, so we sleep in short slices. */
void ring_doorbell_sleep(gpuipc_ring_t *r, uint32_t seen, int timeout_ms)
{
        uint64_t before = r->mode != RING_LATEST ? r->cursor : r->cursor + 1;

        if (!r->seated) {
                (void)futex_wait(&r->ctl->doorbell, seen, ring_min_timeout(timeout_ms, 1));
                return;
        }
        __atomic_fetch_add(&r->page->sleeping, 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE) < before && !ring_member_gone(r))
                (void)futex_wait(&r->ctl->doorbell, seen, timeout_ms);
        __atomic_fetch_sub(&r->page->sleeping, 1, __ATOMIC_RELEASE);
}

static void spin_for_frame(gpuipc_ring_t *r, int limit_ms)
{
        uint64_t before = r->mode != RING_LATEST ? r->cursor : r->cursor + 1;
        uint64_t t0 = monotonic_ns(), spin_ns = (uint64_t)r->spin_us * 1000;

        if (!r->seated)
                return;
        if (limit_ms >= 0 && (uint64_t)limit_ms * 1000000 < spin_ns)
                spin_ns = (uint64_t)limit_ms * 1000000;
        do {
                if (__atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE) >= before)
                        return;
                cpu_relax();
        } while (monotonic_ns() - t0 < spin_ns);
}

static void drain_fd(gpuipc_ring_t *r)
{
        uint64_t v;

        if (r->efd >= 0)
                (void)!read(r->efd, &v, sizeof(v));
}

_public_ int gpuipc_ring_take(gpuipc_ring_t *r, int timeout_ms, gpuipc_buffer_t **ret_slot, uint64_t *ret_frame)
{
        uint64_t deadline = ring_deadline_of(timeout_ms);
        bool drained = false;
        int e;

        e = host_call(r, false);
        if (e < 0 || !ret_slot)
                return e < 0 ? e : GPUIPC_E_INVALID;
        e = ring_member_may_take(r);
        if (e < 0)
                return e;
        for (;;) {
                uint32_t seen = __atomic_load_n(&r->ctl->doorbell, __ATOMIC_ACQUIRE);
                int left;

                e = ring_member_alive(r);
                if (e < 0)
                        return e;
                e = try_take(r);
                if (e < 0)
                        return e;
                if (e == 1)
                        break;
                left = ring_remaining_ms(deadline);
                if (left == 0) {
                        /* Event-loop users: reset the fd, then look once more (a frame that came
                         * meanwhile would otherwise wait for the next publish). */
                        if (r->efd >= 0 && !drained) {
                                drain_fd(r);
                                drained = true;
                                continue;
                        }
                        return GPUIPC_E_TIMEOUT;
                }
                if (r->spin_us)
                        spin_for_frame(r, left);
                ring_doorbell_sleep(r, seen, ring_min_timeout(left, 100));
        }
        *ret_slot = r->slot[r->taken];
        if (ret_frame)
                *ret_frame = r->taken_frame;
        return 0;
}


_public_ int gpuipc_ring_release(gpuipc_ring_t *r)
{
        uint64_t n;
        bool intact;
        int s, e;

        e = host_call(r, false);
        if (e < 0)
                return e;
        if (r->taken < 0) {
                client_errmsg(r->conn, "ring '%s': no frame is taken", r->name);
                return GPUIPC_E_STATE;
        }
        s = r->taken;
        n = r->taken_frame;
        /* Still ours when we let go? Then it did not change while we held it (a closed ring or a dead
         * producer writes nothing; only an evicted member may have lost its frame). */
        intact = __atomic_load_n(&r->ctl->slot_seq[s], __ATOMIC_ACQUIRE) == n && !ring_member_evicted(r);
        if (r->mode == RING_BACKPRESSURE) {
                __atomic_store_n(&r->page->released, n, __ATOMIC_RELEASE);
                r->cursor = n + 1;
        } else {
                __atomic_store_n(&r->page->held, 0, __ATOMIC_RELEASE);
                r->cursor = n;
        }
        __atomic_fetch_add(&r->page->wake, 1, __ATOMIC_RELEASE);
        /* Against the producer that is about to sleep on our word: it said so, then looks. */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&r->ctl->producer_waiting, __ATOMIC_ACQUIRE))
                futex_wake(&r->page->wake, 1);
        r->taken = -1;
        if (!intact) {
                client_errmsg(r->conn, "ring '%s': frame %llu was overwritten while held (%s)", r->name,
                              (unsigned long long)n, ring_member_evicted(r) ? ring_member_gone(r) : "the slot changed");
                return GPUIPC_E_REVOKED;
        }
        return 0;
}

_public_ void gpuipc_ring_set_spin(gpuipc_ring_t *r, unsigned spin_us)
{
        if (r)
                r->spin_us = spin_us;
}

/* Whether the broker sent something this member has not read yet: its producer's death, an
 * eviction, a restart come that way, not through shared memory. Polling reads nothing; the fd is
 * the calling thread's (a reconnect may replace it: at worst one wake-up for nothing). */
static bool broker_has_news(const gpuipc_ring_t *r)
{
        struct pollfd p = { .fd = __atomic_load_n(&r->conn->fd, __ATOMIC_RELAXED), .events = POLLIN };

        return p.fd >= 0 && poll(&p, 1, 0) == 1;
}

/* The helper thread behind gpuipc_ring_fd: sleeps on the doorbell like a member, and makes the fd
 * readable whenever head moves, the ring ends, or the broker has news (looked at whenever it wakes,
 * at least every NOTIFIER_LOOK_MS). It reads shared memory, polls the socket and writes the fd. */
static void *notifier_main(void *arg)
{
        gpuipc_ring_t *r = arg;
        uint64_t seen_head = r->notified_head, one = 1;

        while (!r->stop) {
                uint32_t seen = __atomic_load_n(&r->ctl->doorbell, __ATOMIC_ACQUIRE);
                uint64_t head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE);

                if (head != seen_head || __atomic_load_n(&r->ctl->closed, __ATOMIC_ACQUIRE) ||
                    broker_has_news(r)) {
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
        return NULL;
}

_public_ int gpuipc_ring_fd(gpuipc_ring_t *r)
{
        if (!r || r->producer)
                return GPUIPC_E_INVALID;
        if (r->notifier_on)
                return r->efd;
        /* Readable from the start: frames may be waiting already. Then the thread says so whenever
         * head moves past what it saw, counting from before it starts (it may start late). */
        r->efd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK);
        if (r->efd < 0)
                return -errno;
        r->notified_head = __atomic_load_n(&r->ctl->head, __ATOMIC_ACQUIRE);
        if (pthread_create(&r->notifier, NULL, notifier_main, r) != 0) {
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
        r->notifier_on = false;
        r->efd = safe_close(r->efd);
}

_public_ void gpuipc_ring_close(gpuipc_ring_t *r)
{
        gpuipc_t *c;

        if (!r)
                return;
        c = r->conn;
        if (r->producer) {
                /* Members see it in the control page at once; the broker forgets the ring, and the
                 * parts go as any buffer: once the last member let go of them. */
                __atomic_store_n(&r->ctl->closed, 1, __ATOMIC_RELEASE);
                __atomic_fetch_add(&r->ctl->doorbell, 1, __ATOMIC_RELEASE);
                futex_wake(&r->ctl->doorbell, INT_MAX);
                if (!c->broken)
                        (void)simple_ring_request(c, PROTO_OP_RING_CLOSE, r->name);
        } else {
                notifier_stop(r);
                if (r->taken >= 0)
                        (void)gpuipc_ring_release(r);
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

        if (r->gone)
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
                r->gone = true;
                snprintf(r->gone_why, sizeof(r->gone_why), "its seat could not be taken back after the broker "
                         "restarted: %.180s", r->conn->errmsg);
                return 0;
        }
        frame_free(&f);
        return 0;
}

int ring_after_reconnect(gpuipc_t *c)
{
        list_for_each(pos, &c->rings) {
                gpuipc_ring_t *r = list_entry(pos, gpuipc_ring_t, link);
                int e;

                if (r->producer) {
                        /* Seats to renew get their new parts now: the old ones must not come back. */
                        e = 0;
                        for (uint32_t i = 0; e == 0 && i < r->n_members; i++)
                                if (r->seat[i].renew)
                                        e = seat_replace(r, i);
                        if (e == 0)
                                e = ring_declare(r, true);
                        if (e == 0)
                                e = register_parts(r, true);
                        for (uint32_t i = 0; e == 0 && i < r->n_members; i++)
                                r->seat[i].renew = r->seat[i].replaced = false;
                } else {
                        e = ring_restore_member(r);
                }
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
