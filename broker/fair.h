/* The broker's time, shared between peers: which connection's next frame is read, and when. Peers
 * whose sockets have input are served in rounds: every uid with input has one turn per round, and
 * in its turn each of its ready connections reads at most one frame, at most FAIR_FRAMES_PER_TURN
 * frames in all, while the uid has credit (deficit round robin on the CPU time frames take: a turn
 * that ran over, a long listing, is paid back by skipping turns). A connection has credit of its
 * own as well, paid back the same way within its uid's turns. So one connection that floods, or a
 * uid with many connections, gets no more than its share of any round, and costly requests count
 * for what they cost, against their uid and against the other connections of that uid. Within a
 * uid, a connection that was idle and owes nothing (a client waiting for each reply) goes first.
 *
 * Under a CPU limit (a container's quota), the broker also keeps its own use below the limit: once
 * it used FAIR_TARGET_PERCENT of the limit in the current pacing window, a connection that took its
 * share of the budget over this window and the one before waits for the next window, and so does one
 * whose last frame was costly (a listing; one such frame is read every FAIR_COSTLY_WINDOWS windows
 * whatever the budget). Connections under their share (light) are still served at once, so a flood
 * is slowed down, not everyone else; what they take past the budget is owed, and taken from the next
 * windows' budgets, so that the kernel's quota, which would stop the whole broker until its period
 * ends, is not reached by a flood and the clients beside it together.
 *
 * Pure logic: no libuv and no sockets. The server reads frames (serve), turns a socket's polling
 * on and off (set_reading), says which sockets have input (fair_ready, level-triggered: again after
 * each frame while more is there) and runs the scheduler whenever fair_busy says there is work,
 * without blocking in between; the clocks are the caller's, so tests drive them. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hmap.h"
#include "list.h"

/* Frames a uid reads in one turn at most, over all its connections (one each per turn). */
#define FAIR_FRAMES_PER_TURN 4
/* CPU time a uid may use per turn; what a frame takes beyond it is owed and paid back with the
 * uid's next turns. About 10 ordinary requests: enough that cheap requests are bounded by the
 * frame count, small enough that one round stays well under a millisecond per busy uid. */
#define FAIR_QUANTUM_NS (200 * 1000)
/* What one connection may take of its uid's turn: the turn's quantum split between the frames it
 * may read. A request cheaper than this (a ping, an attach) never waits for its connection's
 * credit; one that costs many times more (a listing) makes its connection skip that many of its
 * uid's turns, while the uid's other connections are served. */
#define FAIR_CONN_QUANTUM_NS (FAIR_QUANTUM_NS / FAIR_FRAMES_PER_TURN)
/* A run of the scheduler (fair_run) may go on with more rounds over the fresh connections (ready
 * owing nothing) for this long; the caller polls between runs. A level-triggered poll reports
 * every ready socket again, so a poll after each round cost more per frame the more connections
 * waited (4 frames, a uid's turn, per poll of 256 ready sockets); a connection whose input comes
 * meanwhile is seen at most this long (and one frame) later. */
#define FAIR_RUN_NS (200 * 1000)
/* Pacing counts CPU time in windows this long: much shorter than a CFS period (100 ms), so that a
 * flood's share is spread over the period rather than spent at its start. */
#define FAIR_WINDOW_NS (UINT64_C(10) * 1000 * 1000)
/* What the broker means to use of its CPU limit; the rest is headroom for what no frame accounts
 * for (polling, accepting, timers) and for the peers that were light until they were served. */
#define FAIR_TARGET_PERCENT 75
/* Past the budget, one costly frame (a listing) is still read every this many windows: a CFS
 * period (100 ms), so that listings next to light clients that use the whole budget still end. */
#define FAIR_COSTLY_WINDOWS 10

typedef struct FairUid FairUid;

typedef enum FairState {
        FAIR_IDLE,  /* no input known: its socket is polled */
        FAIR_READY, /* has input: in its uid's ready list */
        FAIR_PACED, /* has input but had its share of the window: not polled until the next one */
} FairState;

/* One connection's place in the scheduler, embedded in the server's Watch. */
typedef struct FairEntry {
        List link; /* its uid's ready list, or the scheduler's paced list */
        FairUid *uid;
        FairState state;
        uint64_t window;  /* the window used_ns counts in */
        uint64_t used_ns; /* CPU time its frames took in that window */
        uint64_t prev_used_ns; /* and in the window before it */
        uint64_t last_ns; /* CPU time its last frame took */
        int64_t credit_ns; /* what its next frames may take of its uid's turns; below zero, owed */
        uint64_t turn;     /* the last turn it was tried in (Fair.turns) */
} FairEntry;

typedef struct FairConfig {
        uint32_t cpu_limit_milli;          /* the broker's CPU limit in thousandths of a CPU; 0: none */
        uint64_t (*cpu_ns)(void *userdata); /* CPU time the broker has used (its thread's clock) */
        uint64_t (*now_ns)(void *userdata); /* the monotonic clock */
        /* Reads and handles one frame of e, delivering what it caused. True when a frame was read;
         * false when there was none (or e's peer is closing): e goes back to being polled. May make
         * any entry leave, e included. */
        bool (*serve)(FairEntry *e, void *userdata);
        /* Whether e's socket is polled for input: off while e is paced (polling it would spin). */
        void (*set_reading)(FairEntry *e, bool on, void *userdata);
        void *userdata;
} FairConfig;

typedef struct Fair {
        FairConfig cfg;
        HMap uids;              /* FairUid.node, by uid: one per uid with a connection */
        List ready;             /* FairUid.link: uids with ready connections, in turn order */
        List paced;             /* FairEntry.link */
        FairUid *in_turn;      /* the uid whose turn runs: not freed until it ends */
        FairEntry *serving;    /* the entry whose frame is being served; NULL once it left */
        uint64_t round;         /* rounds run: a uid has one turn per round */
        bool sweeping;          /* the run's later rounds: they read fresh connections only */
        uint64_t turns;         /* turns taken (not skipped), all uids together */
        uint64_t window, window_start_ns, window_cpu_start_ns;
        uint64_t window_budget_ns; /* CPU time the broker means to use per window; 0: no pacing */
        uint64_t debt_ns;          /* CPU time used beyond the budgets of the windows before: this one's is less */
        uint64_t costly_window;    /* the last window a frame took more than a connection's quantum in */
        uint64_t cpu_mark;      /* the CPU clock as last read in this round */
        uint32_t window_uids;   /* uids served in the current window */
        uint32_t prev_window_uids; /* and in the window before it */
        uint64_t frames_total;  /* frames served */
        uint64_t paced_total;   /* times a connection was made to wait for the next window */
        uint64_t turns_skipped_total; /* turns a uid skipped to pay back CPU time it owed */
} Fair;

/* An empty scheduler; cfg's functions must all be set (cpu_limit_milli may be 0). */
void fair_init(Fair *s, const FairConfig *cfg);

/* Frees what is left; every entry must have left. */
void fair_deinit(Fair *s);

/* Adds a connection of uid, idle. 0 or -ENOMEM. */
int fair_join(Fair *s, FairEntry *e, uint32_t uid);

/* Takes a connection out, whatever its state; its memory may go once this returns. */
void fair_leave(Fair *s, FairEntry *e);

/* e's socket has input: it is served in its uid's next turn (a paced entry stays paced). */
void fair_ready(Fair *s, FairEntry *e);

/* Runs rounds: in each, every uid with ready connections has its turn (a new pacing window starts
 * first when the last one is over, which resumes the paced connections). After the first round
 * that read a frame, more rounds over fresh connections follow while every uid is still ready and
 * the run took less than FAIR_RUN_NS. A connection served goes back to idle: the caller polls it
 * again, and calls fair_ready when it has more input. */
void fair_run(Fair *s);

/* Whether connections are ready: the caller runs the scheduler again before it sleeps. */
static inline bool fair_busy(const Fair *s)
{
        return !list_empty(&s->ready);
}

/* When paced connections resume (on the now_ns clock), or UINT64_MAX when none waits. */
uint64_t fair_wakeup_ns(const Fair *s);

/* What a FairUid costs: the server charges it with each connection, as if none shared one. */
size_t fair_uid_size(void);

/* ---- the limit ---- */

/* The CPU limit of a flag: "250m" (thousandths of a CPU), "0.25" or "2" (CPUs), "0" or "none" for
 * no limit. At most 1000 CPUs. 0 or -EINVAL. */
int fair_parse_cpu_limit(const char *s, uint32_t *ret_milli);

/* A cgroup v2 cpu.max ("25000 100000", or "max 100000": no limit, *ret_milli = 0). 0 or -EINVAL. */
int fair_parse_cpu_max(const char *text, uint32_t *ret_milli);

/* A cgroup v1 quota and period (cpu.cfs_quota_us, cpu.cfs_period_us; a quota of -1: no limit,
 * *ret_milli = 0). 0 or -EINVAL. */
int fair_parse_cfs(const char *quota, const char *period, uint32_t *ret_milli);

/* The path of the cgroup v1 hierarchy that has controller (e.g. "cpu", in "4:cpu,cpuacct:/a/b") in
 * the text of /proc/self/cgroup, copied into ret (cap bytes). 0, -ENOENT or -ENAMETOOLONG. */
int fair_parse_cgroup_v1(const char *text, const char *controller, char *ret, size_t cap);
