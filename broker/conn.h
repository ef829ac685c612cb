/* One peer's socket: SOCK_SEQPACKET records in, a queue of records out, SCM_RIGHTS fds both
 * ways, and an account of the fds the peer has not received yet. Non-blocking; knows nothing of
 * libuv or of what the frames mean. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "list.h"
#include "proto.h"

/* Room for more fds than a frame may carry, so that "too many" is told apart from truncation. */
#define CONN_MAX_RECV_FDS 8

typedef struct Conn {
        int fd;
        List out;            /* OutMsg.link, oldest first */
        size_t queued_bytes; /* memory held by queued frames, overhead included */
        size_t queued_fds;
        /* Fds handed to the kernel that the peer may not have read yet. Each one is charged to the
         * broker's uid until it is read (the kernel's unix in-flight accounting, bounded by the
         * broker's RLIMIT_NOFILE), so a peer that does not read could starve every other peer.
         * For each, unread_at holds where its record starts in sent_lb: every record sent, counted
         * at the least memory the kernel charges for it (see conn.c). */
        uint32_t max_unreceived; /* limit on kernel-held plus queued fds */
        uint32_t n_unread, unread_head;
        uint64_t *unread_at; /* ring of max_unreceived entries, allocated with the first fd */
        uint64_t sent_lb;
} Conn;

enum {
        CONN_E_EOF = 1,   /* the peer closed its end */
        CONN_E_AGAIN,     /* nothing (more) to read or no room to write */
        CONN_E_UNRECEIVED, /* sending this fd would leave the peer more than max_unreceived unreceived */
        CONN_E_BLOCKED,   /* the kernel refused an fd (ETOOMANYREFS: too many in flight for the broker's
                           * uid); the frame waits in the queue: retry later, polling will not tell */
};

/* max_unreceived bounds the fds sent to the peer that it has not received: in its socket or in
 * the queue here (at least 1). */
void conn_init(Conn *c, int fd, uint32_t max_unreceived);

/* Frees queued output (closing its fds) and closes the socket. */
void conn_deinit(Conn *c);

/* Receives one record into buf (cap bytes) and its fds (CLOEXEC) into fds (CONN_MAX_RECV_FDS).
 * 0 with *ret_len, *ret_n_fds set and *ret_truncated true when the record was larger than cap or
 * brought more fds than fit (those were closed): proto_frame_decode judges it; CONN_E_EOF,
 * CONN_E_AGAIN, or -errno. The caller owns the fds. */
int conn_recv(Conn *c, uint8_t *buf, size_t cap, size_t *ret_len, int *fds, size_t *ret_n_fds, bool *ret_truncated);

/* Sends a frame, or queues it when the socket is full. The frame's bytes are stolen; fd is
 * borrowed (dup'ed only if the frame has to wait). 0; CONN_E_BLOCKED (queued: see above);
 * CONN_E_UNRECEIVED (nothing sent: the peer is not reading its fds); or -errno on a broken
 * connection. */
int conn_send(Conn *c, ProtoBuf *frame, int fd);

/* Sends what is queued. 0 when the queue is empty, CONN_E_AGAIN or CONN_E_BLOCKED when some
 * remains, or -errno. */
int conn_flush(Conn *c);

/* Fds sent to the peer that it has not received yet: those the kernel may still hold for it (an
 * upper bound, from SIOCOUTQ) plus those queued here. */
size_t conn_unreceived_fds(Conn *c);

/* The last frame before the broker hangs up on a peer that stopped reading: drops everything
 * queued (the peer would never read it) and sends frame after what the kernel already holds,
 * making room for it if the socket is full. Steals the frame. 0 or -errno. */
int conn_send_last(Conn *c, ProtoBuf *frame);

static inline bool conn_pending(const Conn *c)
{
        return !list_empty(&c->out);
}
