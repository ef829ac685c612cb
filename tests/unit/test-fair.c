/* broker/fair.c: in a world of simulated connections and clocks, a uid's turn reads at most one
 * frame per connection and FAIR_FRAMES_PER_TURN in all, however many connections flood; costly
 * frames are paid back with skipped turns, by their uid and, within it, by their connection; a
 * client waiting for each reply goes before its uid's costly connections; under a CPU limit a
 * flood waits for the next window while light connections are still served, and resumes then;
 * past the budget costly connections wait too and take turns; connections that leave at any
 * point (their own frame included) are forgotten; and the limit's flag and cgroup files parse. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "fair.h"
#include "macro.h"

#define MAX_CONNS 64
#define MAX_LOG 16384

typedef struct SimConn {
        FairEntry e;
        int id;
        unsigned pending;  /* frames in its socket */
        uint64_t cost_ns;  /* what each takes */
        bool reading;      /* the server would poll it */
        int leave_on_serve; /* id of a connection that leaves while this one's frame is handled, or -1 */
        bool left;
} SimConn;

typedef struct World {
        Fair fair;
        uint64_t cpu, now;
        SimConn conns[MAX_CONNS];
        int n_conns;
        int log[MAX_LOG]; /* ids of the frames read, in order */
        int n_log;
} World;

static uint64_t sim_cpu(void *w)
{
        return ((World *)w)->cpu;
}

static uint64_t sim_now(void *w)
{
        return ((World *)w)->now;
}

static void conn_leave(World *w, SimConn *c)
{
        fair_leave(&w->fair, &c->e);
        c->left = true;
}

static bool sim_serve(FairEntry *e, void *userdata)
{
        World *w = userdata;
        SimConn *c = container_of(e, SimConn, e);

        CHECK(!c->left);
        CHECK(c->reading); /* a paced connection is never read */
        if (!c->pending)
                return false;
        c->pending--;
        w->cpu += c->cost_ns;
        w->now += c->cost_ns;
        CHECK(w->n_log < MAX_LOG);
        w->log[w->n_log++] = c->id;
        if (c->leave_on_serve >= 0)
                conn_leave(w, &w->conns[c->leave_on_serve]);
        return true;
}

static void sim_set_reading(FairEntry *e, bool on, void *userdata)
{
        SimConn *c = container_of(e, SimConn, e);

        CHECK(c->reading != on);
        c->reading = on;
}

static World *world_new(uint32_t cpu_limit_milli)
{
        World *w = calloc(1, sizeof(*w));

        CHECK(w);
        w->now = 1000000000; /* not 0: windows are measured from the start */
        fair_init(&w->fair, &(FairConfig){ .cpu_limit_milli = cpu_limit_milli, .cpu_ns = sim_cpu, .now_ns = sim_now,
                                           .serve = sim_serve, .set_reading = sim_set_reading, .userdata = w });
        return w;
}

/* A connection of uid with `pending` frames of cost_ns each, ready if it has any. */
static SimConn *conn_add(World *w, uint32_t uid, unsigned pending, uint64_t cost_ns)
{
        SimConn *c = &w->conns[w->n_conns];

        CHECK(w->n_conns < MAX_CONNS);
        *c = (SimConn){ .id = w->n_conns++, .pending = pending, .cost_ns = cost_ns, .reading = true,
                        .leave_on_serve = -1 };
        CHECK_EQ(fair_join(&w->fair, &c->e, uid), 0);
        if (pending)
                fair_ready(&w->fair, &c->e);
        return c;
}

/* The server's loop: a run of the scheduler, then the poll (level-triggered): every polled
 * connection with input is ready again. */
static void world_run(World *w)
{
        fair_run(&w->fair);
        for (int i = 0; i < w->n_conns; i++) {
                SimConn *c = &w->conns[i];

                if (!c->left && c->reading && c->pending)
                        fair_ready(&w->fair, &c->e);
        }
}

static void world_free(World *w)
{
        for (int i = 0; i < w->n_conns; i++) {
                if (!w->conns[i].left)
                        fair_leave(&w->fair, &w->conns[i].e);
        }
        CHECK_EQ(w->fair.uids.count, 0); /* every uid went with its last connection */
        fair_deinit(&w->fair);
        free(w);
}

/* The most frames of others read between two consecutive frames of conn `id` in the log. */
static int max_gap(const World *w, int id)
{
        int gap = 0, since = -1;

        for (int i = 0; i < w->n_log; i++) {
                if (w->log[i] != id) {
                        since += since >= 0;
                        continue;
                }
                gap = MAX(gap, since);
                since = 0;
        }
        return gap;
}

static unsigned count_of(const World *w, int id)
{
        unsigned n = 0;

        for (int i = 0; i < w->n_log; i++)
                n += w->log[i] == id;
        return n;
}

/* 48 connections of uid 1 flood; the one connection of uid 2 with as much to say reads a frame
 * every round, after at most FAIR_FRAMES_PER_TURN of the flood's (the old one-frame-per-wakeup
 * loop read one of each of the 48 in between). And the flood's connections take turns. */
static void test_uid_with_many_connections(void)
{
        World *w = world_new(0);
        SimConn *normal;

        for (int i = 0; i < 48; i++)
                conn_add(w, 1, 1000, 10000);
        normal = conn_add(w, 2, 40, 10000);
        while (normal->pending)
                world_run(w);
        CHECKF(max_gap(w, normal->id) <= FAIR_FRAMES_PER_TURN, "uid 2 waited for %d frames of uid 1",
               max_gap(w, normal->id));
        /* 39 rounds: each read FAIR_FRAMES_PER_TURN of uid 1, one connection after the other. */
        for (int i = 0; i < 48; i++)
                CHECK(count_of(w, i) >= 3 && count_of(w, i) <= 4);
        CHECK(fair_busy(&w->fair));
        world_free(w);
}

/* Many connections of one uid, each with a request waiting (clients waiting for each reply): a
 * run reads one frame of each, as many as FAIR_RUN_NS allows, instead of a turn's
 * FAIR_FRAMES_PER_TURN per poll (a level-triggered poll reports every ready socket again, so
 * polling every four frames cost more per frame the more connections waited). Never two of one
 * connection in a run; next to a uid with a single connection the run ends with the round that
 * served it, as its next frame waits for the poll; and a run does not go on to the rotation's
 * costly frames (listings) while the uid's clients served in it wait for the poll. */
static void test_sweep_over_many_connections(void)
{
        World *w = world_new(0);
        SimConn *single;
        unsigned frames_per_run = FAIR_RUN_NS / 10000 + 1;

        for (int i = 0; i < 60; i++)
                conn_add(w, 1, 3, 1000);
        world_run(w);
        CHECK_EQ(w->n_log, 60); /* 60 us: well inside a run */
        for (int i = 0; i < 60; i++)
                CHECK_EQ(count_of(w, i), 1u);
        world_free(w);

        w = world_new(0);
        for (int i = 0; i < 60; i++)
                conn_add(w, 1, 3, 10000);
        world_run(w);
        CHECKF(w->n_log >= (int)frames_per_run - 1 && w->n_log <= (int)frames_per_run + FAIR_FRAMES_PER_TURN,
               "a run read %d frames of 10 us", w->n_log);
        for (int i = 0; i < 60; i++)
                CHECK(count_of(w, i) <= 1);
        world_free(w);

        w = world_new(0);
        for (int i = 0; i < 60; i++)
                conn_add(w, 1, 3, 1000);
        single = conn_add(w, 2, 3, 1000);
        world_run(w);
        CHECK_EQ(w->n_log, FAIR_FRAMES_PER_TURN + 1);
        CHECK_EQ(count_of(w, single->id), 1u);
        world_free(w);

        /* 16 listers (frames of 1.5 connection quanta: each owes after its frame and has paid after
         * its next turn) taking turns in the rotation, and 8 clients of their uid: the run reads
         * every client (fresh) but no listing past its first round's, as the clients served in it
         * wait for the poll to go first again. */
        w = world_new(0);
        for (int i = 0; i < 16; i++)
                conn_add(w, 1, 1000, FAIR_CONN_QUANTUM_NS * 3 / 2);
        for (int i = 0; i < 40; i++)
                world_run(w);
        w->n_log = 0;
        for (int i = 0; i < 8; i++)
                conn_add(w, 1, 5, 1000);
        world_run(w);
        for (int i = 16; i < 24; i++)
                CHECK_EQ(count_of(w, i), 1u);
        CHECKF(w->n_log - 8 <= 1, "a run read %d listings beside 8 clients", w->n_log - 8);
        world_free(w);
}

/* Within a uid, each ready connection reads one frame per turn: a flooding connection of the same
 * uid as a normal one reads no more often than it. */
static void test_one_frame_per_connection_per_turn(void)
{
        World *w = world_new(0);
        SimConn *flood = conn_add(w, 7, 1000, 10000), *normal = conn_add(w, 7, 10, 10000);

        while (normal->pending)
                world_run(w);
        CHECK_EQ(max_gap(w, normal->id), 1);
        CHECK(count_of(w, flood->id) <= 11);
        world_free(w);
}

/* A uid whose frames cost three quanta reads one, then skips two turns to pay it back; the cheap
 * uid next to it reads a frame every round. */
static void test_costly_frames_paid_back(void)
{
        World *w = world_new(0);
        SimConn *lister = conn_add(w, 1, 100, 3 * FAIR_QUANTUM_NS), *pinger = conn_add(w, 2, 30, 10000);

        while (pinger->pending)
                world_run(w);
        CHECK_EQ(count_of(w, lister->id), 10);
        CHECK_EQ(max_gap(w, lister->id), 3);
        CHECK(max_gap(w, pinger->id) <= 1);
        CHECK(w->fair.turns_skipped_total >= 18);
        world_free(w);
}

/* Costly frames are owed by their connection too, not only by its uid: 16 connections listing
 * (frames of five quanta) next to 8 pinging ones of the same uid take their turns only as often as
 * they paid for them, not once per round whatever they cost (the rule before), so the pingers
 * are not held to one ping per 2 listings. */
static void test_costly_frames_owed_by_their_connection(void)
{
        World *w = world_new(0);
        SimConn *listers[16], *pingers[8];
        unsigned listed = 0, pinged = 0;

        for (int i = 0; i < 16; i++)
                listers[i] = conn_add(w, 1, 1000, 5 * FAIR_QUANTUM_NS);
        for (int i = 0; i < 8; i++)
                pingers[i] = conn_add(w, 1, 50, 10000);
        for (int round = 0; round < 2000 && pingers[0]->pending; round++)
                world_run(w);
        CHECK_EQ(pingers[0]->pending, 0u);
        for (int i = 0; i < 16; i++)
                listed += count_of(w, listers[i]->id);
        for (int i = 0; i < 8; i++)
                pinged += count_of(w, pingers[i]->id);
        /* Every listing is paid for: each costs twenty times a connection's share of a turn, so the 16
         * listers read a few listings each while the pingers read 50 pings each (with one frame per
         * connection and turn, they read two listings per ping). */
        CHECKF(listed * 4 <= pinged, "%u listings next to %u pings", listed, pinged);
        world_free(w);
}

/* A client that waits for each reply (idle between its requests, owing nothing) is served before
 * the connections of its uid that stay ready: 16 of them listing in a loop make it wait for at
 * most a frame or two between its pings, where the back of the rotation waited for every lister
 * that had paid for its next listing. */
static void test_waiting_client_goes_first(void)
{
        World *w = world_new(0);
        SimConn *pinger;
        unsigned sent = 1;
        int gap = 0;

        for (int i = 0; i < 16; i++)
                conn_add(w, 1, 1000, 5 * FAIR_QUANTUM_NS);
        pinger = conn_add(w, 1, 1, 10000);
        for (int round = 0; round < 20000 && sent < 100; round++) {
                world_run(w);
                /* Its next request once it found its socket empty: it waited for the reply. */
                if (pinger->e.state == FAIR_IDLE) {
                        pinger->pending = 1;
                        sent++;
                        fair_ready(&w->fair, &pinger->e);
                }
        }
        CHECK_EQ(sent, 100u);
        /* From its second ping on (its first waited in the rotation, as a new connection's does). */
        for (int i = 0, since = -1; i < w->n_log; i++) {
                if (w->log[i] == pinger->id)
                        since = 0;
                else if (since >= 0)
                        gap = MAX(gap, ++since);
        }
        CHECKF(gap <= 2, "it waited for %d listings", gap);
        world_free(w);
}

/* A connection with nothing to read goes back to being polled, and an idle scheduler runs nothing:
 * the server's loop may sleep. */
static void test_idle(void)
{
        World *w = world_new(0);
        SimConn *c = conn_add(w, 1, 2, 1000);

        world_run(w);
        CHECK_EQ(w->n_log, 1);
        CHECK(fair_busy(&w->fair));
        world_run(w); /* its second frame; still ready (it may have more) */
        world_run(w); /* finds none: idle */
        CHECK_EQ(w->n_log, 2);
        CHECK_EQ(c->e.state, FAIR_IDLE);
        CHECK(!fair_busy(&w->fair));
        CHECK_EQ(fair_wakeup_ns(&w->fair), UINT64_MAX);
        world_run(w);
        CHECK_EQ(w->n_log, 2);
        /* Input again: ready again. */
        c->pending = 1;
        fair_ready(&w->fair, &c->e);
        fair_ready(&w->fair, &c->e); /* twice is once */
        world_run(w);
        CHECK_EQ(w->n_log, 3);
        world_free(w);
}

/* Under 250m the broker means to use 1.875 ms of each 10 ms window. A flood uses that, then waits
 * (not polled) for the next window, while a light connection that comes meanwhile is still read
 * at once; at the window's end the flood resumes. No window sees much more than the budget. */
static void test_pacing_under_a_limit(void)
{
        const uint64_t budget = 250 * FAIR_WINDOW_NS / 1000 * FAIR_TARGET_PERCENT / 100;
        World *w = world_new(250);
        SimConn *flood = conn_add(w, 1, 100000, 50000), *light;
        uint64_t start_cpu = w->cpu, wake;

        while (fair_busy(&w->fair))
                world_run(w);
        CHECK_EQ(flood->e.state, FAIR_PACED);
        CHECK(!flood->reading);
        CHECK(w->cpu - start_cpu >= budget && w->cpu - start_cpu <= budget + flood->cost_ns);
        CHECK_EQ(w->fair.paced_total, 1);
        wake = fair_wakeup_ns(&w->fair);
        CHECK(wake != UINT64_MAX && wake > w->now);
        /* A light connection of another uid: read at once, though the window's budget is spent. */
        light = conn_add(w, 2, 3, 20000);
        world_run(w);
        world_run(w);
        world_run(w);
        CHECK_EQ(count_of(w, light->id), 3);
        CHECK_EQ(flood->e.state, FAIR_PACED);
        /* Nothing happens before the window ends... */
        world_run(w);
        world_run(w); /* light finds nothing more */
        CHECK(!fair_busy(&w->fair));
        /* ...and at its end the flood is polled and read again, for about one budget more. */
        w->now = wake;
        start_cpu = w->cpu;
        world_run(w);
        CHECK(flood->reading);
        while (fair_busy(&w->fair))
                world_run(w);
        CHECK_EQ(flood->e.state, FAIR_PACED);
        CHECK(w->cpu - start_cpu <= budget + flood->cost_ns);
        CHECK_EQ(w->fair.paced_total, 2);
        world_free(w);
}

/* Sixteen connections listing (1 ms a frame) and eight clients pinging once per window, one uid,
 * under 250m: each window's CPU stays within the budget and one listing (the old rule served every
 * lister once per window: 16 ms a window, the kernel's quota spent at once), and the windows
 * together within their budgets (what one overran is taken from the next), every client is
 * answered in every window, and every lister is still served within a bounded number of windows. */
static void test_costly_frames_wait_past_the_budget(void)
{
        const uint64_t budget = 250 * FAIR_WINDOW_NS / 1000 * FAIR_TARGET_PERCENT / 100, listing = 1000000;
        const int n_listers = 16, n_clients = 8, windows = 40;
        World *w = world_new(250);
        SimConn *listers[16], *clients[8];
        int last_served[16] = {0};
        unsigned served_before[16] = {0};
        uint64_t first_cpu = w->cpu;
        /* What the windows leave for listings once the clients had theirs, in windows per round of
         * all sixteen, and one more for where a round starts. */
        const int lister_bound = (int)(n_listers * listing / (budget - n_clients * 15000)) + 2;

        for (int i = 0; i < n_listers; i++)
                listers[i] = conn_add(w, 1, 1000000, listing);
        for (int i = 0; i < n_clients; i++)
                clients[i] = conn_add(w, 1, 0, 15000);
        for (int k = 1; k <= windows; k++) {
                uint64_t start_cpu = w->cpu, wake;
                unsigned pings[8];

                for (int i = 0; i < n_clients; i++) {
                        pings[i] = count_of(w, clients[i]->id);
                        clients[i]->pending = 1;
                        if (clients[i]->reading)
                                fair_ready(&w->fair, &clients[i]->e);
                }
                while (fair_busy(&w->fair))
                        world_run(w);
                /* (A frame's cost is known once it was read: the first window reads every lister.) */
                CHECK(k == 1 || w->cpu - start_cpu <= budget + listing + n_clients * clients[0]->cost_ns);
                if (k == 1)
                        first_cpu = w->cpu;
                for (int i = 0; i < n_clients; i++)
                        CHECK_EQ(count_of(w, clients[i]->id), pings[i] + 1);
                for (int i = 0; i < n_listers; i++) {
                        unsigned n = count_of(w, listers[i]->id);

                        if (n != served_before[i])
                                last_served[i] = k;
                        served_before[i] = n;
                        CHECK(k - last_served[i] <= lister_bound);
                }
                wake = fair_wakeup_ns(&w->fair);
                CHECK(wake != UINT64_MAX);
                w->now = MAX(w->now, wake);
        }
        CHECK(w->cpu - first_cpu <= (windows - 1) * budget + listing + n_clients * clients[0]->cost_ns);
        world_free(w);
}

/* Under 250m, n_floods connections of flood_uid read 25 us frames as fast as they are let, and
 * eight clients of client_uid ping twice in every window, each time after the flood has used the
 * window's budget. Every ping is read in its window (no client is ever paced), and from the third
 * window on the broker's CPU over all windows stays within their budgets: what the clients' pings
 * add past one window's budget is taken from the flood's part of the next (the rule before served
 * them on top, a quarter of the budget more in every window: the kernel's quota was reached and
 * everybody waited for the rest of its period). */
static void flood_beside_clients(uint32_t flood_uid, int n_floods, uint32_t client_uid)
{
        const uint64_t budget = 250 * FAIR_WINDOW_NS / 1000 * FAIR_TARGET_PERCENT / 100, ping = 25000;
        const int n_clients = 8, windows = 40, pings = 2;
        World *w = world_new(250);
        SimConn *floods[16], *clients[8];
        uint64_t cpu_from = 0;

        for (int i = 0; i < n_floods; i++)
                floods[i] = conn_add(w, flood_uid, 1000000, ping);
        for (int i = 0; i < n_clients; i++)
                clients[i] = conn_add(w, client_uid, 0, ping);
        for (int k = 1; k <= windows; k++) {
                unsigned before[8];

                if (k == 3)
                        cpu_from = w->cpu;
                while (fair_busy(&w->fair))
                        world_run(w);
                for (int i = 0; i < n_floods; i++)
                        CHECK_EQ(floods[i]->e.state, FAIR_PACED);
                for (int i = 0; i < n_clients; i++) {
                        before[i] = count_of(w, clients[i]->id);
                        clients[i]->pending = pings;
                        fair_ready(&w->fair, &clients[i]->e);
                }
                while (fair_busy(&w->fair))
                        world_run(w);
                for (int i = 0; i < n_clients; i++) {
                        CHECK(clients[i]->reading);
                        CHECK_EQ(count_of(w, clients[i]->id), before[i] + pings);
                }
                w->now = MAX(w->now, fair_wakeup_ns(&w->fair));
        }
        CHECK(w->cpu - cpu_from <= (windows - 2) * budget + n_clients * pings * ping + ping);
        world_free(w);
}

static void test_light_clients_beside_a_flood(void)
{
        flood_beside_clients(1, 1, 1);   /* one flooding connection of the clients' own uid */
        flood_beside_clients(2, 16, 1);  /* sixteen of another uid */
}

/* Without a limit nobody is ever paced. */
static void test_no_limit_no_pacing(void)
{
        World *w = world_new(0);
        SimConn *flood = conn_add(w, 1, 2000, 50000);

        while (flood->pending)
                world_run(w);
        CHECK_EQ(w->fair.paced_total, 0);
        CHECK_EQ(fair_wakeup_ns(&w->fair), UINT64_MAX);
        world_free(w);
}

/* A connection may leave while its own frame or another's is handled, and while paced. */
static void test_leaving_anywhere(void)
{
        World *w = world_new(250);
        SimConn *a = conn_add(w, 1, 5, 10000), *b = conn_add(w, 1, 5, 10000), *c = conn_add(w, 2, 5, 10000);

        a->leave_on_serve = a->id; /* its frame closes it */
        world_run(w);
        CHECK(a->left);
        c->leave_on_serve = b->id; /* another uid's frame closes b */
        while (!b->left)
                world_run(w);
        c->leave_on_serve = -1;
        while (fair_busy(&w->fair))
                world_run(w);
        CHECK_EQ(w->fair.uids.count, 1);
        /* A paced one leaves: nothing is left to wake up for. */
        c->pending = 100000;
        c->cost_ns = 500000;
        fair_ready(&w->fair, &c->e);
        while (fair_busy(&w->fair))
                world_run(w);
        CHECK_EQ(c->e.state, FAIR_PACED);
        conn_leave(w, c);
        CHECK_EQ(fair_wakeup_ns(&w->fair), UINT64_MAX);
        CHECK_EQ(w->fair.uids.count, 0);
        world_free(w);
}

static void test_parse_cpu_limit(void)
{
        uint32_t v = 7;

        CHECK_EQ(fair_parse_cpu_limit("250m", &v), 0);
        CHECK_EQ(v, 250);
        CHECK_EQ(fair_parse_cpu_limit("0.25", &v), 0);
        CHECK_EQ(v, 250);
        CHECK_EQ(fair_parse_cpu_limit("2", &v), 0);
        CHECK_EQ(v, 2000);
        CHECK_EQ(fair_parse_cpu_limit("1.5", &v), 0);
        CHECK_EQ(v, 1500);
        CHECK_EQ(fair_parse_cpu_limit("0.0001", &v), 0);
        CHECK_EQ(v, 0);
        CHECK_EQ(fair_parse_cpu_limit("none", &v), 0);
        CHECK_EQ(v, 0);
        CHECK_EQ(fair_parse_cpu_limit("0", &v), 0);
        CHECK_EQ(v, 0);
        CHECK_EQ(fair_parse_cpu_limit("1000", &v), 0);
        CHECK_EQ(v, 1000000);
        CHECK_EQ(fair_parse_cpu_limit("1001", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_limit("99999999999999999999m", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_limit("", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_limit("m", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_limit("-1", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_limit("1.", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_limit("0.5m", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_limit("250M", &v), -EINVAL);
}

static void test_parse_cgroup_files(void)
{
        char path[64];
        uint32_t v = 7;

        CHECK_EQ(fair_parse_cpu_max("25000 100000\n", &v), 0);
        CHECK_EQ(v, 250);
        CHECK_EQ(fair_parse_cpu_max("max 100000\n", &v), 0);
        CHECK_EQ(v, 0);
        CHECK_EQ(fair_parse_cpu_max("1 100000", &v), 0);
        CHECK_EQ(v, 1); /* a quota is never none */
        CHECK_EQ(fair_parse_cpu_max("25000", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_max("25000 0", &v), -EINVAL);
        CHECK_EQ(fair_parse_cpu_max("x 100000", &v), -EINVAL);
        CHECK_EQ(fair_parse_cfs("50000\n", "100000\n", &v), 0);
        CHECK_EQ(v, 500);
        CHECK_EQ(fair_parse_cfs("-1\n", "100000\n", &v), 0);
        CHECK_EQ(v, 0);
        CHECK_EQ(fair_parse_cfs("", "100000", &v), -EINVAL);
        CHECK_EQ(fair_parse_cgroup_v1("4:memory:/a\n1:cpu,cpuacct:/k8s/pod1\n0::/\n", "cpu", path, sizeof(path)), 0);
        CHECK_STREQ(path, "/k8s/pod1");
        CHECK_EQ(fair_parse_cgroup_v1("2:cpuacct:/x\n1:cpu:/\n", "cpu", path, sizeof(path)), 0);
        CHECK_STREQ(path, "/");
        CHECK_EQ(fair_parse_cgroup_v1("2:cpuset:/x\n0::/a\n", "cpu", path, sizeof(path)), -ENOENT);
        CHECK_EQ(fair_parse_cgroup_v1("0::/a\n", "cpu", path, sizeof(path)), -ENOENT);
        CHECK_EQ(fair_parse_cgroup_v1("1:cpu:/0123456789012345678901234567890123456789012345678901234567890123\n",
                                      "cpu", path, sizeof(path)),
                 -ENAMETOOLONG);
}

int main(int argc, char **argv)
{
        TEST_RUN(argc, argv, test_uid_with_many_connections);
        TEST_RUN(argc, argv, test_sweep_over_many_connections);
        TEST_RUN(argc, argv, test_one_frame_per_connection_per_turn);
        TEST_RUN(argc, argv, test_costly_frames_paid_back);
        TEST_RUN(argc, argv, test_costly_frames_owed_by_their_connection);
        TEST_RUN(argc, argv, test_waiting_client_goes_first);
        TEST_RUN(argc, argv, test_idle);
        TEST_RUN(argc, argv, test_pacing_under_a_limit);
        TEST_RUN(argc, argv, test_costly_frames_wait_past_the_budget);
        TEST_RUN(argc, argv, test_light_clients_beside_a_flood);
        TEST_RUN(argc, argv, test_no_limit_no_pacing);
        TEST_RUN(argc, argv, test_leaving_anywhere);
        TEST_RUN(argc, argv, test_parse_cpu_limit);
        TEST_RUN(argc, argv, test_parse_cgroup_files);
        return TEST_END();
}
