/* The lifetime contract under faults: producers in rings, consumers verifying every word of every
 * frame while they hold it, random SIGKILLs of producers and consumers, and SIGKILLs of the broker
 * itself. Two things must never happen:
 *   - a frame changes while a consumer holds it (some peer was told "drained" while memory was in
 *     use), unless that hold was revoked: counted, must be zero;
 *   - a producer is told "drained" while a live consumer still holds that publication and its
 *     reference was not revoked: checked directly. Consumers publish what they hold in shared memory
 *     (a seqlock per consumer); a producer told "drained" (as soon as it sees the event, or when
 *     gpuipc_wait_drained returns) looks for live holders of that very publication, and each one it
 *     finds must turn out revoked (the library says so, with the broker's reason) by the time that
 *     consumer lets go.
 * The contract allows both only for a revoked hold: a holder that made no call within the restart
 * grace is treated as gone and hears so when it comes back (docs/design.md "Broker restarts");
 * those are counted apart. Every revocation a consumer sees is recorded with its reason (a table
 * at the end), and one without a reason fails.
 *
 * Producers (each a process) own a ring of RING slots. For frame n they wait until the slot they
 * are about to overwrite has drained, write frame n into it (word 0 is n, word i is a function of
 * n and i), retire the previous frame and publish this one under the producer's name. Consumers (each
 * a process) attach a random producer's name, check every word, hold it a little, check every word
 * again, and release. Everyone reconnects (the library's default). The parent kills and restarts
 * them, and the broker, and prints a table of what happened.
 *
 * The ordinary run lasts a minute with two broker restarts. GPUIPC_SOAK=long runs for 20 minutes
 * with a broker restart every 2.5 minutes (outside CI: run the binary, or meson test with a
 * --timeout-multiplier; GPUIPC_TEST_CASE_TIMEOUT must cover the run); GPUIPC_SOAK_MS and
 * GPUIPC_SOAK_BROKER_KILLS override the duration and the number of broker restarts,
 * GPUIPC_SOAK_GRACE_MS the broker's restart grace (2000 ms: a shorter one than the longest hold makes
 * drained-while-held happen, and every such hold must come out revoked). */
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define N_PRODUCERS 4
#define N_CONSUMERS 16
#define RING 4
#define FRAME_BYTES (64u << 10)
#define SOAK_MS_DEFAULT 60000
#define BROKER_KILLS_DEFAULT 2
#define SOAK_MS_LONG (20 * 60000)
#define BROKER_KILL_EVERY_MS_LONG 150000
#define FINISHED_RING 256 /* holds a consumer remembers the outcome of, for the parent to judge */
#define MAX_SUSPECTS 4096 /* drains seen while a live consumer held the publication */
#define MAX_REASONS 32

/* What a consumer holds, published for the producers: a seqlock (version odd while written). */
typedef struct Hold {
        atomic_uint_fast64_t version;
        atomic_bool held; /* from attach's return until just before release is sent */
        atomic_uint_fast64_t seq, buffer, generation;
} Hold;

/* How a hold ended, for the parent to judge the drains seen during it. */
typedef struct Finished {
        atomic_uint_fast64_t seq; /* written last */
        atomic_bool revoked;
} Finished;

/* One consumer seat: the process in it changes (SIGKILL and a new one), incarnation counts them. */
typedef struct Seat {
        atomic_bool alive;               /* false from just before the parent kills its process */
        atomic_uint_fast64_t incarnation;
        Hold hold;
        Finished finished[FINISHED_RING];
} Seat;

/* A producer was told "drained" for (buffer, generation) while this seat's consumer held it. */
typedef struct Suspect {
        atomic_bool filled;
        unsigned seat;
        uint64_t incarnation, seq, buffer, generation;
} Suspect;

typedef struct Reason {
        atomic_uint_fast64_t count;
        char text[200];
} Reason;

/* Counters the children add to, in memory shared with the parent. */
typedef struct Shared {
        atomic_bool stop;
        atomic_uint_fast64_t frames_published, frames_verified, changed_while_held, changed_revoked;
        atomic_uint_fast64_t torn_at_attach, revoked_holds, attach_failures, call_failures, reconnects;
        atomic_uint_fast64_t drained_waits_timed_out;
        atomic_uint_fast64_t revocations, revocations_without_reason, reasons_other;
        Seat seats[N_CONSUMERS];
        atomic_uint_fast32_t n_suspects;
        Suspect suspects[MAX_SUSPECTS];
        atomic_flag reasons_lock;
        Reason reasons[MAX_REASONS];
} Shared;

static Shared *shared;

typedef struct Role {
        const HBroker *broker;
        unsigned index;
} Role;

static uint64_t word_of(uint64_t frame, size_t i)
{
        return (frame << 32) ^ (i * UINT64_C(0x9e3779b97f4a7c15));
}

static void frame_fill(uint64_t *w, uint64_t frame)
{
        w[0] = frame;
        for (size_t i = 1; i < FRAME_BYTES / 8; i++)
                w[i] = word_of(frame, i);
}

/* True when every word belongs to frame w[0] (which is copied into *ret_frame). */
static bool frame_whole(const volatile uint64_t *w, uint64_t *ret_frame)
{
        uint64_t frame = w[0];

        for (size_t i = 1; i < FRAME_BYTES / 8; i++)
                if (w[i] != word_of(frame, i))
                        return false;
        *ret_frame = frame;
        return true;
}

/* ---- what consumers hold, and what producers are told ---- */

static void hold_publish(Hold *h, bool held, uint64_t seq, uint64_t buffer, uint64_t generation)
{
        atomic_fetch_add(&h->version, 1);
        atomic_store(&h->seq, seq);
        atomic_store(&h->buffer, buffer);
        atomic_store(&h->generation, generation);
        atomic_store(&h->held, held);
        atomic_fetch_add(&h->version, 1);
}

/* A consistent copy of *h: false while it is being written (try again). */
static bool hold_read(Hold *h, bool *held, uint64_t *seq, uint64_t *buffer, uint64_t *generation)
{
        uint64_t v = atomic_load(&h->version);

        if (v & 1)
                return false;
        *held = atomic_load(&h->held);
        *seq = atomic_load(&h->seq);
        *buffer = atomic_load(&h->buffer);
        *generation = atomic_load(&h->generation);
        return atomic_load(&h->version) == v;
}

/* A producer was told (buffer, generation) drained: note every live consumer that holds it. Only
 * the consumer can tell whether its reference was revoked, once it lets go; the parent judges. */
static void note_holders_of_drained(uint64_t buffer, uint64_t generation)
{
        for (unsigned i = 0; i < N_CONSUMERS; i++) {
                Seat *seat = &shared->seats[i];
                uint64_t inc = atomic_load(&seat->incarnation), seq, id, gen;
                bool held;

                Suspect *s;
                uint_fast32_t k;
                bool read = false;

                /* A writer is never in the middle for long, unless it was killed there. */
                while (atomic_load(&seat->alive) && atomic_load(&seat->incarnation) == inc &&
                       !(read = hold_read(&seat->hold, &held, &seq, &id, &gen)))
                        sched_yield();
                if (!read || !atomic_load(&seat->alive) || atomic_load(&seat->incarnation) != inc || !held ||
                    id != buffer || gen != generation)
                        continue;
                k = atomic_fetch_add(&shared->n_suspects, 1);
                CHECKF(k < MAX_SUSPECTS, "more than %d drains while a consumer held the buffer", MAX_SUSPECTS);
                s = &shared->suspects[k];
                s->seat = i;
                s->incarnation = inc;
                s->seq = seq;
                s->buffer = id;
                s->generation = gen;
                atomic_store(&s->filled, true);
                h_log("drained: buffer %" PRIu64 " generation %" PRIu64 " while consumer %u (hold %" PRIu64
                      ") held it", id, gen, i, seq);
        }
}

/* Records a revocation's reason (numbers folded into N, so that reasons group). */
static void record_reason(const char *reason)
{
        char text[sizeof(shared->reasons[0].text)];
        size_t n = 0;

        atomic_fetch_add(&shared->revocations, 1);
        if (!reason[0]) {
                atomic_fetch_add(&shared->revocations_without_reason, 1);
                return;
        }
        for (const char *p = reason; *p && n + 1 < sizeof(text); p++) {
                if (*p >= '0' && *p <= '9') {
                        while (p[1] >= '0' && p[1] <= '9')
                                p++;
                        text[n++] = 'N';
                } else {
                        text[n++] = *p;
                }
        }
        text[n] = 0;
        while (atomic_flag_test_and_set(&shared->reasons_lock))
                ;
        for (unsigned i = 0; i < MAX_REASONS; i++) {
                Reason *r = &shared->reasons[i];

                if (!r->text[0])
                        snprintf(r->text, sizeof(r->text), "%s", text);
                if (strcmp(r->text, text) == 0) {
                        atomic_fetch_add(&r->count, 1);
                        text[0] = 0;
                        break;
                }
        }
        if (text[0])
                atomic_fetch_add(&shared->reasons_other, 1);
        atomic_flag_clear(&shared->reasons_lock);
}

/* Judges the drains noted while a consumer held the buffer, for holds that ended: each must have
 * been revoked. Undecidable once the holder was killed before it let go (counted apart). */
typedef struct Verdicts {
        unsigned judged, revoked, not_revoked, holder_killed;
        bool *done;
} Verdicts;

static void judge_suspects(Verdicts *v, bool final)
{
        uint_fast32_t n = atomic_load(&shared->n_suspects);

        for (uint_fast32_t k = 0; k < n && k < MAX_SUSPECTS; k++) {
                const Suspect *s = &shared->suspects[k];
                Seat *seat = &shared->seats[s->seat];
                const Finished *f = &seat->finished[s->seq % FINISHED_RING];

                if (v->done[k] || !atomic_load(&s->filled))
                        continue;
                if (atomic_load(&seat->incarnation) == s->incarnation && atomic_load(&f->seq) == s->seq) {
                        if (atomic_load(&f->revoked)) {
                                v->revoked++;
                        } else {
                                v->not_revoked++;
                                h_log("VIOLATION: buffer %" PRIu64 " generation %" PRIu64 " drained while consumer "
                                      "%u held it (hold %" PRIu64 "), and its reference was never revoked",
                                      s->buffer, s->generation, s->seat, s->seq);
                        }
                } else if (atomic_load(&seat->incarnation) != s->incarnation || final) {
                        v->holder_killed++;
                } else {
                        continue; /* still held: judged once it ends */
                }
                v->done[k] = true;
                v->judged++;
        }
}

static gpuipc_t *soak_connect(const HBroker *b, const char *label)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .label = label,
                               .connect_timeout_ms = H_SOON_MS, .no_gpus = 1 };
        gpuipc_t *c = NULL;
        int r = h_try_connect(b, &o, &c);

        CHECKF(r == 0, "connect: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

/* A producer's record of the drains it checked, so that each is checked once: as soon as its event
 * is seen, or when gpuipc_wait_drained returns (which takes the event of the buffer it waits for). */
typedef struct Drains {
        uint64_t buffer[RING], generation[RING];
        unsigned next;
} Drains;

static void drained_seen(Drains *d, uint64_t buffer, uint64_t generation)
{
        for (unsigned i = 0; i < RING; i++)
                if (d->buffer[i] == buffer && d->generation[i] == generation)
                        return;
        d->buffer[d->next] = buffer;
        d->generation[d->next] = generation;
        d->next = (d->next + 1) % RING;
        note_holders_of_drained(buffer, generation);
}

/* Takes the events a connection has queued: counts reconnects, records revocations with their
 * reasons, checks the holders of a producer's drained buffers (drains: NULL for a consumer). True
 * when one of them revoked (buffer, generation) (0, 0: none to look for). */
static bool take_events(gpuipc_t *c, uint64_t buffer, uint64_t generation, Drains *drains)
{
        gpuipc_event_t ev;
        bool revoked = false;

        while (gpuipc_next_event(c, 0, &ev) == 0) {
                if (ev.type == GPUIPC_EVENT_RECONNECTED)
                        atomic_fetch_add(&shared->reconnects, 1);
                if (ev.type == GPUIPC_EVENT_DRAINED && !ev.subscription && drains)
                        drained_seen(drains, ev.buffer, ev.generation);
                if (ev.type != GPUIPC_EVENT_REVOKED || ev.subscription)
                        continue;
                record_reason(ev.reason);
                revoked |= ev.buffer == buffer && ev.generation == generation;
        }
        return revoked;
}

static int producer(HChan *ch, void *arg)
{
        const Role *role = arg;
        char name[32], label[32];
        gpuipc_buffer_t *slot[RING];
        bool published[RING] = { false };
        Drains drains = { 0 };
        gpuipc_t *c;
        int prev = -1;

        snprintf(name, sizeof(name), "soak/p%u", role->index);
        snprintf(label, sizeof(label), "producer-%u", role->index);
        c = soak_connect(role->broker, label);
        for (int k = 0; k < RING; k++)
                CHECK_OK(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, FRAME_BYTES, 0, &slot[k]));
        h_report(ch, 'u', "up");
        for (uint64_t n = 1; !atomic_load(&shared->stop); n++) {
                int k = (int)(n % RING), r;

                /* The slot we overwrite: retired when its successor was published; wait for it. */
                if (published[k]) {
                        while ((r = gpuipc_wait_drained(c, slot[k], 2000)) == GPUIPC_E_TIMEOUT &&
                               !atomic_load(&shared->stop))
                                atomic_fetch_add(&shared->drained_waits_timed_out, 1);
                        if (r == GPUIPC_E_TIMEOUT)
                                break;
                        CHECK_OK(c, r);
                        drained_seen(&drains, gpuipc_buffer_id(slot[k]), gpuipc_buffer_generation(slot[k]));
                }
                frame_fill(gpuipc_buffer_ptr(slot[k]), n);
                if (prev >= 0) {
                        r = gpuipc_retire(c, slot[prev]);
                        if (r < 0)
                                atomic_fetch_add(&shared->call_failures, 1);
                }
                r = gpuipc_publish(c, slot[k], name, NULL);
                if (r < 0) {
                        /* Only a name taken by our own dead predecessor's orphan could do this, and
                         * nothing here is broker-held: count it, the parent fails on any. */
                        atomic_fetch_add(&shared->call_failures, 1);
                        h_log("publish: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(c));
                        h_sleep_ms(10);
                        continue;
                }
                published[k] = true;
                prev = k;
                atomic_fetch_add(&shared->frames_published, 1);
                take_events(c, 0, 0, &drains);
        }
        gpuipc_close(c);
        return 0;
}

static int consumer(HChan *ch, void *arg)
{
        const Role *role = arg;
        unsigned seed = 0x5eed + role->index * 7919u + (unsigned)getpid();
        Seat *seat = &shared->seats[role->index];
        uint64_t seq = 0;
        char label[32];
        gpuipc_t *c;

        snprintf(label, sizeof(label), "consumer-%u", role->index);
        c = soak_connect(role->broker, label);
        h_report(ch, 'u', "up");
        while (!atomic_load(&shared->stop)) {
                char name[32];
                gpuipc_buffer_t *b = NULL;
                uint64_t first, again;
                int r;

                snprintf(name, sizeof(name), "soak/p%u", (unsigned)(rand_r(&seed) % N_PRODUCERS));
                uint64_t id, gen;
                bool revoked, changed = false;

                r = gpuipc_attach(c, name, 2000, &b);
                if (r < 0) {
                        atomic_fetch_add(&shared->attach_failures, 1);
                        take_events(c, 0, 0, NULL);
                        continue;
                }
                id = gpuipc_buffer_id(b);
                gen = gpuipc_buffer_generation(b);
                hold_publish(&seat->hold, true, ++seq, id, gen);
                if (!frame_whole(gpuipc_buffer_ptr(b), &first)) {
                        atomic_fetch_add(&shared->torn_at_attach, 1);
                } else {
                        /* Hold it a while, now and then long enough to span a broker restart
                         * (but well within the restart grace), then look again. */
                        unsigned dice = (unsigned)rand_r(&seed) % 100;
                        if (dice == 0)
                                h_sleep_ms(200 + (unsigned)rand_r(&seed) % 500);
                        else if (dice < 25)
                                h_sleep_ms((unsigned)rand_r(&seed) % 20);
                        changed = !frame_whole(gpuipc_buffer_ptr(b), &again) || again != first;
                        atomic_fetch_add(&shared->frames_verified, 1);
                }
                /* No longer held from here on: a drained that follows is this release's. */
                hold_publish(&seat->hold, false, seq, id, gen);
                revoked = gpuipc_buffer_revoked(b);
                r = gpuipc_release(c, b);
                if (r < 0) {
                        atomic_fetch_add(&shared->call_failures, 1);
                        h_log("release: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(c));
                }
                /* A revocation the release itself learned of (it reconnected and the reclaim was
                 * refused) comes as an event. */
                revoked |= take_events(c, id, gen, NULL);
                if (revoked)
                        atomic_fetch_add(&shared->revoked_holds, 1);
                /* Judged once it is known whether the hold was revoked: a holder that did not come
                 * back within the restart grace is treated as gone (docs/design.md "Broker
                 * restarts"), its memory may be reused, and it hears so; nobody else may see a change. */
                if (changed) {
                        atomic_fetch_add(revoked ? &shared->changed_revoked : &shared->changed_while_held, 1);
                        h_log("frame %" PRIu64 " of %s changed while held%s", first, name,
                              revoked ? " (the hold was revoked)" : "");
                }
                atomic_store(&seat->finished[seq % FINISHED_RING].revoked, revoked);
                atomic_store(&seat->finished[seq % FINISHED_RING].seq, seq);
        }
        gpuipc_close(c);
        return 0;
}

typedef struct Peer {
        HChild *kid;
        Role role;
        bool is_producer;
} Peer;

static void peer_start(Peer *p)
{
        char name[32];

        if (!p->is_producer) {
                Seat *seat = &shared->seats[p->role.index];

                /* The process it replaces may have died in the middle of a write. */
                atomic_fetch_add(&seat->incarnation, 1);
                atomic_store(&seat->hold.version, 0);
                hold_publish(&seat->hold, false, 0, 0, 0);
                for (unsigned i = 0; i < FINISHED_RING; i++)
                        atomic_store(&seat->finished[i].seq, 0);
                atomic_store(&seat->alive, true);
        }

        snprintf(name, sizeof(name), "%s-%u", p->is_producer ? "producer" : "consumer", p->role.index);
        p->kid = h_spawn(name, p->is_producer ? producer : consumer, &p->role);
        h_child_expect(p->kid, 'u', H_SOON_MS, NULL, 0);
}

static uint64_t env_u64(const char *name, uint64_t fallback)
{
        const char *v = getenv(name);

        return v && *v ? strtoull(v, NULL, 10) : fallback;
}

/* Rings of producers and verifying consumers under random SIGKILLs of peers and of the broker (a
 * minute, or 20 with GPUIPC_SOAK=long): no consumer ever sees a frame change while it holds it, and
 * no producer is told "drained" while a live consumer holds an unrevoked reference. */
static void test_soak(void)
{
        char grace[24];
        const char *const flags[] = { "--restart-grace-ms", grace, NULL };
        const char *mode = getenv("GPUIPC_SOAK");
        const bool long_mode = mode && strcmp(mode, "long") == 0;
        const uint64_t soak_ms = env_u64("GPUIPC_SOAK_MS", long_mode ? SOAK_MS_LONG : SOAK_MS_DEFAULT);
        const unsigned n_broker_kills = (unsigned)env_u64("GPUIPC_SOAK_BROKER_KILLS",
                                                          long_mode ? soak_ms / BROKER_KILL_EVERY_MS_LONG
                                                                    : BROKER_KILLS_DEFAULT);
        Peer peers[N_PRODUCERS + N_CONSUMERS];
        unsigned kills = 0, broker_kills = 0, seed = 12345;
        uint64_t t0, next_kill, verified_before_last_restart = 0;
        Verdicts verdicts = { 0 };
        HBroker *b;

        snprintf(grace, sizeof(grace), "%" PRIu64, env_u64("GPUIPC_SOAK_GRACE_MS", 2000));
        shared = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        CHECK(shared != MAP_FAILED);
        memset(shared, 0, sizeof(*shared));
        verdicts.done = calloc(MAX_SUSPECTS, sizeof(*verdicts.done));
        CHECK(verdicts.done);
        b = h_broker_start(flags);
        for (unsigned i = 0; i < N_PRODUCERS + N_CONSUMERS; i++) {
                peers[i] =
                        (Peer){ .role = { b, i < N_PRODUCERS ? i : i - N_PRODUCERS }, .is_producer = i < N_PRODUCERS };
                peer_start(&peers[i]);
        }

        t0 = monotonic_ms();
        next_kill = t0 + 1000;
        while (monotonic_ms() - t0 < soak_ms) {
                uint64_t now = monotonic_ms();

                judge_suspects(&verdicts, false);
                /* The broker, evenly spread (twice: at a third and two thirds of the way). */
                if (broker_kills < n_broker_kills &&
                    now - t0 >= (broker_kills + 1) * (soak_ms / (n_broker_kills + 1))) {
                        verified_before_last_restart = atomic_load(&shared->frames_verified);
                        h_broker_kill9(b);
                        h_sleep_ms(rand_r(&seed) % 300);
                        h_broker_restart(b);
                        broker_kills++;
                        h_log("broker killed and restarted (%u)", broker_kills);
                }
                /* A random peer every 1-2 seconds, started again at once. */
                if (now >= next_kill) {
                        Peer *p = &peers[rand_r(&seed) % (N_PRODUCERS + N_CONSUMERS)];

                        if (!p->is_producer) {
                                /* What its holds came to, while the seat still says. */
                                judge_suspects(&verdicts, false);
                                atomic_store(&shared->seats[p->role.index].alive, false);
                        }
                        h_child_kill9(p->kid);
                        h_child_free(p->kid);
                        peer_start(p);
                        kills++;
                        next_kill = now + 1000 + rand_r(&seed) % 1000;
                }
                h_sleep_ms(20);
        }
        atomic_store(&shared->stop, true);
        for (unsigned i = 0; i < N_PRODUCERS + N_CONSUMERS; i++) {
                h_child_wait_ok(peers[i].kid, H_SOON_MS);
                h_child_free(peers[i].kid);
        }
        judge_suspects(&verdicts, true);

        printf("soak: %u producers (rings of %u x %u KiB), %u consumers, %.0f s, restart grace %s ms, machine: %ld "
               "cpus\n", N_PRODUCERS, RING, FRAME_BYTES >> 10, N_CONSUMERS, (monotonic_ms() - t0) / 1000.0, grace,
               sysconf(_SC_NPROCESSORS_ONLN));
        printf("  %-38s %10u\n", "peers killed (SIGKILL)", kills);
        printf("  %-38s %10u\n", "broker restarts (SIGKILL)", broker_kills);
        printf("  %-38s %10" PRIu64 "\n", "frames published", (uint64_t)shared->frames_published);
        printf("  %-38s %10" PRIu64 "\n", "frames verified (twice each)", (uint64_t)shared->frames_verified);
        printf("  %-38s %10" PRIu64 "\n", "  ... after the last broker restart",
               (uint64_t)shared->frames_verified - verified_before_last_restart);
        printf("  %-38s %10" PRIu64 "\n", "frames changed while held, not revoked",
               (uint64_t)shared->changed_while_held);
        printf("  %-38s %10" PRIu64 "\n", "frames changed on holds revoked later", (uint64_t)shared->changed_revoked);
        printf("  %-38s %10" PRIu64 "\n", "frames torn at attach", (uint64_t)shared->torn_at_attach);
        printf("  %-38s %10" PRIu64 "\n", "holds revoked", (uint64_t)shared->revoked_holds);
        printf("  %-38s %10" PRIu64 "\n", "reconnects seen", (uint64_t)shared->reconnects);
        printf("  %-38s %10" PRIu64 "\n", "attaches that failed (timeout)", (uint64_t)shared->attach_failures);
        printf("  %-38s %10" PRIu64 "\n", "drained waits over 2 s", (uint64_t)shared->drained_waits_timed_out);
        printf("  %-38s %10" PRIu64 "\n", "other failed calls", (uint64_t)shared->call_failures);
        printf("  %-38s %10u\n", "drained while a live consumer held it", verdicts.judged);
        printf("  %-38s %10u\n", "  ... its reference revoked (allowed)", verdicts.revoked);
        printf("  %-38s %10u\n", "  ... NOT revoked (violation)", verdicts.not_revoked);
        printf("  %-38s %10u\n", "  ... holder killed before it let go", verdicts.holder_killed);
        printf("  %-38s %10" PRIu64 "\n", "revocations seen", (uint64_t)shared->revocations);
        printf("  %-38s %10" PRIu64 "\n", "  ... without a reason", (uint64_t)shared->revocations_without_reason);
        for (unsigned i = 0; i < MAX_REASONS && shared->reasons[i].text[0]; i++)
                printf("    %8" PRIu64 "  %s\n", (uint64_t)shared->reasons[i].count, shared->reasons[i].text);
        if (shared->reasons_other)
                printf("    %8" PRIu64 "  (other reasons)\n", (uint64_t)shared->reasons_other);
        fflush(stdout);

        CHECK_EQ(broker_kills, n_broker_kills);
        CHECK(kills >= soak_ms / 3000);
        CHECK_EQ(verdicts.not_revoked, 0);
        CHECK_EQ(shared->revocations_without_reason, 0);
        CHECK_EQ(shared->changed_while_held, 0);
        CHECK_EQ(shared->torn_at_attach, 0);
        CHECK_EQ(shared->call_failures, 0);
        CHECKF(shared->frames_verified >= 1000, "only %" PRIu64 " frames verified", (uint64_t)shared->frames_verified);
        /* The system recovered from the last restart, not only from the first. */
        CHECK(shared->frames_verified - verified_before_last_restart >= 100);
        CHECK(n_broker_kills == 0 || shared->reconnects > 0);
        free(verdicts.done);
        h_broker_settle(b);
        h_broker_stop(b);
}

int main(int argc, char **argv)
{
        static const HTest tests[] = {
                H_TEST(test_soak),
        };

        return h_main(argc, argv, tests, sizeof(tests) / sizeof(tests[0]));
}
