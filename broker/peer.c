/* The broker's connections: see peer.h. The frames in and out of one peer pass here: reading and
 * judging a frame (proto_frame_decode), handing a request on (request.c), and giving the socket
 * what the registry addressed to it, with the two limits that protect every other peer from one
 * that does not read (--max-queued-bytes, --max-queued-fds). */
#include "peer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "macro.h"
#include "registry.h"
#include "reply-text.h"
#include "request.h"
#include "reply.h"
#include "sandbox.h"

/* Tells a peer we will not serve it (a limit), then hangs up: through a Conn of its own, since no
 * peer exists for it. Takes fd. */
static void refuse(int fd, unsigned status, const char *why)
{
        ProtoBuf frame = { 0 };
        ProtoMsg m;
        Conn conn;

        conn_init(&conn, fd, 1);
        proto_reply_error(&m, 0, status, why);
        if (proto_frame_encode(&frame, &m, 0) == 0)
                (void)conn_send_last(&conn, &frame);
        proto_buf_free(&frame);
        conn_deinit(&conn);
}

int peer_new(Peer **ret, PeerSet *set, Registry *reg, int fd, uint64_t now_ms)
{
        /* Read first, as close to accept as possible: a process that started after this moment
         * cannot be the peer, which is how the pidfd fallback tells a reused pid (creds.c). */
        uint64_t ticks = creds_boottime_ticks();
        char why[PROTO_MAX_TEXT] = "";
        RegWhy refusal = { REG_WHY_NONE };
        _cleanup_close_ int sock = fd, pidfd = -1;
        _cleanup_free_ Peer *p = NULL;
        PeerCreds creds;
        int r;

        r = creds_identify(sock, ticks, &creds, &pidfd);
        if (r < 0) {
                log_warn("cannot identify peer", "error=\"%s\"", strerror(-r));
                return r;
        }
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        r = registry_peer_add(reg, &creds, now_ms, p, &p->reg, &refusal);
        reply_text(&refusal, why, sizeof(why));
        if (r != 0) {
                set->stats->connections_refused++;
                log_warn("connection refused", "uid=%u pid=%u reason=%s", creds.uid, creds.pid,
                         r > 0 ? "quota" : "out-of-memory");
                audit_connection_refused(&creds, PROTO_STATUS_QUOTA);
                /* Refused with a reply, not a bare close: the client tells "quota" from "no broker"
                 * and its error names the limit. */
                refuse(steal_fd(sock), PROTO_STATUS_QUOTA, why[0] ? why : "the broker is out of memory");
                return r;
        }
        p->creds = creds;
        p->set = set;
        p->pidfd = steal_fd(pidfd);
        conn_init(&p->conn, steal_fd(sock), set->limits.queued_fds);
        list_init(&p->blocked_link);
        list_append(&set->open, &p->link);
        set->stats->connections_total++;
        log_info("peer connected", "peer=%llu pid=%u uid=%u gid=%u pidns=%llu pidfd=%s",
                 (unsigned long long)registry_peer_id(p->reg), creds.pid, creds.uid, creds.gid,
                 (unsigned long long)creds.pidns, p->pidfd >= 0 ? "yes" : "no");
        *ret = steal_ptr(p);
        return 0;
}

/* Keeps the budget's output pool charged with what p's queue holds (conn.c counts each frame with
 * its overhead; a queued fd is a dup the broker holds, counted as one more small allocation).
 * Returns whether the queue grew. */
static bool charge_queue(Peer *p)
{
        uint64_t now = p->conn.queued_bytes + p->conn.queued_fds * budget_alloc_cost(0);
        bool grew = now > p->out_charged;

        if (grew && budget_force(p->set->budget, p->creds.uid, BUDGET_OUTPUT, now - p->out_charged) < 0)
                return grew; /* not charged: the queue is still bounded by --max-queued-bytes */
        if (!grew)
                budget_uncharge(p->set->budget, p->creds.uid, BUDGET_OUTPUT, p->out_charged - now);
        p->out_charged = now;
        return grew;
}

Peer *peer_free(Peer *p)
{
        if (!p)
                return NULL;
        conn_deinit(&p->conn);
        charge_queue(p);
        safe_close(p->pidfd);
        free(p);
        return NULL;
}

Peer *peer_of(const RegPeer *rp)
{
        return registry_peer_userdata(rp);
}

/* A departure in the audit trail: of a peer that held or owned something, or did something the trail
 * kept (audit.h says why not of the others). */
static void audit_gone(Peer *p, AuditGone how)
{
        RegPeerView v;

        registry_peer_view(p->reg, &v);
        if (p->audited || v.n_refs || v.owned)
                audit_peer_gone(v.id, &p->creds, how, v.n_refs, v.owned);
}

void peer_close(Peer *p, AuditGone how, const char *why)
{
        if (p->closing)
                return;
        p->closing = true;
        /* Try to push out what is queued (often an error reply), without waiting. */
        conn_flush(&p->conn);
        charge_queue(p);
        log_info("peer disconnected", "peer=%llu pid=%u uid=%u reason=\"%s\"",
                 (unsigned long long)registry_peer_id(p->reg), p->creds.pid, p->creds.uid, why);
        audit_gone(p, how);
        /* Forgotten later, by the server's deliver(): a peer may be closed from deep inside a
         * request or a delivery, and removing it from the registry there would free what the
         * caller still uses. */
        list_unlink(&p->link);
        list_append(&p->set->doomed, &p->link);
}

void peer_forget(Peer *p, Registry *reg, RegSink *changes)
{
        uint32_t refs = registry_peer_refs(p->reg);
        uint64_t start = monotonic_us();

        list_unlink(&p->link);
        list_unlink(&p->blocked_link);
        registry_peer_remove(reg, p->reg, changes);
        p->reg = NULL;
        /* How long forgetting a peer takes (its references, waits, buffers) is worth watching. */
        stats_peer_cleanup(p->set->stats, monotonic_us() - start, refs);
}

/* ---- frames out ---- */

/* The kernel refused to pass an fd to this peer: the broker's uid has as many fds in flight as
 * its RLIMIT_NOFILE allows (peers that do not read hold them). The recipient is not at fault, so
 * it keeps its connection; its frames wait and are retried on a timer (the server's), since the
 * socket itself stays writable and polling would spin. */
static void peer_block(Peer *p, bool quietly)
{
        if (p->blocked)
                return;
        p->blocked = true;
        list_append(&p->set->blocked, &p->blocked_link);
        if (!quietly)
                log_warn("the kernel refuses to pass more fds: the broker's uid has too many in flight (peers that "
                         "do not read hold them); the frame waits", "peer=%llu retry_ms=%d",
                         (unsigned long long)registry_peer_id(p->reg), PEER_BLOCKED_RETRY_MS);
}

bool peer_wants_write(const Peer *p)
{
        return !p->closing && !p->blocked && conn_pending(&p->conn);
}

/* Hangs up on a peer that stopped reading, telling it why (text) in a last frame after everything
 * it has yet to read: its queue is gone, the fds it did not receive would be charged to the broker. */
static void hang_up_slow_peer(Peer *p, const char *text)
{
        ProtoBuf frame = { 0 };
        ProtoMsg m;

        p->set->stats->slow_peers_dropped++;
        proto_reply_error(&m, 0, PROTO_STATUS_QUOTA, text);
        if (proto_frame_encode(&frame, &m, 0) == 0)
                (void)conn_send_last(&p->conn, &frame);
        proto_buf_free(&frame);
        charge_queue(p);
        peer_close(p, AUDIT_GONE_DROPPED, "too much unread output");
}

static void drop_slow_peer(Peer *p, const char *limit, size_t value, uint32_t max)
{
        char why[PROTO_MAX_TEXT];

        log_warn("dropping a peer that does not read", "peer=%llu limit=%s value=%zu max=%u",
                 (unsigned long long)registry_peer_id(p->reg), limit, value, max);
        snprintf(why, sizeof(why), "the broker disconnects this connection: it does not read what the broker sends "
                 "(%zu %s, the limit is %u: --%s)", value,
                 strcmp(limit, "max-queued-fds") == 0 ? "fds not received" : "bytes queued", max, limit);
        hang_up_slow_peer(p, why);
}

/* Its queue grew and its uid's unread output (or all peers') is over the budget's output pool. */
static void drop_over_budget(Peer *p, const BudgetRefusal *f)
{
        char why[PROTO_MAX_TEXT];

        p->set->budget->refused++;
        log_warn("dropping a peer that does not read", "peer=%llu limit=%s value=%llu max=%llu",
                 (unsigned long long)registry_peer_id(p->reg),
                 f->which == BUDGET_E_ALL ? "memory-budget" : "memory-budget-per-uid", (unsigned long long)f->used,
                 (unsigned long long)f->limit);
        if (f->which == BUDGET_E_ALL)
                snprintf(why, sizeof(why), "the broker disconnects this connection: it does not read what the broker "
                         "sends, and all peers' unread output (%llu bytes) is over the memory budget's share for it "
                         "(%llu bytes: --memory-budget)", (unsigned long long)f->used, (unsigned long long)f->limit);
        else
                snprintf(why, sizeof(why), "the broker disconnects this connection: it does not read what the broker "
                         "sends, and uid %u's unread output (%llu bytes) is over its share of the memory budget "
                         "(%llu bytes: --memory-budget-per-uid)", p->creds.uid, (unsigned long long)f->used,
                         (unsigned long long)f->limit);
        hang_up_slow_peer(p, why);
}

void peer_send(Peer *p, OutFrame *f)
{
        ServerStats *st = p->set->stats;
        const Limits *l = &p->set->limits;
        size_t len = f->frame.len;
        BudgetRefusal over;
        int r;

        if (p->closing)
                return;
        /* conn_send consumes the frame; the fd stays the outbox's: sent at once, or dup'ed into
         * the queue (conn.c), so the outbox may close its copy after the delivery either way. */
        r = conn_send(&p->conn, &f->frame, f->fd);
        if (r == CONN_E_BLOCKED) {
                peer_block(p, false);
                r = 0;
        }
        if (r == CONN_E_UNRECEIVED) {
                /* Fds a peer has not read are charged to the broker's uid: bounded per peer. */
                drop_slow_peer(p, "max-queued-fds", conn_unreceived_fds(&p->conn) + 1, l->queued_fds);
                return;
        }
        if (r < 0) {
                peer_close(p, AUDIT_GONE_DROPPED, "send failed");
                return;
        }
        st->frames_out++;
        st->bytes_out += len;
        st->fds_out += f->fd >= 0;
        /* Queued bytes bound the broker's memory (queued fds are bounded by conn_send), per peer and,
         * through the budget, per uid and in all. */
        if (p->conn.queued_bytes > l->queued_bytes)
                drop_slow_peer(p, "max-queued-bytes", p->conn.queued_bytes, l->queued_bytes);
        else if (charge_queue(p) && budget_over(p->set->budget, p->creds.uid, BUDGET_OUTPUT, &over))
                drop_over_budget(p, &over);
}

void peer_flush(Peer *p)
{
        bool was_blocked = p->blocked;
        int r;

        /* Off the blocked list first: a flush that is refused again puts it back, so a peer is on
         * the list at most once. */
        list_unlink(&p->blocked_link);
        p->blocked = false;
        if (p->closing)
                return;
        r = conn_flush(&p->conn);
        charge_queue(p);
        if (r == CONN_E_BLOCKED)
                peer_block(p, was_blocked); /* quietly if it was reported when it first blocked */
        else if (r < 0)
                peer_close(p, AUDIT_GONE_DROPPED, "send failed");
}

/* ---- frames in ---- */

/* Replies to a framing violation and hangs up once the reply went out: after one, frame
 * boundaries can't be trusted. */
static void protocol_error(Peer *p, Outbox *out, const char *what)
{
        p->set->stats->protocol_errors++;
        log_warn("protocol violation", "peer=%llu error=\"%s\"", (unsigned long long)registry_peer_id(p->reg), what);
        reply_error(out, p->reg, 0, PROTO_STATUS_PROTOCOL, what);
        snprintf(p->hangup, sizeof(p->hangup), "%s", what);
}

static void handle_frame(Peer *p, RequestCtx *ctx, size_t len, int *fds, size_t n_fds, bool truncated)
{
        ServerStats *st = p->set->stats;
        ProtoFrameError err;
        ProtoMsg m;

        st->frames_in++;
        st->bytes_in += len;
        st->fds_in += n_fds;
        /* Every peer's frame is read into the one shared rbuf: m points into it, so the request
         * must be handled before the next receive. */
        if (proto_frame_decode(p->set->rbuf, len, n_fds, truncated, PROTO_REQUEST, &m, &err) != 0) {
                for (size_t i = 0; i < n_fds; i++)
                        safe_close(fds[i]);
                /* A body sound enough to name its request's id is that request's fault: it is
                 * refused like any bad request and the connection stays. Anything else breaks the
                 * framing itself. */
                if (err.id) {
                        /* Recorded as a request of an operation the broker could not read. */
                        ProtoMsg bad = { .id = err.id, .op = PROTO_OP_UNKNOWN };

                        audit_request_begin(ctx->reg, p->reg, &bad);
                        reply_error(ctx->out, p->reg, err.id, PROTO_STATUS_BAD_REQUEST, err.text);
                        p->audited |= audit_request_end();
                } else
                        protocol_error(p, ctx->out, err.text);
                return;
        }
        /* Counting the broker's open fds reads /proc: only when someone asks for the stats. */
        if (m.op == PROTO_OP_STATS)
                stats_refresh(st, ctx->now_ms);
        /* A call the filter refuses while this request runs is logged naming it. */
        sandbox_set_context(proto_op_name(m.op), registry_peer_id(p->reg), m.id);
        p->audited |= request_handle(ctx, p->reg, &m, n_fds ? fds[0] : -1);
        sandbox_clear_context();
}

bool peer_dispatch(Peer *p, RequestCtx *ctx)
{
        int fds[CONN_MAX_RECV_FDS];
        size_t len, n_fds;
        bool truncated;
        int r;

        if (p->closing)
                return false;
        r = conn_recv(&p->conn, p->set->rbuf, sizeof(p->set->rbuf), &len, fds, &n_fds, &truncated);
        if (r == CONN_E_AGAIN)
                return false;
        if (r == CONN_E_EOF) {
                peer_close(p, AUDIT_GONE_CLOSED, "closed its connection");
                return false;
        }
        if (r < 0) {
                peer_close(p, AUDIT_GONE_DROPPED, "receive failed");
                return false;
        }
        handle_frame(p, ctx, len, fds, n_fds, truncated);
        return true;
}
