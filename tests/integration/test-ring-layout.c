/* A hostile producer's control pages: a ring declared to the broker as it should be, whose control
 * page then says something else (another magic, layout version, slot or seat count, slot size or
 * mode; the newest frame in a slot past the last), or changes after its members joined. The
 * producer here speaks the protocol on a raw socket and writes the page itself, as a hostile one
 * would; members are ordinary library clients in processes of their own. Each bad layout is refused
 * at join with an error naming what is wrong; a layout that changes later costs the member a clean
 * error, never a crash or a read outside its mappings; the broker keeps serving and shows the page
 * as unreadable. A member's take never hangs on what the page says: a frame number past any a ring
 * reaches revokes the membership, and a head whose frame never comes times the take out, and
 * the take still notices the ring closed or its producer gone. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "harness.h"
#include "macro.h"
#include "ring.h"
#include "seals.h"

#define SLOTS 4
#define MEMBERS 2
#define SLOT_BYTES 4096u

/* A ring producer on a raw socket: it owns every part's memfd and keeps the control page mapped
 * writable (the page is sealed against new writable mappings after that one). */
typedef struct Hostile {
        int sock;
        RingCtl *ctl;
        RingMember *page[MEMBERS]; /* the member pages, mapped too: to see a member sleep */
        HFrame *f;
        uint64_t next_id;
} Hostile;

static unsigned call(Hostile *h, ProtoMsg *req, int fd)
{
        proto_set_id(req, ++h->next_id);
        return h_raw_call(h->sock, req, fd, h->f);
}

/* A memfd of size bytes, mapped into *ret_map (NULL: unmapped), sealed as the broker wants it:
 * writable ones against resizing, read-only ones against new writable mappings too. */
static int sealed_memfd(size_t size, bool writable, void **ret_map)
{
        int fd = memfd_create("hostile-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (writable ? 0 : F_SEAL_FUTURE_WRITE);
        void *p;

        CHECK(fd >= 0);
        CHECK(ftruncate(fd, (off_t)size) == 0);
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        CHECK(p != MAP_FAILED);
        CHECK(fcntl(fd, F_ADD_SEALS, seals) == 0);
        if (ret_map)
                *ret_map = p;
        else
                munmap(p, size);
        return fd;
}

static void register_part(Hostile *h, const char *ring, uint32_t index, size_t size, bool writable, void **ret_map)
{
        _cleanup_close_ int fd = sealed_memfd(size, writable, ret_map);
        ProtoMsg req;
        unsigned st;

        proto_request_init(&req, PROTO_OP_RING_PART);
        proto_set_name(&req, proto_str(ring));
        proto_set_index(&req, index);
        proto_set_kind(&req, PROTO_KIND_MEMFD);
        proto_set_size(&req, size);
        proto_set_buffer(&req, (uint64_t)getpid() << 16 | (index + 1)); /* ids are the producer's to pick */
        proto_set_writable(&req, writable);
        st = call(h, &req, fd);
        CHECKF(st == PROTO_STATUS_OK, "ring-part %u: %s (%.*s)", index, proto_status_name(st),
               (int)h->f->msg.message.len, h->f->msg.message.ptr);
}

/* Declares ring `name` (memfd slots, SLOTS x MEMBERS) and registers its parts, with a control page
 * as an honest producer writes it; the caller then writes what it likes there. */
static void hostile_create(Hostile *h, const HBroker *b, const char *name, ProtoMode mode)
{
        ProtoMsg req;
        unsigned st;
        void *ctl;

        *h = (Hostile){ .sock = h_raw_connect(b), .f = h_frame_new() };
        h_raw_hello(h->sock);
        proto_request_init(&req, PROTO_OP_RING_CREATE);
        proto_set_name(&req, proto_str(name));
        proto_set_kind(&req, PROTO_KIND_MEMFD);
        proto_set_size(&req, SLOT_BYTES);
        proto_set_slots(&req, SLOTS);
        proto_set_members(&req, MEMBERS);
        proto_set_mode(&req, mode);
        proto_set_timeout_ms(&req, 60000);
        st = call(h, &req, -1);
        CHECKF(st == PROTO_STATUS_OK, "ring-create: %s", proto_status_name(st));
        register_part(h, name, 0, RING_PAGE, false, &ctl);
        h->ctl = ctl;
        h->ctl->magic = RING_MAGIC;
        h->ctl->version = RING_LAYOUT_VERSION;
        h->ctl->n_slots = SLOTS;
        h->ctl->n_members = MEMBERS;
        h->ctl->mode = mode == PROTO_MODE_LATEST ? RING_LATEST : RING_BACKPRESSURE;
        h->ctl->slot_size = SLOT_BYTES;
        for (uint32_t i = 0; i < SLOTS; i++)
                register_part(h, name, 1 + i, SLOT_BYTES, false, NULL);
        for (uint32_t i = 0; i < MEMBERS; i++)
                register_part(h, name, 1 + SLOTS + i, RING_PAGE, true, (void **)&h->page[i]);
}

static void hostile_free(Hostile *h)
{
        munmap(h->ctl, RING_PAGE);
        for (uint32_t i = 0; i < MEMBERS; i++)
                munmap(h->page[i], RING_PAGE);
        if (h->sock >= 0)
                close(h->sock);
        h_frame_free(h->f);
}

/* Waits for the broker's member-joined event; returns the seat, *ret_epoch its membership. */
static uint32_t hostile_member_joined(Hostile *h, uint64_t *ret_epoch)
{
        for (;;) {
                CHECKF(h_raw_recv(h->sock, H_SOON_MS, h->f) > 0, "no member-joined event");
                if (h->f->msg.type == PROTO_EVENT && h->f->msg.event == PROTO_EV_MEMBER_JOINED) {
                        *ret_epoch = h->f->msg.generation;
                        return (uint32_t)h->f->msg.index;
                }
        }
}

/* Seats membership epoch in seat i from frame `start` on (start first, epoch last, as the library's
 * producer does). */
static void hostile_seat_from(Hostile *h, uint32_t i, uint64_t epoch, uint64_t start)
{
        h->ctl->member[i].start = start;
        h->ctl->member[i].state = RING_MEMBER_ACTIVE;
        __atomic_store_n(&h->ctl->member[i].epoch, epoch, __ATOMIC_RELEASE);
}

static void hostile_seat(Hostile *h, uint32_t i, uint64_t epoch)
{
        hostile_seat_from(h, i, epoch, 1);
}

/* Says frame n is in slot s, and rings the doorbell. */
static void hostile_publish(Hostile *h, uint64_t n, uint32_t s)
{
        __atomic_store_n(&h->ctl->slot_seq[s % SLOTS], n, __ATOMIC_RELEASE);
        __atomic_store_n(&h->ctl->head_slot, s, __ATOMIC_RELAXED);
        __atomic_store_n(&h->ctl->head, n, __ATOMIC_RELEASE);
        __atomic_fetch_add(&h->ctl->doorbell, 1, __ATOMIC_RELEASE);
        (void)syscall(SYS_futex, &h->ctl->doorbell, FUTEX_WAKE, 64, NULL, NULL, 0);
}

/* Says the newest frame is n (its slot left as it is), and rings the doorbell. */
static void hostile_set_head(Hostile *h, uint64_t n)
{
        __atomic_store_n(&h->ctl->head, n, __ATOMIC_RELEASE);
        __atomic_fetch_add(&h->ctl->doorbell, 1, __ATOMIC_RELEASE);
        (void)syscall(SYS_futex, &h->ctl->doorbell, FUTEX_WAKE, 64, NULL, NULL, 0);
}

/* ---- members ---- */

typedef struct Joiner {
        const HBroker *broker;
        const char *ring;
} Joiner;

/* Joins; reports 'r' with the error's name and message, or 'j' once joined (then leaves). */
static int joiner(HChan *ch, void *arg)
{
        const Joiner *a = arg;
        gpuipc_t *c = h_connect(a->broker, "joiner");
        gpuipc_ring_t *r = NULL;
        int e = gpuipc_ring_join(c, a->ring, H_SOON_MS, &r);

        if (e == 0) {
                h_report(ch, 'j', "joined");
                gpuipc_ring_close(r);
        } else {
                h_report(ch, 'r', "%s: %s", gpuipc_err_name(e), gpuipc_errmsg(c));
        }
        gpuipc_close(c);
        return 0;
}

/* A member joins a ring whose control page says what `spoil` made it say, and is refused at join with
 * an error whose message contains `want`; it exits normally, and the broker serves on. */
static void refused_at_join(HCase *k, const char *name, ProtoMode mode, void (*spoil)(RingCtl *), const char *want)
{
        Joiner a = { k->broker, name };
        char said[256];
        HChild *kid;
        Hostile h;

        hostile_create(&h, k->broker, name, mode);
        spoil(h.ctl);
        kid = h_spawn("joiner", joiner, &a);
        h_child_expect(kid, 'r', H_SOON_MS, said, sizeof(said));
        h_log("%s: %s", name, said);
        CHECKF(strncmp(said, "bad-reply: ", 11) == 0, "%s: the join was not refused as a bad reply: %s", name, said);
        CHECKF(strstr(said, "control page") && strstr(said, want), "%s: the refusal does not name '%s': %s", name,
               want, said);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        hostile_free(&h);
        h_bystander_check(k);
}

static void spoil_magic(RingCtl *c)
{
        c->magic = 0x12345678;
}

static void spoil_version(RingCtl *c)
{
        c->version = RING_LAYOUT_VERSION + 1;
}

static void spoil_slots(RingCtl *c)
{
        c->n_slots = 1000; /* more than the page holds slot numbers for */
}

static void spoil_members(RingCtl *c)
{
        c->n_members = MEMBERS + 1;
}

static void spoil_slot_size(RingCtl *c)
{
        c->slot_size = (uint64_t)SLOT_BYTES << 20; /* past the end of every slot's memory */
}

static void spoil_mode(RingCtl *c)
{
        c->mode = RING_BACKPRESSURE; /* the ring was declared latest */
}

static void spoil_head_slot(RingCtl *c)
{
        c->head = 1;
        c->head_slot = 4000; /* far past the 4 slots */
}

/* Each bad layout of the control page is refused at join, with an error that names the field, and the
 * member process survives every one. */
static void test_bad_layouts_refused_at_join(void)
{
        HCase k;

        h_case_begin(&k, NULL);
        /* (Ring names that say nothing of the field: the refusal must name it.) */
        refused_at_join(&k, "hostile/1", PROTO_MODE_LATEST, spoil_magic, "magic");
        refused_at_join(&k, "hostile/2", PROTO_MODE_LATEST, spoil_version, "layout version");
        refused_at_join(&k, "hostile/3", PROTO_MODE_LATEST, spoil_slots, "n_slots is 1000");
        refused_at_join(&k, "hostile/4", PROTO_MODE_LATEST, spoil_members, "n_members is 3");
        refused_at_join(&k, "hostile/5", PROTO_MODE_LATEST, spoil_slot_size, "slot_size");
        refused_at_join(&k, "hostile/6", PROTO_MODE_LATEST, spoil_mode, "mode");
        refused_at_join(&k, "hostile/7", PROTO_MODE_LATEST, spoil_head_slot, "head_slot is 4000");
        h_case_end(&k);
}

/* A member of a latest-mode ring that joins a good layout, takes a frame, then lives through its
 * producer rewriting the page: reports what each step returned (one line per step). */
static int steadfast_member(HChan *ch, void *arg)
{
        const Joiner *a = arg;
        gpuipc_t *c = h_connect(a->broker, "steadfast");
        gpuipc_ring_t *r = NULL;
        gpuipc_buffer_t *slot;
        uint64_t frame = 0;
        int e;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        h_report(ch, 'j', "joined");
        /* 1: frame 1, as published on the good layout. */
        CHECK_OK(c, gpuipc_ring_take(r, H_SOON_MS, &slot, &frame));
        CHECK_EQ(frame, 1);
        CHECK_OK(c, gpuipc_ring_release(r));
        h_report(ch, '1', "took frame 1");
        /* 2: the header rewritten, and the newest frame said to be in slot 4000 of 4. */
        h_await(ch, 'g', H_SOON_MS);
        e = gpuipc_ring_take(r, H_SOON_MS, &slot, &frame);
        if (e == 0)
                gpuipc_ring_release(r);
        h_report(ch, '2', "%s: %s", gpuipc_err_name(e), e == 0 ? "" : gpuipc_errmsg(c));
        /* 3: a frame in a real slot again, the header still garbage: what the member knows of its ring
         * came from the broker, not from the page. */
        h_await(ch, 'g', H_SOON_MS);
        e = gpuipc_ring_take(r, H_SOON_MS, &slot, &frame);
        if (e == 0)
                CHECK_OK(c, gpuipc_ring_release(r));
        h_report(ch, '3', "%s: frame %" PRIu64, gpuipc_err_name(e), e == 0 ? frame : 0);
        /* 4: the seat taken away. */
        h_await(ch, 'g', H_SOON_MS);
        e = gpuipc_ring_take(r, H_SOON_MS, &slot, &frame);
        h_report(ch, '4', "%s: %s", gpuipc_err_name(e), gpuipc_errmsg(c));
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

/* A producer that rewrites its control page after a member joined (counts, slot size, mode, an index
 * past the end of the slots, the member's seat) costs that member clean errors, never a crash; the
 * broker then shows the page as unreadable and keeps serving. */
static void test_layout_changed_after_join(void)
{
        Joiner a = { NULL, "hostile/later" };
        gpuipc_ring_info_t info;
        char said[256];
        uint64_t epoch, cursor = 0;
        uint32_t seat;
        HChild *kid;
        Hostile h;
        HCase k;
        int n;

        h_case_begin(&k, NULL);
        a.broker = k.broker;
        hostile_create(&h, k.broker, a.ring, PROTO_MODE_LATEST);
        kid = h_spawn("steadfast", steadfast_member, &a);
        h_child_expect(kid, 'j', H_SOON_MS, NULL, 0);
        seat = hostile_member_joined(&h, &epoch);
        hostile_seat(&h, seat, epoch);
        hostile_publish(&h, 1, 0);
        h_child_expect(kid, '1', H_SOON_MS, NULL, 0);

        h.ctl->magic = 0;
        h.ctl->version = 7;
        h.ctl->n_slots = 100000;
        h.ctl->n_members = 100000;
        h.ctl->slot_size = UINT64_MAX;
        h.ctl->mode = 9;
        hostile_publish(&h, 2, 4000);
        h_child_tell(kid, 'g');
        h_child_expect(kid, '2', H_SOON_MS, said, sizeof(said));
        h_log("slot past the end: %s", said);
        CHECKF(strncmp(said, "bad-reply: ", 11) == 0 && strstr(said, "slot 4000 of 4"),
               "a head in slot 4000 of 4 was not refused: %s", said);

        hostile_publish(&h, 3, 2);
        h_child_tell(kid, 'g');
        h_child_expect(kid, '3', H_SOON_MS, said, sizeof(said));
        CHECKF(strcmp(said, "ok: frame 3") == 0, "frame 3 in slot 2: %s", said);

        /* The broker reads the page for listings with the same distrust. */
        n = gpuipc_list_rings(k.obs, a.ring, &cursor, &info, 1);
        CHECKF(n == 1, "rings: %d [%s]", n, gpuipc_errmsg(k.obs));
        CHECKF(!info.head_known && strstr(info.why, "magic"), "the broker shows a broken page as: head_known %d, "
               "why '%s'", info.head_known, info.why);

        __atomic_store_n(&h.ctl->member[seat].state, RING_MEMBER_FREE, __ATOMIC_RELEASE);
        h_child_tell(kid, 'g');
        h_child_expect(kid, '4', H_SOON_MS, said, sizeof(said));
        CHECKF(strncmp(said, "revoked: ", 9) == 0, "a member whose seat was taken away: %s", said);
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        hostile_free(&h);
        h_bystander_check(&k);
        h_case_end(&k);
}

/* The bound on a take of TAKE_MS that must return: ten times over, so that a loaded machine does
 * not matter (a take that hangs never returns; the harness's deadlines fail it). */
#define TAKE_MS 200
#define TAKE_BOUND_MS (10 * TAKE_MS)

/* A member that joins, takes frame 1, then on each 'g' takes once: for TAKE_MS (reports '2' with
 * the error's name and the milliseconds it took), then for ever (reports '3' with the error's name
 * and message). */
static int waiting_member(HChan *ch, void *arg)
{
        const Joiner *a = arg;
        gpuipc_t *c = h_connect(a->broker, "waiting");
        gpuipc_ring_t *r = NULL;
        gpuipc_buffer_t *slot;
        uint64_t frame = 0, t0;
        int e;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        h_report(ch, 'j', "joined");
        CHECK_OK(c, gpuipc_ring_take(r, H_SOON_MS, &slot, &frame));
        CHECK_EQ(frame, 1);
        CHECK_OK(c, gpuipc_ring_release(r));
        h_report(ch, '1', "took frame 1");
        h_await(ch, 'g', H_SOON_MS);
        t0 = monotonic_ms();
        e = gpuipc_ring_take(r, TAKE_MS, &slot, &frame);
        if (e == 0)
                (void)gpuipc_ring_release(r);
        h_report(ch, '2', "%s %" PRIu64, gpuipc_err_name(e), monotonic_ms() - t0);
        h_await(ch, 'g', H_SOON_MS);
        e = gpuipc_ring_take(r, -1, &slot, &frame);
        if (e == 0)
                (void)gpuipc_ring_release(r);
        h_report(ch, '3', "%s: %s", gpuipc_err_name(e), e == 0 ? "" : gpuipc_errmsg(c));
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

/* A hostile ring `name` of this mode with a waiting_member seated that took frame 1; returns the
 * member's seat. */
static uint32_t hostile_with_waiter(HCase *k, Hostile *h, Joiner *a, HChild **ret_kid, ProtoMode mode)
{
        uint64_t epoch;
        uint32_t seat;

        a->broker = k->broker;
        hostile_create(h, k->broker, a->ring, mode);
        *ret_kid = h_spawn("waiting", waiting_member, a);
        h_child_expect(*ret_kid, 'j', H_SOON_MS, NULL, 0);
        seat = hostile_member_joined(h, &epoch);
        hostile_seat(h, seat, epoch);
        hostile_publish(h, 1, 0);
        h_child_expect(*ret_kid, '1', H_SOON_MS, NULL, 0);
        return seat;
}

/* The timed take's report: the error's name (checked) and a time within the bound. */
static void expect_timed_take(HChild *kid, const char *want)
{
        char said[256], name[64];
        unsigned long long ms = 0;

        h_child_tell(kid, 'g');
        h_child_expect(kid, '2', H_SOON_MS, said, sizeof(said));
        CHECKF(sscanf(said, "%63s %llu", name, &ms) == 2, "the take said: %s", said);
        CHECKF(strcmp(name, want) == 0, "a take of %d ms returned %s, not %s", TAKE_MS, name, want);
        CHECKF(ms <= TAKE_BOUND_MS, "a take of %d ms returned after %llu ms", TAKE_MS, ms);
}

/* A control page whose head is past any frame a ring reaches (2^64 - 1), in latest and backpressure
 * mode: the member's take returns at once with revoked, naming the value, and every take after it
 * too, even one without a timeout. (Latest mode looked at that head for ever, at 100% CPU, however
 * short the take's timeout; backpressure took a "frame" the page never published.) */
static void test_head_past_any_frame(void)
{
        static const ProtoMode modes[] = { PROTO_MODE_LATEST, PROTO_MODE_BACKPRESSURE };
        HCase k;

        h_case_begin(&k, NULL);
        for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
                Joiner a = { NULL, i ? "hostile/max-bp" : "hostile/max-latest" };
                char said[256];
                HChild *kid;
                Hostile h;

                (void)hostile_with_waiter(&k, &h, &a, &kid, modes[i]);
                hostile_set_head(&h, UINT64_MAX);
                expect_timed_take(kid, "revoked");
                h_child_tell(kid, 'g');
                h_child_expect(kid, '3', H_SOON_MS, said, sizeof(said));
                h_log("%s: %s", a.ring, said);
                CHECKF(strncmp(said, "revoked: ", 9) == 0 && strstr(said, "18446744073709551615"),
                       "%s: the take after it did not stay revoked, naming the head: %s", a.ring, said);
                h_child_wait_ok(kid, H_SOON_MS);
                h_child_free(kid);
                hostile_free(&h);
                h_bystander_check(&k);
        }
        h_case_end(&k);
}

/* A member that joins and, on 'g', takes once for TAKE_MS: reports '2' as waiting_member does. */
static int first_take_member(HChan *ch, void *arg)
{
        const Joiner *a = arg;
        gpuipc_t *c = h_connect(a->broker, "first-take");
        gpuipc_ring_t *r = NULL;
        gpuipc_buffer_t *slot;
        uint64_t frame = 0, t0;
        int e;

        CHECK_OK(c, gpuipc_ring_join(c, a->ring, H_SOON_MS, &r));
        h_report(ch, 'j', "joined");
        h_await(ch, 'g', H_SOON_MS);
        t0 = monotonic_ms();
        e = gpuipc_ring_take(r, TAKE_MS, &slot, &frame);
        if (e == 0)
                (void)gpuipc_ring_release(r);
        h_report(ch, '2', "%s %" PRIu64, gpuipc_err_name(e), monotonic_ms() - t0);
        gpuipc_ring_close(r);
        gpuipc_close(c);
        return 0;
}

/* A backpressure seat whose first frame is past any frame a ring reaches: the member's first take
 * returns revoked, not a timeout (a stream ring's member would queue a wait on its "ready" counter
 * for that frame, which nothing can let through). */
static void test_first_frame_past_any(void)
{
        Joiner a = { NULL, "hostile/start" };
        uint64_t epoch;
        uint32_t seat;
        HChild *kid;
        Hostile h;
        HCase k;

        h_case_begin(&k, NULL);
        a.broker = k.broker;
        hostile_create(&h, k.broker, a.ring, PROTO_MODE_BACKPRESSURE);
        kid = h_spawn("first-take", first_take_member, &a);
        h_child_expect(kid, 'j', H_SOON_MS, NULL, 0);
        seat = hostile_member_joined(&h, &epoch);
        hostile_seat_from(&h, seat, epoch, UINT64_MAX);
        expect_timed_take(kid, "revoked");
        h_child_wait_ok(kid, H_SOON_MS);
        h_child_free(kid);
        hostile_free(&h);
        h_case_end(&k);
}

/* A head 1000 frames ahead whose frame never comes (its slot holds frame 1) in latest mode: a take
 * times out within its timeout, and a take without one, asleep, returns revoked as soon as the ring
 * is closed (the page's flag alone, no doorbell) or its producer is gone (its connection closed).
 * (The take looked at that head for ever, at 100% CPU, through the close and the producer's end.) */
static void test_head_ahead_then_gone(void)
{
        HCase k;

        h_case_begin(&k, NULL);
        for (int gone = 0; gone < 2; gone++) {
                Joiner a = { NULL, gone ? "hostile/ahead-gone" : "hostile/ahead-closed" };
                char said[256];
                uint32_t seat;
                HChild *kid;
                Hostile h;

                seat = hostile_with_waiter(&k, &h, &a, &kid, PROTO_MODE_LATEST);
                hostile_set_head(&h, 1001);
                expect_timed_take(kid, "timeout");
                /* The take without a timeout is asleep on the doorbell when the ring ends. */
                h_child_tell(kid, 'g');
                WAIT_UNTIL(__atomic_load_n(&h.page[seat]->sleeping, __ATOMIC_ACQUIRE) != 0, H_SOON_MS);
                if (gone) {
                        close(h.sock);
                        h.sock = -1;
                } else {
                        __atomic_store_n(&h.ctl->closed, 1, __ATOMIC_RELEASE);
                }
                h_child_expect(kid, '3', H_SOON_MS, said, sizeof(said));
                h_log("%s: %s", a.ring, said);
                CHECKF(strncmp(said, "revoked: ", 9) == 0, "%s: the take did not end with the ring: %s", a.ring,
                       said);
                h_child_wait_ok(kid, H_SOON_MS);
                h_child_free(kid);
                hostile_free(&h);
                h_bystander_check(&k);
        }
        h_case_end(&k);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_bad_layouts_refused_at_join),
                H_TEST(test_layout_changed_after_join),
                H_TEST(test_head_past_any_frame),
                H_TEST(test_head_ahead_then_gone),
                H_TEST(test_first_frame_past_any),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
