/* Fair shares of the broker's time between uids and their connections: see fair.h.
 *
 * What it must never do: read a frame itself, starve a connection (every ready one reads a frame
 * within a bounded number of rounds; under a limit, a light one in every pacing window and a
 * costly one within a bounded number of windows), or leave a connection neither
 * ready, paced nor polled. */
#include "fair.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"

struct FairUid {
        HNode node;
        uint32_t uid;
        unsigned entries; /* connections joined: it goes with the last */
        List ready;       /* FairEntry.link, in turn order */
        List fresh;       /* FairEntry.link: ready after being idle, owing nothing; served first */
        unsigned n_ready;
        List link;        /* Fair.ready, while ready is not empty */
        int64_t credit_ns; /* what its next frames may take; below zero, what it owes */
        uint64_t round;    /* the last round it had a turn in */
        uint64_t window;   /* the window window_conns counts in */
        uint32_t window_conns; /* its connections served in that window */
        uint32_t prev_window_conns; /* and in the window before it */
};

static uint64_t cpu_now(const Fair *s)
{
        return s->cfg.cpu_ns(s->cfg.userdata);
}

void fair_init(Fair *s, const FairConfig *cfg)
{
        *s = (Fair){ .cfg = *cfg, .uids = HMAP_INIT };
        list_init(&s->ready);
        list_init(&s->paced);
        s->window_budget_ns = (uint64_t)cfg->cpu_limit_milli * FAIR_WINDOW_NS / 1000 * FAIR_TARGET_PERCENT / 100;
        s->window_start_ns = cfg->now_ns(cfg->userdata);
        s->window_cpu_start_ns = cpu_now(s);
        s->window = 1; /* entries start at 0: none counts as served in it */
}

void fair_deinit(Fair *s)
{
        /* Every entry left, and each uid went with its last one: only the table is left. */
        hmap_deinit(&s->uids);
}

size_t fair_uid_size(void)
{
        return sizeof(FairUid);
}

/* ---- membership ---- */

static FairUid *uid_find(Fair *s, uint32_t uid)
{
        return HMAP_FIND(&s->uids, hash_u64(uid), FairUid, node, x, x->uid == uid);
}

static void uid_free_if_unused(Fair *s, FairUid *u)
{
        if (u->entries > 0 || u == s->in_turn)
                return;
        list_unlink(&u->link);
        hmap_remove(&s->uids, &u->node);
        free(u);
}

int fair_join(Fair *s, FairEntry *e, uint32_t uid)
{
        FairUid *u = uid_find(s, uid);

        if (!u) {
                u = calloc(1, sizeof(*u));
                if (!u)
                        return -ENOMEM;
                u->uid = uid;
                list_init(&u->ready);
                list_init(&u->fresh);
                list_init(&u->link);
                if (hmap_insert(&s->uids, &u->node, hash_u64(uid)) < 0) {
                        free(u);
                        return -ENOMEM;
                }
        }
        u->entries++;
        *e = (FairEntry){ .uid = u, .state = FAIR_IDLE };
        list_init(&e->link);
        return 0;
}

/* Takes e off whatever list holds it; its uid leaves the turn order once nothing of it is ready.
 * A connection or uid that leaves keeps what it owes but banks nothing: credit is for the turns it
 * is ready. (A connection that lists in a loop is idle between its requests: what one listing
 * cost is still owed when the next comes.) */
static void unlink_entry(FairEntry *e)
{
        FairUid *u = e->uid;

        if (e->state == FAIR_READY)
                u->n_ready--;
        list_unlink(&e->link);
        e->credit_ns = MIN(e->credit_ns, 0);
        if (list_empty(&u->ready) && list_empty(&u->fresh) && list_linked(&u->link)) {
                list_unlink(&u->link);
                u->credit_ns = MIN(u->credit_ns, 0);
        }
}

void fair_leave(Fair *s, FairEntry *e)
{
        FairUid *u = e->uid;

        if (!u)
                return;
        unlink_entry(e);
        if (s->serving == e)
                s->serving = NULL;
        e->uid = NULL;
        e->state = FAIR_IDLE;
        u->entries--;
        uid_free_if_unused(s, u);
}

/* fresh: e was idle and owes nothing (see fair_ready). */
static void make_ready(Fair *s, FairEntry *e, bool fresh)
{
        FairUid *u = e->uid;

        e->state = FAIR_READY;
        list_append(fresh ? &u->fresh : &u->ready, &e->link);
        u->n_ready++;
        if (!list_linked(&u->link))
                list_append(&s->ready, &u->link);
}

/* A connection that owes nothing (its requests cost less than its share of a turn: a client that
 * pings or attaches) goes before those that still pay for a costly frame (a listing), in the order
 * they became ready: like a sparse flow in fq_codel, it asks for little and is answered at once,
 * where a rotation with them would make it wait for every costly frame of its uid in turn. Its
 * uid's share stays the same (the turn's bounds count its frame), and the rotation still has a
 * frame in every turn (see turn_pass). */
void fair_ready(Fair *s, FairEntry *e)
{
        if (e->uid && e->state == FAIR_IDLE)
                make_ready(s, e, e->credit_ns >= 0);
}

/* ---- pacing ---- */

uint64_t fair_wakeup_ns(const Fair *s)
{
        return list_empty(&s->paced) ? UINT64_MAX : s->window_start_ns + FAIR_WINDOW_NS;
}

/* What the broker owes after a window: what it used beyond the budget of the time that passed
 * (a window that lasted longer, the loop idle part of it, was allowed more), added to what it owed
 * before. Frames of light connections, read past the budget, are what makes it owe; the windows
 * after it pay it back by pacing the others earlier, so that the broker's use over a CFS period
 * stays at the budget however many light frames come late in each window. At most half a budget,
 * so that connections paced for their share still have half of every window. */
static uint64_t debt_after(const Fair *s, uint64_t elapsed_ns, uint64_t used_ns)
{
        uint64_t allowed = s->window_budget_ns * MIN(elapsed_ns, 4 * FAIR_WINDOW_NS) / FAIR_WINDOW_NS;
        uint64_t owed = s->debt_ns + used_ns;

        return owed > allowed ? MIN(owed - allowed, s->window_budget_ns / 2) : 0;
}

/* A new window once the last one is over: nobody has used anything in it, and the paced
 * connections are ready again (they had input when they were paced, and nobody read it since). */
static void window_roll(Fair *s)
{
        uint64_t now = s->cfg.now_ns(s->cfg.userdata), cpu;

        if (now - s->window_start_ns < FAIR_WINDOW_NS)
                return;
        cpu = cpu_now(s);
        if (s->window_budget_ns)
                s->debt_ns = debt_after(s, now - s->window_start_ns, cpu - s->window_cpu_start_ns);
        s->window++;
        s->window_start_ns = now;
        s->window_cpu_start_ns = cpu;
        s->prev_window_uids = s->window_uids;
        s->window_uids = 0;
        while (!list_empty(&s->paced)) {
                FairEntry *e = list_entry(s->paced.next, FairEntry, link);

                list_unlink(&e->link);
                make_ready(s, e, false);
                s->cfg.set_reading(e, true, s->cfg.userdata);
        }
}

/* What a per-window count that was last kept in `window` (its value there: kept) held in the window
 * before the current one, given what it held before that (kept_before): counts of a connection or
 * uid not served in either are 0. */
static uint64_t in_window_before(const Fair *s, uint64_t window, uint64_t kept, uint64_t kept_before)
{
        if (window == s->window)
                return kept_before;
        return window + 1 == s->window ? kept : 0;
}

/* Counts e (and its uid) as served in this window, the first time it is. */
static void window_count(Fair *s, FairEntry *e)
{
        FairUid *u = e->uid;

        if (u->window != s->window) {
                u->prev_window_conns = (uint32_t)in_window_before(s, u->window, u->window_conns, u->prev_window_conns);
                u->window = s->window;
                u->window_conns = 0;
                s->window_uids++;
        }
        if (e->window != s->window) {
                e->prev_used_ns = in_window_before(s, e->window, e->used_ns, e->prev_used_ns);
                e->window = s->window;
                e->used_ns = 0;
                u->window_conns++;
        }
}

/* CPU time e's frames took in this window and the one before, and in how many windows of those two
 * it was served or is now. */
static uint64_t recent_use(const Fair *s, const FairEntry *e, unsigned *ret_windows)
{
        uint64_t before = in_window_before(s, e->window, e->used_ns, e->prev_used_ns);

        *ret_windows = before ? 2 : 1;
        return before + (e->window == s->window ? e->used_ns : 0);
}

/* e's share of that many windows' budget: split evenly between the uids served in this window (e's
 * counted) or the one before, whichever were more, and the uid's part between its connections
 * the same way. */
static uint64_t recent_share(const Fair *s, const FairEntry *e, unsigned windows)
{
        const FairUid *u = e->uid;
        bool uid_now = u->window == s->window;
        uint32_t uids = MAX(s->window_uids + !uid_now, s->prev_window_uids);
        uint32_t conns_before = (uint32_t)in_window_before(s, u->window, u->window_conns, u->prev_window_conns);
        uint32_t conns = MAX((uid_now ? u->window_conns : 0) + (e->window != s->window), conns_before);

        return windows * s->window_budget_ns / MAX(uids, 1u) / MAX(conns, 1u);
}

/* Whether a frame of e's costs more than a connection's quantum (a listing), as its last one did. */
static bool costly(const FairEntry *e)
{
        return e->last_ns > FAIR_CONN_QUANTUM_NS;
}

/* Whether e must wait for the next window: the broker has used this window's budget (less what it
 * owes from the windows before), and e is not light: its frames took at least its share of the
 * budget over this window and the one before (or this one, if it was not served in that). A light
 * connection (a client pinging now and then) is served whenever it asks, in any window and as often
 * as it stays under its share, so a flood slows down only itself; its frames, read past the budget,
 * become the broker's debt, which the next windows take out of the flood's part. Together the light
 * ones take at most the budget (their shares add up to it), so the broker stays at its budget over a
 * CFS period.
 *
 * A costly connection (its last frame was: a listing) waits whatever it used, or sixteen
 * connections listing would each take a listing's time in every window, far past the budget, and
 * the kernel's quota would stop the whole broker; they take turns at what the windows leave them,
 * by their credit, and one is read every FAIR_COSTLY_WINDOWS windows whatever the budget says. */
static bool over_share(Fair *s, FairEntry *e)
{
        unsigned windows;
        uint64_t used;

        if (!s->window_budget_ns)
                return false;
        if (s->cpu_mark - s->window_cpu_start_ns + s->debt_ns < s->window_budget_ns)
                return false;
        if (costly(e))
                return s->window - s->costly_window < FAIR_COSTLY_WINDOWS;
        used = recent_use(s, e, &windows);
        return used >= recent_share(s, e, windows);
}

static void pace(Fair *s, FairEntry *e)
{
        unlink_entry(e);
        e->state = FAIR_PACED;
        list_append(&s->paced, &e->link);
        s->paced_total++;
        s->cfg.set_reading(e, false, s->cfg.userdata);
}

/* ---- rounds ---- */

/* Serves e's next frame and charges its CPU time to e and its uid: from the clock's last reading
 * (the end of the frame before, or the round's start) to now, so that a frame costs one reading of
 * the clock, and the scheduler's own work between two frames is charged to the second. True when a
 * frame was read. */
static bool serve_one(Fair *s, FairEntry *e)
{
        FairUid *u = e->uid;
        uint64_t start = s->cpu_mark, took;
        bool read;

        window_count(s, e);
        s->serving = e;
        read = s->cfg.serve(e, s->cfg.userdata);
        s->cpu_mark = cpu_now(s);
        took = s->cpu_mark - start;
        took = MIN(took, (uint64_t)INT64_MAX / 2);
        u->credit_ns -= (int64_t)took;
        if (!s->serving)
                return read; /* it left while its frame was handled: nothing more to do with it */
        s->serving = NULL;
        e->used_ns += took;
        e->last_ns = took;
        if (costly(e))
                s->costly_window = s->window;
        e->credit_ns -= (int64_t)took;
        /* Back to polling, frame or not: the poll tells whether more input is there, without a
         * read that finds none, and one that comes back from it owing nothing is fresh. */
        unlink_entry(e);
        e->state = FAIR_IDLE;
        return read;
}

/* Tries each connection of u that is ready, at most once: the fresh ones first, in the order they
 * came, but at most FAIR_FRAMES_PER_TURN - 1 frames of theirs per turn while others wait, so that
 * connections that come and go cannot keep the rotation from its turn; then the rotation in order.
 * One frame each while the turn may read more. Returns the frames read (frames: those read so far
 * in the turn); *ret_owing is the credit of the connection that owes least among those skipped to
 * pay back (0 when none was). */
static unsigned turn_pass(Fair *s, FairUid *u, unsigned frames, unsigned *fresh_frames, int64_t *ret_owing,
                          bool *ret_paced)
{
        unsigned tried = 0, n_ready = u->n_ready;

        *ret_owing = 0;
        /* Each connection that was ready when the pass began is tried once: one that leaves or is
         * paced is not waited for, and one that becomes ready meanwhile waits for the next turn. */
        while (tried < n_ready && frames < FAIR_FRAMES_PER_TURN && u->credit_ns > 0 &&
               !(list_empty(&u->ready) && list_empty(&u->fresh))) {
                /* The rotation's head was tried in this turn already when all it has are fresh ones
                 * moved there meanwhile: then there is nobody to keep waiting. */
                bool waiting = !list_empty(&u->ready) &&
                               list_first_entry(&u->ready, FairEntry, link)->turn != s->turns;
                bool fresh = !list_empty(&u->fresh) && (*fresh_frames < FAIR_FRAMES_PER_TURN - 1 || !waiting);
                FairEntry *e = list_entry(fresh ? u->fresh.next : u->ready.next, FairEntry, link);
                unsigned read;

                if (s->sweeping && !fresh)
                        break; /* the rotation waits for the next run: see fair_run */
                tried++;
                e->turn = s->turns;
                /* To the back of the rotation first: the next turn starts with the one after it. */
                list_unlink(&e->link);
                list_append(&u->ready, &e->link);
                e->credit_ns = MIN(e->credit_ns + FAIR_CONN_QUANTUM_NS, (int64_t)FAIR_CONN_QUANTUM_NS);
                if (e->credit_ns <= 0) {
                        /* Paying back: stays ready, tried again next turn. */
                        *ret_owing = *ret_owing ? MAX(*ret_owing, e->credit_ns) : e->credit_ns;
                        continue;
                }
                if (over_share(s, e)) {
                        pace(s, e);
                        *ret_paced = true;
                        continue;
                }
                read = serve_one(s, e);
                frames += read;
                *fresh_frames += fresh ? read : 0;
        }
        return frames;
}

/* One turn of uid u: its ready connections in order, one frame each, while it has credit and has
 * read fewer than FAIR_FRAMES_PER_TURN. Its connections share the uid's time the way uids share
 * the broker's: each has credit of its own, and one that owes (its last frame cost more than a
 * quantum: a listing) is passed over in its uid's turns until it paid, so that the uid's other
 * connections (a client pinging next to the same uid's listings) are not held to one frame per
 * costly one. What a connection owes counts against its siblings only: when every ready one owes,
 * they are all moved up by what the least indebted owes (its uid paid for the frame already, by
 * skipping turns), rather than wasting the turn. Returns the frames read. */
static unsigned turn(Fair *s, FairUid *u)
{
        unsigned frames = 0, fresh_frames = 0;
        bool paced = false;
        int64_t owing;

        u->credit_ns = MIN(u->credit_ns + FAIR_QUANTUM_NS, (int64_t)FAIR_QUANTUM_NS);
        if (u->credit_ns <= 0) {
                s->turns_skipped_total++;
                return 0;
        }
        s->in_turn = u;
        s->turns++;
        for (;;) {
                frames = turn_pass(s, u, frames, &fresh_frames, &owing, &paced);
                if (frames || paced || !owing)
                        break;
                /* Nothing read and all that is still ready owes: the next pass serves the one that
                 * owes least, and the others keep their distance from it. */
                list_for_each(l, &u->ready)
                        list_entry(l, FairEntry, link)->credit_ns -= owing;
                list_for_each(l, &u->fresh)
                        list_entry(l, FairEntry, link)->credit_ns -= owing;
        }
        s->in_turn = NULL;
        uid_free_if_unused(s, u);
        return frames;
}

static size_t ready_uids(const Fair *s)
{
        size_t n = 0;

        list_for_each(l, &s->ready)
                n++;
        return n;
}

/* Each uid ready at its start has its turn. Returns the frames read. */
static unsigned round_run(Fair *s)
{
        unsigned frames = 0;

        s->round++;
        for (;;) {
                FairUid *u = list_first_entry(&s->ready, FairUid, link);

                if (!u || u->round == s->round)
                        break; /* every uid ready at the round's start had its turn */
                u->round = s->round;
                list_unlink(&u->link);
                list_append(&s->ready, &u->link);
                frames += turn(s, u);
        }
        return frames;
}

void fair_run(Fair *s)
{
        unsigned frames = 0, round_frames;
        uint64_t start;
        size_t uids;

        window_roll(s);
        s->cpu_mark = start = cpu_now(s);
        uids = ready_uids(s);
        /* Rounds until one read a frame: uids that owe CPU time skip turns until they paid it
         * (credit grows by a quantum per turn, so this ends). */
        while (!frames && fair_busy(s))
                frames += round_run(s);
        /* Then a sweep: rounds that read only fresh connections (ready owing nothing: clients
         * waiting for each reply), while every uid still has some ready. Only the poll after the
         * run makes a served connection ready again, so a uid left with none ready would wait
         * while the others read more, and a client of the uid served in this run would wait for
         * the rotation's costly frames (a listing) it goes before when the poll has seen it: the
         * run ends there, as it does when the sweep reads nothing or has taken FAIR_RUN_NS. */
        s->sweeping = true;
        while (fair_busy(s) && ready_uids(s) == uids && s->cpu_mark - start < FAIR_RUN_NS) {
                round_frames = round_run(s);
                if (!round_frames)
                        break;
                frames += round_frames;
        }
        s->sweeping = false;
        s->frames_total += frames;
}

/* ---- the limit ---- */

/* At most this many CPUs: more than any machine the broker meets, and small enough that a window's
 * budget in nanoseconds never overflows. */
#define CPU_LIMIT_MAX_MILLI (1000u * 1000u)

/* A decimal number of thousandths: "250" with unit "m", or "0.25" without one. */
int fair_parse_cpu_limit(const char *s, uint32_t *ret_milli)
{
        uint64_t whole = 0, frac = 0, scale = 1000;
        const char *p = s;

        if (strcmp(s, "none") == 0) {
                *ret_milli = 0;
                return 0;
        }
        if (!isdigit((unsigned char)*p))
                return -EINVAL;
        for (; isdigit((unsigned char)*p); p++) {
                whole = whole * 10 + (uint64_t)(*p - '0');
                if (whole > CPU_LIMIT_MAX_MILLI)
                        return -EINVAL;
        }
        if (strcmp(p, "m") == 0) {
                *ret_milli = (uint32_t)whole;
                return 0;
        }
        if (*p == '.') {
                if (!isdigit((unsigned char)*++p))
                        return -EINVAL;
                for (; isdigit((unsigned char)*p); p++) {
                        if (scale > 1) /* digits past a thousandth are dropped */
                                frac += (uint64_t)(*p - '0') * (scale /= 10);
                }
        }
        if (*p || whole * 1000 + frac > CPU_LIMIT_MAX_MILLI)
                return -EINVAL;
        *ret_milli = (uint32_t)(whole * 1000 + frac);
        return 0;
}

/* quota / period in thousandths of a CPU, rounded down but at least 1 (a quota is never none). */
static int cpu_milli(uint64_t quota, uint64_t period, uint32_t *ret_milli)
{
        uint64_t milli;

        if (!period || quota > UINT64_MAX / 1000)
                return -EINVAL;
        milli = MAX(quota * 1000 / period, (uint64_t)1);
        *ret_milli = (uint32_t)MIN(milli, (uint64_t)CPU_LIMIT_MAX_MILLI);
        return 0;
}

/* One whole decimal number, and where it ended. */
static int parse_u64(const char *s, uint64_t *ret, const char **ret_end)
{
        char *end;

        if (!isdigit((unsigned char)*s))
                return -EINVAL;
        errno = 0;
        *ret = strtoull(s, &end, 10);
        if (errno)
                return -EINVAL;
        *ret_end = end;
        return 0;
}

static bool only_space(const char *s)
{
        while (*s == ' ' || *s == '\n')
                s++;
        return !*s;
}

int fair_parse_cpu_max(const char *text, uint32_t *ret_milli)
{
        uint64_t quota = 0, period;
        const char *p;
        bool none = strncmp(text, "max ", 4) == 0;

        if (none)
                p = text + 3;
        else if (parse_u64(text, &quota, &p) < 0)
                return -EINVAL;
        if (*p != ' ' || parse_u64(p + 1, &period, &p) < 0 || !only_space(p))
                return -EINVAL;
        if (none) {
                *ret_milli = 0;
                return 0;
        }
        return cpu_milli(quota, period, ret_milli);
}

int fair_parse_cfs(const char *quota, const char *period, uint32_t *ret_milli)
{
        uint64_t q, per;
        const char *end;

        if (strncmp(quota, "-1", 2) == 0 && only_space(quota + 2)) {
                *ret_milli = 0;
                return 0;
        }
        if (parse_u64(quota, &q, &end) < 0 || !only_space(end) || parse_u64(period, &per, &end) < 0 ||
            !only_space(end))
                return -EINVAL;
        return cpu_milli(q, per, ret_milli);
}

int fair_parse_cgroup_v1(const char *text, const char *controller, char *ret, size_t cap)
{
        size_t want = strlen(controller);

        /* "ID:CONTROLLER[,CONTROLLER...]:PATH" per line; v2's "0::PATH" names none. */
        for (const char *line = text; line && *line;) {
                const char *end = strchr(line, '\n'), *list = strchr(line, ':'), *path;
                size_t len = end ? (size_t)(end - line) : strlen(line);

                path = list && list < line + len ? memchr(list + 1, ':', (size_t)(line + len - list - 1)) : NULL;
                for (const char *c = list ? list + 1 : NULL; path && c < path;) {
                        const char *comma = memchr(c, ',', (size_t)(path - c));
                        size_t n = (size_t)((comma ? comma : path) - c);

                        if (n == want && memcmp(c, controller, n) == 0) {
                                size_t plen = (size_t)(line + len - path - 1);

                                if (plen >= cap)
                                        return -ENAMETOOLONG;
                                memcpy(ret, path + 1, plen);
                                ret[plen] = 0;
                                return 0;
                        }
                        c = comma ? comma + 1 : path;
                }
                line = end ? end + 1 : NULL;
        }
        return -ENOENT;
}
