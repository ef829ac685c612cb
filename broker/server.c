/* The event loop: the only file of the broker that includes <uv.h>. It accepts connections,
 * reads frames, hands requests to request.c, delivers the registry's outbox, watches pidfds for
 * peer death, fires wait deadlines, handles SIGTERM/SIGINT (stop) and SIGHUP (reload) and reloads
 * the policy when its file changes. */
#include "server.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "conn.h"
#include "list.h"
#include "log.h"
#include "macro.h"
#include "peer.h"
#include "registry.h"
#include "request.h"

#define ACCEPTS_PER_WAKEUP 64
#define ACCEPT_BACKOFF_MS 100
#define BLOCKED_RETRY_MS 100
/* A change of the policy file is loaded once it has been quiet this long: one reload for a burst of
 * events (an editor's save, a ConfigMap update), none when a SIGHUP came meanwhile and loaded it. */
#define POLICY_SETTLE_MS 100

typedef struct Client {
        Server *server;
        Conn conn;
        uv_poll_t poll;
        uv_poll_t pid_poll;
        int pidfd;
        RegPeer *peer;
        unsigned open_handles;
        bool closing, want_write, blocked;
        List link;
        List blocked_link; /* in Server.blocked while the kernel refuses its fds */
} Client;

struct Server {
        uv_loop_t loop;
        uv_poll_t listen_poll;
        uv_timer_t deadline_timer, accept_timer, retry_timer;
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
        uint64_t fds_counted_ms; /* when stats.open_fds was last refreshed */
        uint64_t pidns;
        Outbox out;
        List clients;
        List doomed; /* closed clients whose peers the next deliver() removes */
        List blocked; /* clients with a frame the kernel refused for lack of in-flight room */
        uint8_t rbuf[PROTO_MAX_FRAME]; /* one receive buffer: frames are handled as they arrive */
};

static void client_close(Client *c, const char *why);
static void deliver(Server *s);
static void deadline_cb(uv_timer_t *t);

/* ---- fd accounting ---- */

static uint64_t count_open_fds(void)
{
        DIR *d = opendir("/proc/self/fd");
        uint64_t n = 0;
        struct dirent *e;

        if (!d)
                return 0;
        while ((e = readdir(d)))
                n += e->d_name[0] != '.';
        closedir(d);
        return n > 0 ? n - 1 : 0; /* minus the directory's own fd */
}

/* ---- statistics ---- */

/* Histogram bounds in microseconds. A request usually takes tens of microseconds on a busy
 * 2-core machine; forgetting a peer with 10,000 references about 1.5 ms. */
static const uint32_t request_bounds_us[] = { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 100000 };
static const uint32_t cleanup_bounds_us[] = { 10, 50, 100, 500, 1000, 5000, 10000, 50000, 100000, 1000000 };

static void server_stats_init(ServerStats *st)
{
        histogram_init(&st->request_us, request_bounds_us, ARRAY_SIZE(request_bounds_us));
        histogram_init(&st->peer_cleanup_us, cleanup_bounds_us, ARRAY_SIZE(cleanup_bounds_us));
}

/* The soft RLIMIT_NOFILE, from /proc/self/limits: the filter allows reading /proc but not
 * prlimit64 once the broker runs, and reading it each time shows a limit raised from outside
 * (prlimit --pid). 0 when unknown or unlimited. */
static uint64_t read_fd_limit(void)
{
        static const char key[] = "Max open files";
        unsigned long long soft = 0;
        char line[256];
        FILE *f = fopen("/proc/self/limits", "re");

        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, key, sizeof(key) - 1) == 0 && sscanf(line + sizeof(key) - 1, "%llu", &soft) != 1)
                        soft = 0; /* "unlimited" */
        fclose(f);
        return soft;
}

/* ---- writing ---- */

static void client_poll_cb(uv_poll_t *h, int status, int events);

static void retry_blocked_cb(uv_timer_t *t);

/* The kernel refused to pass an fd to this client: the broker's uid has as many fds in flight as
 * its RLIMIT_NOFILE allows (peers that do not read hold them). The recipient is not at fault, so
 * it keeps its connection; its frames wait and are retried on a timer, since the socket itself
 * stays writable and polling would spin. */
static void client_block(Client *c)
{
        Server *s = c->server;

        if (c->blocked)
                return;
        c->blocked = true;
        list_append(&s->blocked, &c->blocked_link);
        log_warn("the kernel refuses to pass more fds: the broker's uid has too many in flight (peers that do "
                 "not read hold them); the frame waits", "peer=%llu retry_ms=%d",
                 (unsigned long long)registry_peer_id(c->peer), BLOCKED_RETRY_MS);
        if (!uv_is_active((uv_handle_t *)&s->retry_timer))
                uv_timer_start(&s->retry_timer, retry_blocked_cb, BLOCKED_RETRY_MS, 0);
}

static void client_update_poll(Client *c)
{
        int events = UV_READABLE | UV_DISCONNECT;
        bool want = conn_pending(&c->conn) && !c->blocked;

        if (c->closing || want == c->want_write)
                return;
        c->want_write = want;
        if (want)
                events |= UV_WRITABLE;
        uv_poll_start(&c->poll, events, client_poll_cb);
}

/* Hangs up on a peer that stopped reading, telling it why in a last frame after everything it has
 * yet to read: its queue is gone, the fds it did not receive would be charged to the broker. */
static void drop_slow_peer(Client *c, const char *limit, size_t value, uint32_t max)
{
        Server *s = c->server;
        char why[PROTO_MAX_TEXT];
        ProtoBuf frame = { 0 };
        ProtoMsg m = { 0 };

        s->stats.slow_peers_dropped++;
        log_warn("dropping a peer that does not read", "peer=%llu limit=%s value=%zu max=%u",
                 (unsigned long long)registry_peer_id(c->peer), limit, value, max);
        snprintf(why, sizeof(why), "the broker disconnects this connection: it does not read what the broker sends "
                 "(%zu %s, the limit is %u: --%s)", value,
                 strcmp(limit, "max-queued-fds") == 0 ? "fds not received" : "bytes queued", max, limit);
        m.status = PROTO_STATUS_QUOTA;
        m.error = proto_str(proto_status_name(PROTO_STATUS_QUOTA));
        m.message = proto_str(why);
        m.has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) | PROTO_BIT(PF_ERROR) | PROTO_BIT(PF_MESSAGE);
        if (proto_frame_encode(&frame, &m, 0) == 0)
                (void)conn_send_last(&c->conn, &frame);
        proto_buf_free(&frame);
        client_close(c, "too much unread output");
}

/* Hands one frame to a client's connection; disconnects peers that stop reading. */
static void client_send(Client *c, OutFrame *f)
{
        Server *s = c->server;
        size_t len = f->frame.len;
        int r;

        if (c->closing)
                return;
        r = conn_send(&c->conn, &f->frame, f->fd);
        if (r == CONN_E_BLOCKED) {
                client_block(c);
                r = 0;
        }
        if (r == CONN_E_UNRECEIVED) {
                /* Fds a peer has not read are charged to the broker's uid: bounded per peer. */
                drop_slow_peer(c, "max-queued-fds", conn_unreceived_fds(&c->conn) + 1, s->cfg.limits.queued_fds);
                return;
        }
        if (r < 0) {
                client_close(c, "send failed");
                return;
        }
        s->stats.frames_out++;
        s->stats.bytes_out += len;
        s->stats.fds_out += f->fd >= 0;
        /* Queued bytes bound the broker's memory (queued fds are bounded by conn_send). */
        if (c->conn.queued_bytes > s->cfg.limits.queued_bytes) {
                drop_slow_peer(c, "max-queued-bytes", c->conn.queued_bytes, s->cfg.limits.queued_bytes);
                return;
        }
        client_update_poll(c);
}

static void rearm_deadline(Server *s)
{
        uint64_t next = registry_next_deadline(s->reg), now = uv_now(&s->loop);

        if (next == UINT64_MAX) {
                uv_timer_stop(&s->deadline_timer);
                return;
        }
        uv_timer_start(&s->deadline_timer, deadline_cb, next > now ? next - now : 0, 0);
}

static void client_handle_closed(uv_handle_t *h);

static uint64_t monotonic_us(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Removes a closed client's peer from the registry and lets libuv release its handles. Runs only
 * between outbox deliveries: removing a peer frees it and queues frames for others. */
static void client_finish(Server *s, Client *c)
{
        uint32_t refs = registry_peer_refs(c->peer);
        uint64_t start = monotonic_us(), took;

        list_unlink(&c->link);
        list_unlink(&c->blocked_link);
        registry_peer_remove(s->reg, c->peer, &s->out);
        c->peer = NULL;
        /* How long forgetting a peer takes (its references, waits, buffers) is worth watching. */
        took = monotonic_us() - start;
        histogram_record(&s->stats.peer_cleanup_us, took);
        s->stats.peer_cleanup_us_last = took;
        s->stats.peer_cleanup_refs_last = refs;
        s->stats.peer_cleanup_us_max = MAX(s->stats.peer_cleanup_us_max, took);
        uv_close((uv_handle_t *)&c->poll, client_handle_closed);
        if (c->pidfd >= 0)
                uv_close((uv_handle_t *)&c->pid_poll, client_handle_closed);
}

/* Delivers everything the registry produced, then removes peers that must go (which may produce
 * more frames: their references and buffers go with them), until nothing is left. */
static void deliver(Server *s)
{
        RegPeer *lost;

        for (;;) {
                for (size_t i = 0; i < s->out.n_frames; i++) {
                        OutFrame *f = &s->out.frames[i];
                        client_send(registry_peer_userdata(f->to), f);
                }
                outbox_clear(&s->out);
                while ((lost = registry_take_lost(s->reg)))
                        client_close(registry_peer_userdata(lost), "a message for it could not be built");
                if (list_empty(&s->doomed))
                        break;
                while (!list_empty(&s->doomed))
                        client_finish(s, list_entry(s->doomed.next, Client, link));
        }
        rearm_deadline(s);
}

/* ---- closing ---- */

static void client_handle_closed(uv_handle_t *h)
{
        Client *c = h->data;

        if (--c->open_handles > 0)
                return;
        conn_deinit(&c->conn);
        safe_close(c->pidfd);
        free(c);
}

/* Marks a client for removal: no more frames reach it, and the next deliver() forgets its peer
 * (its references go, its buffers are revoked or orphaned). The caller must call deliver(). */
static void client_close(Client *c, const char *why)
{
        Server *s = c->server;

        if (c->closing)
                return;
        c->closing = true;
        /* Try to push out what is queued (often an error reply), without waiting. */
        conn_flush(&c->conn);
        log_info("peer disconnected", "peer=%llu pid=%u uid=%u reason=\"%s\"",
                 (unsigned long long)registry_peer_id(c->peer), registry_peer_creds(c->peer)->pid,
                 registry_peer_creds(c->peer)->uid, why);
        list_unlink(&c->link);
        list_append(&s->doomed, &c->link);
}

/* ---- reading ---- */

/* Replies to a framing violation and disconnects: after one, frame boundaries can't be trusted. */
static void protocol_error(Client *c, uint64_t id, const char *what)
{
        Server *s = c->server;

        s->stats.protocol_errors++;
        log_warn("protocol violation", "peer=%llu error=\"%s\"", (unsigned long long)registry_peer_id(c->peer), what);
        request_reply_error(&s->out, c->peer, id, PROTO_STATUS_PROTOCOL, what);
        deliver(s);
        client_close(c, what);
}

static void handle_frame(Client *c, const uint8_t *buf, size_t len, int *fds, size_t n_fds, bool truncated)
{
        Server *s = c->server;
        RequestCtx ctx = { s->reg, s->policy, &s->stats, uv_now(&s->loop), s->pidns, &s->out };
        ProtoFrameError err;
        ProtoMsg m;

        s->stats.frames_in++;
        s->stats.bytes_in += len;
        s->stats.fds_in += n_fds;
        if (proto_frame_decode(buf, len, n_fds, truncated, PROTO_REQUEST, &m, &err) != 0) {
                for (size_t i = 0; i < n_fds; i++)
                        safe_close(fds[i]);
                if (err.id)
                        request_reply_error(&s->out, c->peer, err.id, PROTO_STATUS_BAD_REQUEST, err.text);
                else
                        protocol_error(c, 0, err.text);
                return;
        }
        /* Listing /proc/self/fd costs a lot with 100k fds held: at most once a second. */
        if (m.op == PROTO_OP_STATS && (!s->fds_counted_ms || ctx.now_ms - s->fds_counted_ms >= 1000)) {
                s->stats.open_fds = count_open_fds();
                s->stats.open_fds_limit = read_fd_limit();
                s->fds_counted_ms = ctx.now_ms;
        }
        request_handle(&ctx, c->peer, &m, n_fds ? fds[0] : -1);
}

/* Reads and handles one frame. One, not as many as there are: the poll is level-triggered, so a
 * peer with more to say is back in the next loop iteration, after the other peers had their turn,
 * and the common case saves the read that would only have said EAGAIN. */
static void client_read(Client *c)
{
        Server *s = c->server;
        int fds[CONN_MAX_RECV_FDS];
        size_t len, n_fds;
        bool truncated;
        int r = conn_recv(&c->conn, s->rbuf, sizeof(s->rbuf), &len, fds, &n_fds, &truncated);

        if (r == CONN_E_AGAIN)
                return;
        if (r == CONN_E_EOF) {
                client_close(c, "closed its connection");
        } else if (r < 0) {
                client_close(c, "receive failed");
        } else {
                /* A request's time in the broker: decoding, handling, and delivering what it caused. */
                uint64_t start = monotonic_us();

                handle_frame(c, s->rbuf, len, fds, n_fds, truncated);
                deliver(s);
                histogram_record(&s->stats.request_us, monotonic_us() - start);
                return;
        }
        deliver(s);
}

static void client_poll_cb(uv_poll_t *h, int status, int events)
{
        Client *c = h->data;
        Server *s = c->server;

        if (status < 0) {
                client_close(c, "poll error");
                deliver(s);
                return;
        }
        if ((events & UV_WRITABLE) && !c->closing) {
                int r = conn_flush(&c->conn);
                if (r == CONN_E_BLOCKED)
                        client_block(c);
                if (r < 0)
                        client_close(c, "send failed");
                else
                        client_update_poll(c);
        }
        if ((events & (UV_READABLE | UV_DISCONNECT)) && !c->closing)
                client_read(c);
        deliver(s);
}

static void retry_blocked_cb(uv_timer_t *t)
{
        Server *s = t->data;
        List retry;

        /* Take the list: a client the kernel still refuses goes back on it. */
        list_init(&retry);
        if (!list_empty(&s->blocked)) {
                retry = s->blocked;
                retry.next->prev = retry.prev->next = &retry;
                list_init(&s->blocked);
        }
        while (!list_empty(&retry)) {
                Client *c = list_entry(retry.next, Client, blocked_link);
                int r;

                list_unlink(&c->blocked_link);
                c->blocked = false;
                if (c->closing)
                        continue;
                r = conn_flush(&c->conn);
                if (r == CONN_E_BLOCKED) {
                        c->blocked = true; /* quietly: it was reported when it first blocked */
                        list_append(&s->blocked, &c->blocked_link);
                } else if (r < 0) {
                        client_close(c, "send failed");
                } else {
                        client_update_poll(c);
                }
        }
        if (!list_empty(&s->blocked))
                uv_timer_start(&s->retry_timer, retry_blocked_cb, BLOCKED_RETRY_MS, 0);
        deliver(s);
}

/* The peer's process exited: its pidfd became readable. */
static void client_pidfd_cb(uv_poll_t *h, int status, int events)
{
        Client *c = h->data;

        (void)status;
        (void)events;
        client_close(c, "its process exited");
        deliver(c->server);
}

/* ---- accepting ---- */

static void listen_cb(uv_poll_t *h, int status, int events);

static void accept_resume_cb(uv_timer_t *t)
{
        Server *s = t->data;

        if (s->listening)
                uv_poll_start(&s->listen_poll, UV_READABLE, listen_cb);
}

/* Tells a peer we will not serve it, then hangs up. */
static void refuse(int fd, unsigned status, const char *why)
{
        ProtoBuf frame = { 0 };
        ProtoMsg m = { 0 };

        m.reply = 0;
        m.status = status;
        m.error = proto_str(proto_status_name(status));
        m.message = proto_str(why);
        m.has = PROTO_BIT(PF_REPLY) | PROTO_BIT(PF_STATUS) | PROTO_BIT(PF_ERROR) | PROTO_BIT(PF_MESSAGE);
        if (proto_frame_encode(&frame, &m, 0) == 0)
                (void)!send(fd, frame.data, frame.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        proto_buf_free(&frame);
        close(fd);
}

static int client_start(Server *s, int fd)
{
        uint64_t ticks = peer_boottime_ticks();
        char why[PROTO_MAX_TEXT] = "";
        PeerCreds creds;
        Client *c;
        int pidfd = -1, r;

        r = peer_identify(fd, ticks, &creds, &pidfd);
        if (r < 0) {
                log_warn("cannot identify peer", "error=\"%s\"", strerror(-r));
                close(fd);
                return r;
        }
        c = calloc(1, sizeof(*c));
        if (!c) {
                safe_close(pidfd);
                close(fd);
                return -ENOMEM;
        }
        r = registry_peer_add(s->reg, &creds, uv_now(&s->loop), c, &c->peer, why, sizeof(why));
        if (r != 0) {
                s->stats.connections_refused++;
                log_warn("connection refused", "uid=%u pid=%u reason=%s", creds.uid, creds.pid,
                         r > 0 ? "quota" : "out-of-memory");
                free(c);
                safe_close(pidfd);
                refuse(fd, PROTO_STATUS_QUOTA, why[0] ? why : "the broker is out of memory");
                return r;
        }
        c->server = s;
        c->pidfd = pidfd;
        conn_init(&c->conn, fd, s->cfg.limits.queued_fds);
        uv_poll_init(&s->loop, &c->poll, fd);
        c->poll.data = c;
        c->open_handles = 1;
        uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, client_poll_cb);
        if (pidfd >= 0) {
                uv_poll_init(&s->loop, &c->pid_poll, pidfd);
                c->pid_poll.data = c;
                c->open_handles++;
                uv_poll_start(&c->pid_poll, UV_READABLE, client_pidfd_cb);
        }
        list_append(&s->clients, &c->link);
        s->stats.connections_total++;
        log_info("peer connected", "peer=%llu pid=%u uid=%u gid=%u pidns=%llu pidfd=%s",
                 (unsigned long long)registry_peer_id(c->peer), creds.pid, creds.uid, creds.gid,
                 (unsigned long long)creds.pidns, pidfd >= 0 ? "yes" : "no");
        return 0;
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
                client_start(s, fd);
        }
        deliver(s);
}

/* ---- deadlines and signals ---- */

static void deadline_cb(uv_timer_t *t)
{
        Server *s = t->data;

        registry_expire(s->reg, uv_now(&s->loop), &s->out);
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
        registry_cancel_waits(s->reg, PROTO_STATUS_SHUTDOWN, "the broker is stopping", &s->out);
        list_for_each(pos, &s->clients)
                request_reply_error(&s->out, list_entry(pos, Client, link)->peer, 0, PROTO_STATUS_SHUTDOWN,
                                    "the broker is stopping");
        deliver(s);
        list_for_each_safe(pos, &s->clients)
                client_close(list_entry(pos, Client, link), "the broker is stopping");
        deliver(s);
        uv_timer_stop(&s->deadline_timer);
        uv_timer_stop(&s->accept_timer);
        uv_timer_stop(&s->retry_timer);
        uv_close((uv_handle_t *)&s->listen_poll, NULL);
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
            (r = uv_signal_init(&s->loop, &s->sig_term)) < 0 ||
            (r = uv_signal_init(&s->loop, &s->sig_int)) < 0 ||
            (r = uv_signal_init(&s->loop, &s->sig_hup)) < 0)
                return r;
        s->listen_poll.data = s->deadline_timer.data = s->accept_timer.data = s->retry_timer.data = s;
        s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
        s->deadline_timer.timer_cb = deadline_cb;
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

int server_new(Server **ret, const ServerConfig *cfg)
{
        _cleanup_free_ Server *s = calloc(1, sizeof(*s));
        int r;

        if (!s)
                return -ENOMEM;
        s->cfg = *cfg;
        s->listen_fd = cfg->listen_fd;
        s->policy = cfg->policy;
        s->pidns = peer_pidns_of(0);
        list_init(&s->clients);
        list_init(&s->doomed);
        list_init(&s->blocked);
        r = uv_loop_init(&s->loop);
        if (r < 0)
                return r;
        r = registry_new(&s->reg, &(RegConfig){ .limits = cfg->limits, .epoch = cfg->epoch,
                                                .first_generation = cfg->first_generation, .id_seed = cfg->id_seed,
                                                .start_ms = uv_now(&s->loop),
                                                .restart_grace_ms = cfg->restart_grace_ms });
        if (r == 0) {
                s->watch = cfg->policy_watch;
                r = server_start_handles(s);
        }
        if (r < 0) {
                s->reg = registry_free(s->reg);
                loop_undo(&s->loop);
                return r; /* the policy and its watch stay the caller's */
        }
        server_stats_init(&s->stats);
        s->stats.started_ms = uv_now(&s->loop);
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
        policy_free(s->policy);
        policy_watch_free(s->watch);
        free(s);
        return NULL;
}
