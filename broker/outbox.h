/* What a registry operation asks its caller to do: frames to deliver to peers (each may carry one
 * fd that stays owned by the registry) and fds to close once every frame has been handed over.
 * The registry never does I/O itself; the server drains the outbox after each operation. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "proto.h"

typedef struct RegPeer RegPeer;

typedef struct OutFrame {
        RegPeer *to;
        ProtoBuf frame; /* owned; the server steals it */
        int fd;         /* borrowed, or -1: the receiver must dup it before the close list runs */
} OutFrame;

typedef struct Outbox {
        OutFrame *frames;
        size_t n_frames, cap_frames;
        int *close_fds;
        size_t n_close, cap_close;
        /* Replies sent with each error status: every reply passes here, whoever built it. */
        uint64_t failed_replies[_PROTO_STATUS_MAX];
} Outbox;

#define OUTBOX_INIT { 0 }

/* Encodes m for peer `to` with an optional borrowed fd. On failure the peer is marked lost (it
 * missed a message, so it must be disconnected) and -ENOMEM is returned. */
int outbox_send(Outbox *o, RegPeer *to, const ProtoMsg *m, int fd);

/* Takes ownership of fd, to be closed after the frames were handed over. */
void outbox_close_fd(Outbox *o, int fd);

/* Drops the frames addressed to p (which is going away: nothing may reach it any more). */
void outbox_drop_peer(Outbox *o, RegPeer *p);

/* Frees frames not stolen and closes the queued fds; the outbox stays usable. */
void outbox_clear(Outbox *o);

/* Clears the outbox and frees its arrays: it is OUTBOX_INIT again. */
void outbox_deinit(Outbox *o);
