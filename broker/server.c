/* The event loop: the only file of the broker that includes <uv.h>. It accepts connections
 * (with a backoff when out of fds), watches each peer's socket and pidfd and tells the peer
 * (peer.c) what happened, reads peers' frames in the order the scheduler (fair.c) gives them,
 * delivers the registry's outbox, fires wait deadlines and the restart
 * grace, retries peers the kernel refused fds to, stops on SIGTERM/SIGINT and reloads the policy
 * on SIGHUP and when its file changes.
 *
 * What it must never do: decide anything about a frame or a peer (peer.c, request.c and the
 * registry do), or let a callback return with frames left in the outbox (deliver() runs last in
 * every callback, so what an event caused reaches the peers before the loop sleeps again). */
#include "server.h"

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "audit.h"
#include "clock.h"
#include "cpuclock.h"
#include "list.h"
#include "log.h"
#include "macro.h"
#include "peer.h"
#include "registry.h"
#include "request.h"
#include "reply.h"
#include "fair.h"

/* Bounded so a connection storm cannot starve the peers already connected: the listener stays
 * readable and is served again next round. */
#define ACCEPTS_PER_WAKEUP 64
/* Out of fds, a retry sooner would fail the same way; later would keep new peers waiting for
 * nothing once a peer closed. */
#define ACCEPT_BACKOFF_MS 100
/* Once this much of what the budget counts was freed, the heap is trimmed: the memory of peers that
 * came and went goes back to the system rather than staying in the allocator's free lists. */
#define TRIM_AFTER_BYTES (1u << 20)
/* What a connection costs besides its RegPeer, charged with it (RegConfig.peer_extra): its Peer and
 * Watch, the ring of unread fds conn.c allocates with the first fd, libuv's slots for its two fds,
 * and the kernel's socket and pidfd (slab the memory cgroup counts too). */
#define CONN_KERNEL_COST 2048
/* A change of the policy file is loaded once it has been quiet this long: one reload for a burst of
 * events (an editor's save, a ConfigMap update), none when a SIGHUP came meanwhile and loaded it. */
#define POLICY_SETTLE_MS 100
/* fair_cpu_ns: how old a reading of the thread's CPU clock may be to stand for the next one (plus
 * the monotonic time since; cpuclock.h). Longer than a loop iteration between a frame and the next
 * while peers are ready (a non-blocking epoll_wait: 1-3 us on a 2-core VM), shorter than the
 * kernel's time slices, so that a preemption makes the next reading a real one. */
#define CPU_CLOCK_REUSE_NS 20000

/* The loop's side of a peer: a poll on its socket and one on its pidfd, and its place in the
 * scheduler. Freed, with the peer, once libuv has released both. */
typedef struct Watch {
        Server *server;
        Peer *peer;
        uv_poll_t poll;
        uv_poll_t pid_poll;
        unsigned open_handles;
        int events;   /* what poll watches now (UV_* bits) */
        bool reading; /* its input is polled: off while the scheduler paces it */
        FairEntry fair;
} Watch;

struct Server {
        uv_loop_t loop;
        uv_poll_t listen_poll;
        uv_timer_t deadline_timer, accept_timer, retry_timer;
        uint64_t deadline_armed; /* the deadline deadline_timer is armed for; UINT64_MAX: none */
        uv_idle_t fair_idle;  /* runs the scheduler once per loop iteration while peers are ready */
        uv_timer_t pace_timer; /* resumes paced peers when the scheduler's window ends */
        uv_signal_t sig_term, sig_int, sig_hup;
        uv_poll_t policy_poll; /* the policy watch's fd, while s->watch is set */
        uv_timer_t policy_settle;
        PolicyWatch *watch;
        int listen_fd;
        bool listening, stopping;
        ServerConfig cfg;
        Registry *reg;
        Policy *policy;
        ServerStats stats;
        Budget budget;
        uint64_t freed_since_trim; /* bytes the budget got back since the heap was last trimmed */
        uint64_t pidns;
        Outbox out;
        RegSink changes; /* the registry's, into out (reply_sink) */
        PeerSet peers;
        Fair fair;
        CpuClock cpu_clock; /* fair_cpu_ns's */
};

static void deliver(Server *s);
static void deadline_cb(uv_timer_t *t);
static void watch_poll_cb(uv_poll_t *h, int status, int events);
static void retry_blocked_cb(uv_timer_t *t);

/* ---- watching peers ---- */

/* now_ms is the loop's cached time (uv_now, monotonic milliseconds): every deadline a request sets
 * and every expiry the registry checks use that one clock, read once per loop iteration. */
static RequestCtx request_ctx(Server *s)
{
        return (RequestCtx){ s->reg, s->policy, &s->stats, uv_now(&s->loop), s->pidns, &s->out };
}

/* Polls the socket for input unless the scheduler paces the peer, and for writing only while
 * frames wait for room in it. */
static void watch_update(Watch *w)
{
        int want = (w->reading ? UV_READABLE | UV_DISCONNECT : 0) | (peer_wants_write(w->peer) ? UV_WRITABLE : 0);

        if (w->peer->closing || want == w->events)
                return;
        w->events = want;
        if (want)
                uv_poll_start(&w->poll, want, watch_poll_cb);
        else
                uv_poll_stop(&w->poll);
}

/* libuv owns a handle's memory until its close callback: the Watch (which embeds both polls) and
 * the Peer go only after the last one closed. */
static void watch_closed_cb(uv_handle_t *h)
{
        Watch *w = h->data;

        if (--w->open_handles > 0)
                return;
        peer_free(w->peer);
        free(w);
}

/* The registry's earliest wait deadline (or the end of the restart grace) fires the deadline timer. */
static void rearm_deadline(Server *s)
{
        uint64_t next = registry_next_deadline(s->reg), now = uv_now(&s->loop);

        /* After every delivery, twice a request: most leave the earliest deadline as it was. */
        if (next == s->deadline_armed && (next == UINT64_MAX || uv_is_active((uv_handle_t *)&s->deadline_timer)))
                return;
        s->deadline_armed = next;
        /* One timer for every deadline: the registry keeps them in a heap, so only the earliest
         * needs arming. An overdue one (next <= now) fires on the next iteration. */
        if (next == UINT64_MAX)
                uv_timer_stop(&s->deadline_timer);
        else
                uv_timer_start(&s->deadline_timer, deadline_cb, next > now ? next - now : 0, 0);
}

/* Delivers everything the registry produced, then forgets peers that must go (which may produce
 * more frames: their references and buffers go with them), until nothing is left. A peer lost by
 * the registry (a frame for it could not be built) is closed on the way. */
static void deliver(Server *s)
{
        RegPeer *lost;

        for (;;) {
                for (size_t i = 0; i < s->out.n_frames; i++) {
                        Peer *p = peer_of(s->out.frames[i].to);

                        peer_send(p, &s->out.frames[i]);
                        watch_update(p->userdata);
                }
                outbox_clear(&s->out);
                while ((lost = registry_take_lost(s->reg)))
                        peer_close(peer_of(lost), AUDIT_GONE_DROPPED, "a message for it could not be built");
                if (list_empty(&s->peers.doomed))
                        break;
                while (!list_empty(&s->peers.doomed)) {
                        Peer *p = list_entry(s->peers.doomed.next, Peer, link);
                        Watch *w = p->userdata;

                        peer_forget(p, s->reg, &s->changes);
                        fair_leave(&s->fair, &w->fair);
                        uv_close((uv_handle_t *)&w->poll, watch_closed_cb);
                        if (p->pidfd >= 0)
                                uv_close((uv_handle_t *)&w->pid_poll, watch_closed_cb);
                }
        }
        /* After a burst of frees (peers gone, queues flushed), give the memory back: glibc keeps
         * freed chunks below its top for reuse, which would keep the RSS at its peak for good. */
        s->freed_since_trim += budget_take_freed(&s->budget);
        if (s->freed_since_trim >= TRIM_AFTER_BYTES) {
                s->freed_since_trim = 0;
                malloc_trim(0);
        }
        if (!list_empty(&s->peers.blocked) && !uv_is_active((uv_handle_t *)&s->retry_timer))
                uv_timer_start(&s->retry_timer, retry_blocked_cb, PEER_BLOCKED_RETRY_MS, 0);
        rearm_deadline(s);
}

/* Reads one frame of the peer's (see peer_dispatch) and delivers what it caused: the scheduler's
 * serve, called when the peer's turn comes. Returns whether a frame was read. */
static bool watch_read(Watch *w)
{
        Server *s = w->server;
        Peer *p = w->peer;
        /* A request's time in the broker: decoding, handling, and delivering what it caused. */
        uint64_t start = monotonic_us();
        RequestCtx ctx = request_ctx(s);

        if (!peer_dispatch(p, &ctx))
                return false;
        deliver(s);
        if (p->hangup[0])
                peer_close(p, AUDIT_GONE_DROPPED, p->hangup); /* its last reply went out with the delivery */
        /* Again: closing a peer queues what its departure causes (events, drained buffers). */
        deliver(s);
        histogram_record(&s->stats.request_us, monotonic_us() - start);
        return true;
}

/* ---- the scheduler's side ---- */

static uint64_t thread_cpu_ns(void)
{
        return clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

/* The broker's CPU time: its thread's clock (the loop is its only thread), which counts time on a
 * CPU only, so that time the kernel gave to others, or a quota's throttling, is charged to nobody.
 * A system call, not a vDSO read: cpuclock.h reuses a reading less than CPU_CLOCK_REUSE_NS old,
 * which takes these system calls from 2 to about 1 per frame (they were 2 of the 5 a ping cost). */
static uint64_t fair_cpu_ns(void *userdata)
{
        Server *s = userdata;

        return cpu_clock_get(&s->cpu_clock, monotonic_ns(), CPU_CLOCK_REUSE_NS, thread_cpu_ns);
}

static uint64_t fair_now_ns(void *userdata)
{
        (void)userdata;
        return monotonic_ns();
}

static bool fair_serve(FairEntry *e, void *userdata)
{
        (void)userdata;
        return watch_read(container_of(e, Watch, fair));
}

static void fair_set_reading(FairEntry *e, bool on, void *userdata)
{
        Watch *w = container_of(e, Watch, fair);

        (void)userdata;
        w->reading = on;
        watch_update(w);
}

static void fair_idle_cb(uv_idle_t *h);
static void pace_timer_cb(uv_timer_t *t);

/* After anything that may have made peers ready or paced them: while some are ready, the loop
 * runs a round per iteration and polls without sleeping; once none is, it sleeps (no busy loop),
 * until input comes or the paced ones' window ends. */
static void fair_arm(Server *s)
{
        uint64_t wake = fair_wakeup_ns(&s->fair), now = monotonic_ns();

        if (s->stopping)
                return;
        if (fair_busy(&s->fair)) {
                uv_idle_start(&s->fair_idle, fair_idle_cb);
        } else {
                uv_idle_stop(&s->fair_idle);
                cpu_clock_forget(&s->cpu_clock); /* the loop may sleep: that is no CPU time */
        }
        if (wake == UINT64_MAX) {
                uv_timer_stop(&s->pace_timer);
                return;
        }
        /* Never early: the loop's clock is in whole milliseconds and read when the iteration began,
         * and a timer that fired before the window's end would find nothing to resume and be armed
         * again at once, spinning away the CPU pacing saves. */
        uv_update_time(&s->loop);
        uv_timer_start(&s->pace_timer, pace_timer_cb, wake > now ? (wake - now) / 1000000 + 1 : 0, 0);
}

static void fair_idle_cb(uv_idle_t *h)
{
        Server *s = h->data;

        fair_run(&s->fair);
        deliver(s);
        fair_arm(s);
}

static void pace_timer_cb(uv_timer_t *t)
{
        Server *s = t->data;

        fair_run(&s->fair); /* the window ended: the paced peers are ready again */
        deliver(s);
        fair_arm(s);
}

static void watch_poll_cb(uv_poll_t *h, int status, int events)
{
        Watch *w = h->data;
        Peer *p = w->peer;

        if (status < 0) {
                peer_close(p, AUDIT_GONE_DROPPED, "poll error");
                deliver(w->server);
                return;
        }
        /* Writing before reading: room freed in the socket lets the replies the read may cause go
         * straight out instead of queueing behind older ones. */
        if ((events & UV_WRITABLE) && !p->closing) {
                peer_flush(p);
                watch_update(w);
        }
        /* Read in the peer's turn, not here: the scheduler decides who reads next. */
        if ((events & (UV_READABLE | UV_DISCONNECT)) && !p->closing) {
                fair_ready(&w->server->fair, &w->fair);
                fair_arm(w->server);
        }
        deliver(w->server);
}

/* The peer's process exited: its pidfd became readable. Watched besides the socket: a child forked
 * by the peer may keep the socket open after the process the kernel identified at accept is gone. */
static void watch_pidfd_cb(uv_poll_t *h, int status, int events)
{
        Watch *w = h->data;

        (void)status;
        (void)events;
        peer_close(w->peer, AUDIT_GONE_EXITED, "its process exited");
        deliver(w->server);
}

static void retry_blocked_cb(uv_timer_t *t)
{
        Server *s = t->data;
        List retry;

        /* Take the list: a peer the kernel still refuses goes back on it. */
        list_init(&retry);
        if (!list_empty(&s->peers.blocked)) {
                retry = s->peers.blocked;
                retry.next->prev = retry.prev->next = &retry;
                list_init(&s->peers.blocked);
        }
        while (!list_empty(&retry)) {
                Peer *p = list_entry(retry.next, Peer, blocked_link);

                peer_flush(p); /* takes it off the list, and back onto the blocked one if refused again */
                watch_update(p->userdata);
        }
        deliver(s);
}

/* ---- accepting ---- */

static void listen_cb(uv_poll_t *h, int status, int events);

static void accept_resume_cb(uv_timer_t *t)
{
        Server *s = t->data;

        if (s->listening)
                uv_poll_start(&s->listen_poll, UV_READABLE, listen_cb);
}

/* A new peer, and the polls on its socket and pidfd. */
static void watch_start(Server *s, int fd)
{
        Watch *w = calloc(1, sizeof(*w));
        Peer *p = NULL;

        if (!w) {
                close(fd);
                return;
        }
        if (peer_new(&p, &s->peers, s->reg, fd, uv_now(&s->loop)) != 0) {
                free(w);
                return;
        }
        w->server = s;
        w->peer = p;
        p->userdata = w;
        /* A socket or pidfd libuv cannot poll would be a broken system: the peer is dropped. */
        if (fair_join(&s->fair, &w->fair, p->creds.uid) < 0 || uv_poll_init(&s->loop, &w->poll, p->conn.fd) < 0) {
                peer_close(p, AUDIT_GONE_DROPPED, "cannot poll its socket");
                peer_forget(p, s->reg, &s->changes);
                fair_leave(&s->fair, &w->fair);
                peer_free(p);
                free(w);
                return;
        }
        w->poll.data = w;
        w->open_handles = 1;
        w->reading = true;
        w->events = UV_READABLE | UV_DISCONNECT;
        uv_poll_start(&w->poll, w->events, watch_poll_cb);
        /* open_handles counts what watch_closed_cb must see close before the Watch may go. */
        if (p->pidfd >= 0 && uv_poll_init(&s->loop, &w->pid_poll, p->pidfd) == 0) {
                w->pid_poll.data = w;
                w->open_handles++;
                uv_poll_start(&w->pid_poll, UV_READABLE, watch_pidfd_cb);
        } else {
                p->pidfd = safe_close(p->pidfd); /* watched by EOF alone, as without a pidfd */
        }
}

static void listen_cb(uv_poll_t *h, int status, int events)
{
        Server *s = h->data;

        (void)status;
        (void)events;
        for (int i = 0; i < ACCEPTS_PER_WAKEUP; i++) {
                int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

                if (fd < 0) {
                        if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS) {
                                /* Out of fds: stop listening briefly instead of spinning. */
                                log_warn("cannot accept", "error=\"%s\" backoff_ms=%d", strerror(errno),
                                         ACCEPT_BACKOFF_MS);
                                uv_poll_stop(&s->listen_poll);
                                uv_timer_start(&s->accept_timer, accept_resume_cb, ACCEPT_BACKOFF_MS, 0);
                        }
                        break;
                }
                watch_start(s, fd);
        }
        deliver(s);
}

/* ---- deadlines and signals ---- */

static void deadline_cb(uv_timer_t *t)
{
        Server *s = t->data;

        registry_expire(s->reg, uv_now(&s->loop), &s->changes);
        deliver(s);
}

static void server_stop(Server *s)
{
        if (s->stopping)
                return;
        s->stopping = true;
        if (s->listening) {
                uv_poll_stop(&s->listen_poll);
                s->listening = false;
        }
        /* Say why before hanging up: waiting requests get their answer, every peer a notice
         * addressed to its connection, so clients can tell a stop from a crash. */
        registry_cancel_waits(s->reg, &s->changes);
        list_for_each(pos, &s->peers.open)
                reply_error(&s->out, list_entry(pos, Peer, link)->reg, 0, PROTO_STATUS_SHUTDOWN,
                                    "the broker is stopping");
        deliver(s);
        list_for_each_safe(pos, &s->peers.open)
                peer_close(list_entry(pos, Peer, link), AUDIT_GONE_STOPPING, "the broker is stopping");
        deliver(s);
        /* Once every handle is closed, uv_run returns: closing them is how the loop ends, after
         * the notices above were delivered. */
        uv_timer_stop(&s->deadline_timer);
        uv_timer_stop(&s->accept_timer);
        uv_timer_stop(&s->retry_timer);
        uv_idle_stop(&s->fair_idle);
        uv_timer_stop(&s->pace_timer);
        uv_close((uv_handle_t *)&s->listen_poll, NULL);
        uv_close((uv_handle_t *)&s->fair_idle, NULL);
        uv_close((uv_handle_t *)&s->pace_timer, NULL);
        uv_close((uv_handle_t *)&s->deadline_timer, NULL);
        uv_close((uv_handle_t *)&s->accept_timer, NULL);
        uv_close((uv_handle_t *)&s->retry_timer, NULL);
        uv_close((uv_handle_t *)&s->sig_term, NULL);
        uv_close((uv_handle_t *)&s->sig_int, NULL);
        uv_close((uv_handle_t *)&s->sig_hup, NULL);
        if (s->watch) {
                uv_close((uv_handle_t *)&s->policy_poll, NULL);
                uv_close((uv_handle_t *)&s->policy_settle, NULL);
        }
}

/* Loads the policy again; a policy that does not load leaves the old one in force. */
static void reload_policy(Server *s, const char *trigger)
{
        Policy *p = NULL;

        if (!s->cfg.reload_policy)
                return;
        if (s->watch)
                uv_timer_stop(&s->policy_settle); /* this load covers a pending change too */
        if (s->cfg.reload_policy(s->cfg.reload_userdata, &p) < 0) {
                log_warn("policy reload failed; keeping the old policy", "trigger=%s", trigger);
                return;
        }
        /* Swapped between requests (the loop is single-threaded): no request sees half of each. */
        policy_free(s->policy);
        s->policy = p;
        s->cfg.policy = p;
        log_info("policy reloaded", "rules=%zu trigger=%s", policy_rule_count(p), trigger);
}

static void policy_settle_cb(uv_timer_t *t)
{
        reload_policy(t->data, "file");
}

static void policy_poll_cb(uv_poll_t *h, int status, int events)
{
        Server *s = h->data;
        bool lost = false;
        int r = status < 0 ? status : policy_watch_read(s->watch, &lost);

        if (r > 0)
                uv_timer_start(&s->policy_settle, policy_settle_cb, POLICY_SETTLE_MS, 0);
        if (r < 0 || lost) {
                if (r < 0)
                        log_warn("cannot read the policy watch; the policy is reloaded on SIGHUP only", "error=\"%s\"",
                                 strerror(-r));
                uv_poll_stop(h);
        }
}

static void signal_cb(uv_signal_t *h, int signum)
{
        Server *s = h->data;

        if (signum == SIGHUP) {
                reload_policy(s, "SIGHUP");
                return;
        }
        log_info("stopping", "signal=%s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
        server_stop(s);
}

/* ---- life cycle ---- */

/* Makes and starts every handle of the loop. 0, or the first libuv error (handles made before
 * it stay in the loop: loop_undo closes them). */
static int server_start_handles(Server *s)
{
        int r;

        if ((r = uv_poll_init(&s->loop, &s->listen_poll, s->listen_fd)) < 0 ||
            (r = uv_timer_init(&s->loop, &s->deadline_timer)) < 0 ||
            (r = uv_timer_init(&s->loop, &s->accept_timer)) < 0 ||
            (r = uv_timer_init(&s->loop, &s->retry_timer)) < 0 ||
            (r = uv_idle_init(&s->loop, &s->fair_idle)) < 0 || (r = uv_timer_init(&s->loop, &s->pace_timer)) < 0 ||
            (r = uv_signal_init(&s->loop, &s->sig_term)) < 0 ||
            (r = uv_signal_init(&s->loop, &s->sig_int)) < 0 ||
            (r = uv_signal_init(&s->loop, &s->sig_hup)) < 0)
                return r;
        s->listen_poll.data = s->deadline_timer.data = s->accept_timer.data = s->retry_timer.data = s;
        s->fair_idle.data = s->pace_timer.data = s;
        s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
        s->deadline_timer.timer_cb = deadline_cb;
        s->deadline_armed = UINT64_MAX;
        /* Signals through libuv: handled in the loop between callbacks, so a SIGHUP's reload or a
         * SIGTERM's stop never runs in the middle of a request. */
        if ((r = uv_signal_start(&s->sig_term, signal_cb, SIGTERM)) < 0 ||
            (r = uv_signal_start(&s->sig_int, signal_cb, SIGINT)) < 0 ||
            (r = uv_signal_start(&s->sig_hup, signal_cb, SIGHUP)) < 0 ||
            (r = uv_poll_start(&s->listen_poll, UV_READABLE, listen_cb)) < 0)
                return r;
        s->listening = true;
        if (s->watch) {
                if ((r = uv_poll_init(&s->loop, &s->policy_poll, policy_watch_fd(s->watch))) < 0 ||
                    (r = uv_timer_init(&s->loop, &s->policy_settle)) < 0)
                        return r;
                s->policy_poll.data = s->policy_settle.data = s;
                r = uv_poll_start(&s->policy_poll, UV_READABLE, policy_poll_cb);
        }
        return r;
}

static void close_handle(uv_handle_t *h, void *arg)
{
        if (!uv_is_closing(h))
                uv_close(h, NULL);
}

/* Undoes a loop that was set up half-way: closes whatever handles it has, then the loop. */
static void loop_undo(uv_loop_t *loop)
{
        uv_walk(loop, close_handle, NULL);
        uv_run(loop, UV_RUN_DEFAULT);
        uv_loop_close(loop);
}

static uint32_t peer_extra(const ServerConfig *cfg)
{
        return (uint32_t)(budget_alloc_cost(sizeof(Peer)) + budget_alloc_cost(sizeof(Watch)) +
                          budget_alloc_cost(fair_uid_size()) +
                          budget_alloc_cost((uint64_t)cfg->limits.queued_fds * sizeof(uint64_t)) + 4 * sizeof(void *) +
                          CONN_KERNEL_COST);
}

int server_new(Server **ret, const ServerConfig *cfg)
{
        _cleanup_free_ Server *s = calloc(1, sizeof(*s));
        int r;

        if (!s)
                return -ENOMEM;
        s->cfg = *cfg;
        s->listen_fd = cfg->listen_fd;
        s->policy = cfg->policy;
        s->pidns = creds_pidns_of(0); /* the broker's own, compared with each peer's for cuda-legacy */
        s->out = (Outbox)OUTBOX_INIT;
        s->out.replied = audit_replied;
        s->changes = reply_sink(&s->out);
        s->peers.stats = &s->stats;
        s->peers.limits = cfg->limits;
        budget_init(&s->budget, cfg->limits.memory_budget, cfg->limits.memory_per_uid);
        s->peers.budget = cfg->limits.memory_budget ? &s->budget : NULL;
        list_init(&s->peers.open);
        list_init(&s->peers.doomed);
        list_init(&s->peers.blocked);
        fair_init(&s->fair, &(FairConfig){ .cpu_limit_milli = cfg->cpu_limit_milli, .cpu_ns = fair_cpu_ns,
                                              .now_ns = fair_now_ns, .serve = fair_serve,
                                              .set_reading = fair_set_reading, .userdata = s });
        r = uv_loop_init(&s->loop);
        if (r < 0)
                return r;
        r = registry_new(&s->reg, &(RegConfig){ .limits = cfg->limits, .epoch = cfg->epoch,
                                                .first_generation = cfg->first_generation, .id_seed = cfg->id_seed,
                                                .start_ms = uv_now(&s->loop),
                                                .restart_grace_ms = cfg->restart_grace_ms,
                                                .budget = s->peers.budget, .peer_extra = peer_extra(cfg) });
        if (r == 0) {
                s->watch = cfg->policy_watch;
                r = server_start_handles(s);
        }
        if (r < 0) {
                s->reg = registry_free(s->reg);
                loop_undo(&s->loop);
                budget_deinit(&s->budget);
                fair_deinit(&s->fair);
                return r; /* the policy and its watch stay the caller's */
        }
        stats_init(&s->stats, uv_now(&s->loop));
        s->stats.budget = s->peers.budget;
        s->stats.fair = &s->fair;
        rearm_deadline(s); /* the restart grace */
        *ret = steal_ptr(s);
        return 0;
}

int server_run(Server *s)
{
        return uv_run(&s->loop, UV_RUN_DEFAULT);
}

Server *server_free(Server *s)
{
        if (!s)
                return NULL;
        if (!s->stopping) {
                server_stop(s);
                uv_run(&s->loop, UV_RUN_DEFAULT);
        }
        uv_loop_close(&s->loop);
        outbox_deinit(&s->out);
        s->reg = registry_free(s->reg);
        budget_deinit(&s->budget);
        fair_deinit(&s->fair);
        policy_free(s->policy);
        policy_watch_free(s->watch);
        free(s);
        return NULL;
}
