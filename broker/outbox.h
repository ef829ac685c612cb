/* What a registry operation asks its caller to do: frames to deliver to peers (each may carry one
 * fd that stays owned by the registry) and fds to close once every frame has been handed over.
 * The registry never does I/O itself; the server drains the outbox after each operation.
 *
 * The outbox knows peers only as addresses: it never looks inside a RegPeer and calls nothing in
 * the registry. A peer that misses a frame (it could not be built or queued) is reported through
 * the `lost` hook its owner installs (OUTBOX_INIT, in reply.h, installs the registry's). */
#pragma once

#include <stdarg.h>
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
        /* Called for a peer that missed a frame: it must be disconnected, since what it knows of
         * the broker's state is wrong from now on. Must be set. */
        void (*lost)(RegPeer *p);
        /* Called, if set, with every reply queued (after the frame is): the audit trail's hook
         * (broker/audit.h), here for the reason failed_replies is. m is only valid during the call. */
        void (*replied)(void *ctx, RegPeer *to, const ProtoMsg *m);
        void *replied_ctx;
} Outbox;

/* Encodes m for peer `to` with an optional borrowed fd. On failure the peer is reported lost (it
 * missed a message, so it must be disconnected) and -ENOMEM is returned. */
int outbox_send(Outbox *o, RegPeer *to, const ProtoMsg *m, int fd);

/* The error reply (proto_reply_error) to request id of peer `to`, its text formatted from fmt and
 * cut to PROTO_MAX_TEXT bytes: the one way the broker's registry and request layer answer a
 * request that failed. 0 or -ENOMEM (the peer is reported lost). */
int outbox_send_error(Outbox *o, RegPeer *to, uint64_t id, unsigned status, const char *fmt, ...)
        __attribute__((format(printf, 5, 6)));
int outbox_send_errorv(Outbox *o, RegPeer *to, uint64_t id, unsigned status, const char *fmt, va_list ap)
        __attribute__((format(printf, 5, 0)));

/* Takes ownership of fd, to be closed after the frames were handed over. */
void outbox_close_fd(Outbox *o, int fd);

/* Drops the frames addressed to p (which is going away: nothing may reach it any more). */
void outbox_drop_peer(Outbox *o, RegPeer *p);

/* Frees frames not stolen and closes the queued fds; the outbox stays usable. */
void outbox_clear(Outbox *o);

/* Clears the outbox and frees its arrays: it is empty again (its lost hook stays). */
void outbox_deinit(Outbox *o);
