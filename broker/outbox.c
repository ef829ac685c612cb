/* The registry's output queue: encoded frames for peers and fds to close afterwards (outbox.h).
 * What it must never do: call into the registry (a frame it cannot build or queue is reported
 * through the lost hook), or close an fd before the frames queued with it are handed over. */
#include "outbox.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "macro.h"

/* Encoded now, not when the server flushes: m may point into the registry's state (names, meta),
 * which the rest of the request may change or free before the outbox is handed over. A frame
 * that cannot be queued is a lost peer rather than a missing reply: a client waits for every
 * reply it is owed, so silently dropping one would hang it. */
int outbox_send(Outbox *o, RegPeer *to, const ProtoMsg *m, int fd)
{
        ProtoBuf buf = { 0 };

        if (o->n_frames == o->cap_frames) {
                size_t cap = o->cap_frames ? o->cap_frames * 2 : 8;
                OutFrame *v = realloc(o->frames, cap * sizeof(*v));
                if (!v)
                        goto lost;
                o->frames = v;
                o->cap_frames = cap;
        }
        if (proto_frame_encode(&buf, m, fd >= 0 ? 1 : 0) != 0)
                goto lost;
        o->frames[o->n_frames++] = (OutFrame){ to, buf, fd };
        /* Counted here, where every reply passes, so request_errors_total cannot miss a path that
         * answers with an error. */
        if (proto_has(m, PF_STATUS) && m->status != PROTO_STATUS_OK && m->status < _PROTO_STATUS_MAX)
                o->failed_replies[m->status]++;
        if (o->replied && m->type == PROTO_REPLY)
                o->replied(o->replied_ctx, to, m);
        return 0;
lost:
        proto_buf_free(&buf);
        o->lost(to);
        return -ENOMEM;
}

int outbox_send_errorv(Outbox *o, RegPeer *to, uint64_t id, unsigned status, const char *fmt, va_list ap)
{
        char text[PROTO_MAX_TEXT + 1];
        ProtoMsg m;

        /* Cut at the protocol's text limit (proto_reply_error also trims a cut UTF-8 character),
         * so an error message can never make the reply too big to send. */
        vsnprintf(text, sizeof(text), fmt, ap);
        proto_reply_error(&m, id, status, text);
        return outbox_send(o, to, &m, -1);
}

int outbox_send_error(Outbox *o, RegPeer *to, uint64_t id, unsigned status, const char *fmt, ...)
{
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = outbox_send_errorv(o, to, id, status, fmt, ap);
        va_end(ap);
        return r;
}

/* The fd is closed after the frames are handed to the kernel (outbox_clear): a frame queued with
 * it borrows it, and sendmsg copies the fd only when it runs. */
void outbox_close_fd(Outbox *o, int fd)
{
        if (fd < 0)
                return;
        if (o->n_close == o->cap_close) {
                size_t cap = o->cap_close ? o->cap_close * 2 : 8;
                int *v = realloc(o->close_fds, cap * sizeof(*v));
                if (!v) {
                        /* Out of memory: close now, and the frames that borrowed this fd can no
                         * longer be delivered as promised, so their peers are disconnected. */
                        for (size_t i = 0; i < o->n_frames; i++) {
                                if (o->frames[i].fd == fd) {
                                        o->frames[i].fd = -1;
                                        o->lost(o->frames[i].to);
                                }
                        }
                        safe_close(fd);
                        return;
                }
                o->close_fds = v;
                o->cap_close = cap;
        }
        o->close_fds[o->n_close++] = fd;
}

/* Compacts in place, keeping the order of the other peers' frames: a peer's replies and events
 * must reach it in the order they were queued. */
void outbox_drop_peer(Outbox *o, RegPeer *p)
{
        size_t kept = 0;

        for (size_t i = 0; i < o->n_frames; i++) {
                if (o->frames[i].to == p)
                        proto_buf_free(&o->frames[i].frame);
                else
                        o->frames[kept++] = o->frames[i];
        }
        o->n_frames = kept;
}

void outbox_clear(Outbox *o)
{
        for (size_t i = 0; i < o->n_frames; i++)
                proto_buf_free(&o->frames[i].frame);
        for (size_t i = 0; i < o->n_close; i++)
                safe_close(o->close_fds[i]);
        o->n_frames = o->n_close = 0;
}

void outbox_deinit(Outbox *o)
{
        outbox_clear(o);
        free(o->frames);
        free(o->close_fds);
        *o = (Outbox){ .lost = o->lost };
}
