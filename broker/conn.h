/* One peer's socket: SOCK_SEQPACKET records in, a queue of records out, SCM_RIGHTS fds both
 * ways. Non-blocking; knows nothing of libuv or of what the frames mean. */
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
        List out;           /* OutMsg.link, oldest first */
        size_t queued_bytes; /* memory held by queued frames, overhead included */
        size_t queued_fds;
} Conn;

enum {
        CONN_E_EOF = 1,   /* the peer closed its end */
        CONN_E_AGAIN,     /* nothing (more) to read or no room to write */
        CONN_E_TRUNC,     /* a record over PROTO_MAX_FRAME, or more fds than we have room for */
};

void conn_init(Conn *c, int fd);

/* Frees queued output (closing its fds) and closes the socket. */
void conn_deinit(Conn *c);

/* Receives one record into buf (cap bytes) and its fds (CLOEXEC) into fds (CONN_MAX_RECV_FDS).
 * 0 with *ret_len, *ret_n_fds set; CONN_E_EOF, CONN_E_AGAIN, CONN_E_TRUNC (received fds are
 * closed then), or -errno. */
int conn_recv(Conn *c, uint8_t *buf, size_t cap, size_t *ret_len, int *fds, size_t *ret_n_fds);

/* Sends a frame, or queues it when the socket is full. The frame's bytes are stolen; fd is
 * borrowed (dup'ed only if the frame has to wait). 0, or -errno on a broken connection. */
int conn_send(Conn *c, ProtoBuf *frame, int fd);

/* Sends what is queued. 0 when the queue is empty, CONN_E_AGAIN when some remains, or -errno. */
int conn_flush(Conn *c);

static inline bool conn_pending(const Conn *c)
{
        return !list_empty(&c->out);
}
