/* The lifetime contract under faults, for about a minute: producers in rings, consumers verifying
 * every word of every frame while they hold it, random SIGKILLs of producers and consumers, and two
 * SIGKILLs of the broker itself. A frame that changes while a consumer holds it means some peer was
 * told "drained" while memory was still in use: the count must be zero.
 *
 * Producers (each a process) own a ring of RING slots. For frame n they wait until the slot they
 * are about to overwrite has drained, write frame n into it (word 0 is n, word i is a function of
 * n and i), retire the previous frame and publish this one under the producer's name. Consumers (each
 * a process) attach a random producer's name, check every word, hold it a little, check every word
 * again, and release. Everyone connects with the reconnect option. The parent kills and restarts
 * them, and the broker, and prints a table of what happened. */
#include <inttypes.h>
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
#define SOAK_MS_DEFAULT 60000 /* GPUIPC_SOAK_MS overrides it, for trying things out */
#define BROKER_KILLS 2

/* Counters the children add to, in memory shared with the parent. */
typedef struct Shared {
        atomic_bool stop;
        atomic_uint_fast64_t frames_published, frames_verified, changed_while_held, changed_revoked;
        atomic_uint_fast64_t torn_at_attach, revoked_holds, attach_failures, call_failures, reconnects;
        atomic_uint_fast64_t drained_waits_timed_out;
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

static gpuipc_t *soak_connect(const HBroker *b, const char *label)
{
        gpuipc_options_t o = { .struct_size = sizeof(o), .label = label, .reconnect = 1,
                               .connect_timeout_ms = H_SOON_MS, .no_gpus = 1 };
        gpuipc_t *c = NULL;
        int r = h_try_connect(b, &o, &c);

        CHECKF(r == 0, "connect: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(NULL));
        return c;
}

/* Counts the RECONNECTED events a connection has queued (others are dropped). */
static void count_reconnects(gpuipc_t *c)
{
        gpuipc_event_t ev;

        while (gpuipc_next_event(c, 0, &ev) == 0)
                if (ev.type == GPUIPC_EVENT_RECONNECTED)
                        atomic_fetch_add(&shared->reconnects, 1);
}

static int producer(HChan *ch, void *arg)
{
        const Role *role = arg;
        char name[32], label[32];
        gpuipc_buffer_t *slot[RING];
        bool published[RING] = { false };
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
                count_reconnects(c);
        }
        gpuipc_close(c);
        return 0;
}

static int consumer(HChan *ch, void *arg)
{
        const Role *role = arg;
        unsigned seed = 0x5eed + role->index * 7919u + (unsigned)getpid();
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
                r = gpuipc_attach(c, name, 2000, &b);
                if (r < 0) {
                        atomic_fetch_add(&shared->attach_failures, 1);
                        count_reconnects(c);
                        continue;
                }
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
                        if (!frame_whole(gpuipc_buffer_ptr(b), &again) || again != first) {
                                atomic_fetch_add(gpuipc_buffer_revoked(b) ? &shared->changed_revoked
                                                                         : &shared->changed_while_held, 1);
                                h_log("frame %" PRIu64 " of %s changed while held", first, name);
                        }
                        atomic_fetch_add(&shared->frames_verified, 1);
                }
                if (gpuipc_buffer_revoked(b))
                        atomic_fetch_add(&shared->revoked_holds, 1);
                r = gpuipc_release(c, b);
                if (r < 0) {
                        atomic_fetch_add(&shared->call_failures, 1);
                        h_log("release: %s [%s]", gpuipc_strerror(r), gpuipc_errmsg(c));
                }
                count_reconnects(c);
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

        snprintf(name, sizeof(name), "%s-%u", p->is_producer ? "producer" : "consumer", p->role.index);
        p->kid = h_spawn(name, p->is_producer ? producer : consumer, &p->role);
        h_child_expect(p->kid, 'u', H_SOON_MS, NULL, 0);
}

/* About a minute of rings of producers and verifying consumers under random SIGKILLs of peers and of the broker: no
 * consumer ever sees a frame change while it holds it. */
static void test_soak(void)
{
        static const char *const flags[] = { "--restart-grace-ms", "2000", NULL };
        const char *env = getenv("GPUIPC_SOAK_MS");
        const uint64_t soak_ms = env ? strtoull(env, NULL, 10) : SOAK_MS_DEFAULT;
        Peer peers[N_PRODUCERS + N_CONSUMERS];
        unsigned kills = 0, broker_kills = 0, seed = 12345;
        uint64_t t0, next_kill, verified_before_last_restart = 0;
        HBroker *b;

        shared = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        CHECK(shared != MAP_FAILED);
        memset(shared, 0, sizeof(*shared));
        b = h_broker_start(flags);
        for (unsigned i = 0; i < N_PRODUCERS + N_CONSUMERS; i++) {
                peers[i] = (Peer){ .role = { b, i < N_PRODUCERS ? i : i - N_PRODUCERS }, .is_producer = i < N_PRODUCERS };
                peer_start(&peers[i]);
        }

        t0 = h_now_ms();
        next_kill = t0 + 1000;
        while (h_now_ms() - t0 < soak_ms) {
                uint64_t now = h_now_ms();

                /* The broker, twice, at a third and two thirds of the way. */
                if (broker_kills < BROKER_KILLS && now - t0 >= (broker_kills + 1) * (soak_ms / 3)) {
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

        printf("soak: %u producers (rings of %u x %u KiB), %u consumers, %.0f s, machine: %ld cpus\n",
               N_PRODUCERS, RING, FRAME_BYTES >> 10, N_CONSUMERS, (h_now_ms() - t0) / 1000.0,
               sysconf(_SC_NPROCESSORS_ONLN));
        printf("  %-38s %10u\n", "peers killed (SIGKILL)", kills);
        printf("  %-38s %10u\n", "broker restarts (SIGKILL)", broker_kills);
        printf("  %-38s %10" PRIu64 "\n", "frames published", (uint64_t)shared->frames_published);
        printf("  %-38s %10" PRIu64 "\n", "frames verified (twice each)", (uint64_t)shared->frames_verified);
        printf("  %-38s %10" PRIu64 "\n", "  ... after the last broker restart",
               (uint64_t)shared->frames_verified - verified_before_last_restart);
        printf("  %-38s %10" PRIu64 "\n", "frames changed while held", (uint64_t)shared->changed_while_held);
        printf("  %-38s %10" PRIu64 "\n", "  ... of them on revoked handles", (uint64_t)shared->changed_revoked);
        printf("  %-38s %10" PRIu64 "\n", "frames torn at attach", (uint64_t)shared->torn_at_attach);
        printf("  %-38s %10" PRIu64 "\n", "holds revoked (a producer died)", (uint64_t)shared->revoked_holds);
        printf("  %-38s %10" PRIu64 "\n", "reconnects seen", (uint64_t)shared->reconnects);
        printf("  %-38s %10" PRIu64 "\n", "attaches that failed (timeout)", (uint64_t)shared->attach_failures);
        printf("  %-38s %10" PRIu64 "\n", "drained waits over 2 s", (uint64_t)shared->drained_waits_timed_out);
        printf("  %-38s %10" PRIu64 "\n", "other failed calls", (uint64_t)shared->call_failures);
        fflush(stdout);

        CHECK_EQ(broker_kills, BROKER_KILLS);
        CHECK(kills >= 20);
        CHECK_EQ(shared->changed_while_held, 0);
        CHECK_EQ(shared->changed_revoked, 0);
        CHECK_EQ(shared->torn_at_attach, 0);
        CHECK_EQ(shared->call_failures, 0);
        CHECKF(shared->frames_verified >= 1000, "only %" PRIu64 " frames verified", (uint64_t)shared->frames_verified);
        /* The system recovered from the last restart, not only from the first. */
        CHECK(shared->frames_verified - verified_before_last_restart >= 100);
        CHECK(shared->reconnects > 0);
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
