/* One connection to the broker: its socket (conn.c), who is at the other end as the kernel says
 * (creds.c), and its peer in the registry. A peer reads one frame at a time and hands requests to
 * request.c, and takes the frames the registry addresses to it, hanging up on a peer that stops
 * reading. Its life: peer_new at accept, open until peer_close (its socket broke or closed, it
 * violated the protocol, it stopped reading, its process exited, the broker stops), doomed until
 * peer_forget takes it out of the registry between two deliveries, then peer_free.
 *
 * What it must never do: know libuv (the server watches its fds, asking peer_wants_write), or let
 * a frame reach a peer once it is closing. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "audit.h"
#include "broker-limits.h"
#include "budget.h"
#include "conn.h"
#include "creds.h"
#include "list.h"
#include "outbox.h"
#include "registry-change.h"
#include "stats.h"

typedef struct Registry Registry;
typedef struct RegPeer RegPeer;
typedef struct RequestCtx RequestCtx;

/* How often the frames of a blocked peer (the kernel refused an fd) are tried again. */
#define PEER_BLOCKED_RETRY_MS 100

/* Every connection, by state, and what they share; the server owns it. */
typedef struct PeerSet {
        List open;    /* Peer.link */
        List doomed;  /* Peer.link: closed; peer_forget them at the next delivery */
        List blocked; /* Peer.blocked_link: the kernel refused an fd to them; retry on a timer */
        ServerStats *stats;
        Limits limits;
        Budget *budget; /* the server's: queued frames are charged to their peer's uid (output pool) */
        uint8_t rbuf[PROTO_MAX_FRAME]; /* one receive buffer: frames are handled as they arrive */
} PeerSet;

typedef struct Peer {
        Conn conn;
        RegPeer *reg;        /* NULL once forgotten */
        PeerCreds creds;
        int pidfd;           /* readable once its process exited; -1 when the kernel gave none */
        bool closing;        /* closed: nothing goes in or out any more */
        bool blocked;        /* in set->blocked */
        bool audited;        /* made a request the audit trail keeps: its departure is recorded too */
        char hangup[192];    /* why to close once what this batch sends it went out; "" for none */
        uint64_t out_charged; /* what its queue is charged in the budget's output pool */
        PeerSet *set;
        void *userdata;      /* the server's */
        List link;           /* set->open or set->doomed */
        List blocked_link;
} Peer;

/* Identifies the process behind the accepted socket fd (which the peer owns from now on, and
 * closes on failure) and adds it to the registry. A peer refused for a limit is told why before
 * the socket closes. 0, PROTO_STATUS_QUOTA, or -errno. */
int peer_new(Peer **ret, PeerSet *set, Registry *reg, int fd, uint64_t now_ms);

/* Closes its socket and pidfd and frees it; it must have been forgotten. NULL is fine. */
Peer *peer_free(Peer *p);

/* The peer a registry peer belongs to. */
Peer *peer_of(const RegPeer *rp);

/* Reads one frame, if there is one, and handles it (ctx->now_ms is its time). One, not as many
 * as there are: the server polls level-triggered, so a peer with more to say is back in the next
 * loop iteration, after the other peers had their turn, and the common case saves the read that
 * would only say EAGAIN. Returns true when a frame was read. */
bool peer_dispatch(Peer *p, RequestCtx *ctx);

/* Hands one frame of the outbox to its socket (its fd is dup'ed if it has to wait); hangs up on a
 * peer that stopped reading. */
void peer_send(Peer *p, OutFrame *f);

/* Sends what waits in its queue (its socket is writable, or a blocked peer's retry is due). */
void peer_flush(Peer *p);

/* Whether it has frames waiting for its socket to become writable (a blocked peer waits for its
 * retry instead: polling would spin). */
bool peer_wants_write(const Peer *p);

/* Closes it: nothing reaches it any more, and it is doomed (the next delivery forgets it). Tries
 * to push out what is queued (often an error reply) without waiting. */
void peer_close(Peer *p, AuditGone how, const char *why);

/* Takes a doomed peer out of the registry: its waits, references and buffers go (which queues
 * frames for others into out). Only between deliveries: the outbox must hold nothing for it. */
void peer_forget(Peer *p, Registry *reg, RegSink *changes);
