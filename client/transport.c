/* The transport under a connection: frames out (a blocking request that waits for its reply, or a
 * send that does not wait) and frames in (decoded by proto_frame_decode), the socket's place in
 * the epoll set behind gpuipc_fd(), and what is done with frames that are not the awaited reply.
 *
 * What it must never do: call the layers above by name. An event, a late reply to an abandoned
 * request, a reconnect's restore and the work left after events go up through the hooks the
 * connection was given at connect (ClientHooks); every byte the library sends leaves here. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "fdpass.h"
#include "internal.h"
#include "macro.h"

#define MAX_RECV_FDS 4

/* Set in the library's own threads: their messages are theirs, not the connection's. */
static __thread char *errmsg_sink;

void client_errmsg_sink(char *buf)
{
        errmsg_sink = buf;
}

char *client_errbuf(gpuipc_t *c)
{
        return errmsg_sink ? errmsg_sink : c->errmsg;
}

void client_call_begins(gpuipc_t *c)
{
        if (!errmsg_sink)
                c->errmsg[0] = 0;
}

void client_errmsg(gpuipc_t *c, const char *fmt, ...)
{
        va_list ap;

        if (!c)
                return; /* off the connection's thread (a pool's allocation): the code says it */
        va_start(ap, fmt);
        vsnprintf(client_errbuf(c), sizeof(c->errmsg), fmt, ap);
        va_end(ap);
}

int client_fail(gpuipc_t *c, int err, const char *fmt, ...)
{
        va_list ap;

        if (!c)
                return err;
        va_start(ap, fmt);
        vsnprintf(client_errbuf(c), sizeof(c->errmsg), fmt, ap);
        va_end(ap);
        return err;
}

int client_check_name(gpuipc_t *c, const char *name, const char *what, bool prefix, size_t max)
{
        size_t len = name ? strlen(name) : 0;

        if (!name)
                return GPUIPC_E_INVALID;
        if ((prefix ? proto_prefix_valid(name, len) : proto_name_valid(name, len)) && (!max || len <= max))
                return 0;
        client_errmsg(c, "'%.*s%s' is not a valid %s: %s1 to %zu bytes of A-Z a-z 0-9 . _ : / @ + = -, not "
                      "starting with '/', without '..'", (int)MIN(len, 64), name, len > 64 ? "..." : "", what,
                      prefix ? "empty (every name) or " : "", max ? max : PROTO_MAX_NAME);
        return GPUIPC_E_INVALID;
}

int client_copy_options(void *dst, size_t dst_size, const void *src)
{
        size_t size;

        memset(dst, 0, dst_size);
        if (!src)
                return 0;
        memcpy(&size, src, sizeof(size));
        if (size < sizeof(size))
                return GPUIPC_E_INVALID;
        memcpy(dst, src, MIN(size, dst_size));
        return 0;
}

void frame_free(Frame *f)
{
        f->fd = safe_close(f->fd);
}

/* fd joins the epoll set behind gpuipc_fd() and, once the ring thread runs, its own. */
static void watch_fd(gpuipc_t *c, int fd)
{
        epoll_ctl(c->epfd, EPOLL_CTL_ADD, fd, &(struct epoll_event){ .events = EPOLLIN, .data.fd = fd });
        if (c->watch_epfd >= 0)
                epoll_ctl(c->watch_epfd, EPOLL_CTL_ADD, fd, &(struct epoll_event){ .events = EPOLLIN, .data.fd = fd });
}

/* While the broker is away, gpuipc_fd() must still wake an event loop now and then, so that
 * gpuipc_process() can try again: a periodic timer joins the epoll set. */
static void retry_timer_set(gpuipc_t *c, bool on)
{
        struct itimerspec its = { 0 };
        uint64_t ticks;

        if (on && c->retry_timer < 0) {
                c->retry_timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
                if (c->retry_timer < 0)
                        return; /* event-loop users then retry at their next call instead */
                watch_fd(c, c->retry_timer);
        }
        if (c->retry_timer < 0)
                return;
        if (on)
                its.it_value = its.it_interval = (struct timespec){ 0, CLIENT_RETRY_MS * 1000000L };
        timerfd_settime(c->retry_timer, 0, &its, NULL);
        (void)!read(c->retry_timer, &ticks, sizeof(ticks)); /* clear what fired already */
}

void client_mark_broken(gpuipc_t *c)
{
        c->broken = true;
        c->fd = safe_close(c->fd); /* closing also takes it out of the epoll set */
        if (c->reconnect)
                retry_timer_set(c, true);
}

/* The socket joins the epoll set behind gpuipc_fd(). */
void client_watch_socket(gpuipc_t *c)
{
        watch_fd(c, c->fd);
        retry_timer_set(c, false);
}

int client_watch_start(gpuipc_t *c)
{
        int e;

        if (c->watch_epfd >= 0)
                return 0;
        c->news_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        c->watch_epfd = epoll_create1(EPOLL_CLOEXEC);
        if (c->news_fd < 0 || c->watch_epfd < 0) {
                e = -errno;
                c->news_fd = safe_close(c->news_fd);
                c->watch_epfd = safe_close(c->watch_epfd);
                return e;
        }
        epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->news_fd,
                  &(struct epoll_event){ .events = EPOLLIN, .data.fd = c->news_fd });
        for (int i = 0; i < 2; i++) {
                int fd = i ? c->retry_timer : c->fd;

                if (fd >= 0)
                        epoll_ctl(c->watch_epfd, EPOLL_CTL_ADD, fd,
                                  &(struct epoll_event){ .events = EPOLLIN, .data.fd = fd });
        }
        return 0;
}

void client_news(gpuipc_t *c)
{
        uint64_t one = 1;

        if (c->news_fd >= 0)
                (void)!write(c->news_fd, &one, sizeof(one));
}

void client_news_clear(gpuipc_t *c)
{
        uint64_t v;

        if (c->news_fd >= 0)
                (void)!read(c->news_fd, &v, sizeof(v));
}

void client_abandon(gpuipc_t *c, const ProtoMsg *req)
{
        Abandoned *v = realloc(c->abandoned, (c->n_abandoned + 1) * sizeof(*v));

        if (!v)
                return; /* worst case what a late success did stays until we disconnect */
        c->abandoned = v;
        c->abandoned[c->n_abandoned++] = (Abandoned){ .id = req->id, .op = req->op };
}

void client_forget_abandoned(gpuipc_t *c)
{
        c->n_abandoned = 0;
}

/* Whether reply id answers a request we abandoned, and of which op; forgets it. */
static bool unabandon(gpuipc_t *c, uint64_t id, ProtoOp *ret_op)
{
        for (size_t i = 0; i < c->n_abandoned; i++) {
                if (c->abandoned[i].id == id) {
                        *ret_op = c->abandoned[i].op;
                        c->abandoned[i] = c->abandoned[--c->n_abandoned];
                        return true;
                }
        }
        return false;
}

/* ---- frames ---- */

static int read_last_words(gpuipc_t *c);

static int send_frame(gpuipc_t *c, const ProtoBuf *frame, int fd, uint64_t deadline)
{
        for (;;) {
                struct pollfd pfd = { c->fd, POLLOUT, 0 };
                int r = fdpass_send(c->fd, frame->data, frame->len, fd);

                if (r == 0)
                        return 0;
                if (r != -EAGAIN) {
                        client_errmsg(c, "the broker connection broke while sending (%s)", strerror(-r));
                        return read_last_words(c);
                }
                r = poll(&pfd, 1, client_remaining_ms(deadline));
                if (r == 0) {
                        client_errmsg(c, "the broker did not take the request in time");
                        return GPUIPC_E_TIMEOUT;
                }
                if (r < 0 && errno != EINTR)
                        return -errno;
        }
}

/* Receives and decodes one frame, waiting until deadline. The decoded message points into
 * c->rbuf and stays valid until the next receive. */
static int recv_frame(gpuipc_t *c, uint64_t deadline, Frame *ret)
{
        int fds[MAX_RECV_FDS], truncated = 0;
        bool reset_seen = false;
        ProtoFrameError err;
        size_t n_fds = 0;
        ssize_t n;

        for (;;) {
                struct pollfd pfd = { c->fd, POLLIN, 0 };
                int r;

                n = fdpass_recv(c->fd, c->rbuf, PROTO_MAX_FRAME, fds, MAX_RECV_FDS, &n_fds, &truncated);
                if (n >= 0)
                        break;
                /* A reset is reported once, before what the broker wrote ahead of closing. */
                if (n == -ECONNRESET && !reset_seen) {
                        reset_seen = true;
                        continue;
                }
                if (n != -EAGAIN) {
                        client_errmsg(c, "the broker connection broke (%s)", strerror((int)-n));
                        client_mark_broken(c);
                        return GPUIPC_E_DISCONNECTED;
                }
                r = poll(&pfd, 1, client_remaining_ms(deadline));
                if (r == 0)
                        return GPUIPC_E_TIMEOUT;
                if (r < 0 && errno != EINTR)
                        return -errno;
        }
        if (n == 0 && n_fds == 0) {
                client_errmsg(c, "the broker closed the connection (it stopped or restarted)");
                client_mark_broken(c);
                return GPUIPC_E_DISCONNECTED;
        }
        if (proto_frame_decode(c->rbuf, (size_t)n, n_fds, truncated, PROTO_NONE, &ret->msg, &err) != 0) {
                for (size_t i = 0; i < n_fds; i++)
                        close(fds[i]);
                client_errmsg(c, "the broker sent a frame we cannot read (%s); are client and broker of the same "
                              "release?", err.text);
                client_mark_broken(c);
                return GPUIPC_E_BAD_REPLY;
        }
        for (size_t i = 1; i < n_fds; i++)
                close(fds[i]);
        ret->buf = c->rbuf;
        ret->fd = n_fds ? fds[0] : -1;
        return 0;
}

static int status_to_error(uint64_t status)
{
        return status > 0 && status < 100 ? -(int)(1000 + status) : GPUIPC_E_BAD_REPLY;
}

/* Records a failed reply's message and turns its status into an error code. */
static int reply_error(gpuipc_t *c, const ProtoMsg *m)
{
        if (proto_has(m, PF_MESSAGE))
                client_errmsg(c, "%.*s", (int)m->message.len, m->message.ptr);
        else
                client_errmsg(c, "%s", proto_status_text((unsigned)m->status));
        return status_to_error(m->status);
}

/* Handles a frame that is not the reply we wait for. Returns 0, or the error of a notice
 * addressed to the connection itself (reply 0: the broker refuses us or is stopping), after
 * which the connection is gone. */
static int dispatch(gpuipc_t *c, Frame *f)
{
        ProtoOp op;
        int r = 0;

        if (f->msg.type == PROTO_EVENT) {
                c->hooks.event(c, &f->msg);
        } else if (f->msg.type == PROTO_REPLY && f->msg.reply == 0 && f->msg.status != PROTO_STATUS_OK) {
                r = reply_error(c, &f->msg);
                /* A stopping broker is a lost connection like any other, for callers and for
                 * reconnecting; the message keeps the reason. */
                if (r == GPUIPC_E_SHUTDOWN)
                        r = GPUIPC_E_DISCONNECTED;
                client_mark_broken(c);
        } else if (f->msg.type == PROTO_REPLY && unabandon(c, f->msg.reply, &op)) {
                c->hooks.late_reply(c, op, &f->msg, f->fd >= 0);
        }
        frame_free(f);
        return r;
}

/* The socket broke: the broker may have said why just before (a refusal, a shutdown notice), and
 * that frame can still be read. Returns its error, or GPUIPC_E_DISCONNECTED. */
static int read_last_words(gpuipc_t *c)
{
        for (int i = 0; i < 16 && c->fd >= 0; i++) {
                Frame f = { .fd = -1 };
                int r = recv_frame(c, 0, &f);

                if (r < 0)
                        break;
                r = dispatch(c, &f);
                if (r < 0)
                        return r;
        }
        client_mark_broken(c);
        return GPUIPC_E_DISCONNECTED;
}

/* Sends req and waits for its reply; see client_request. */
static int request_once(gpuipc_t *c, ProtoMsg *req, int fd, uint64_t deadline, Frame *ret)
{
        int r;

        proto_set_id(req, ++c->next_id);
        c->wbuf.len = 0;
        r = proto_frame_encode(&c->wbuf, req, fd >= 0 ? 1 : 0);
        if (r != 0) {
                client_errmsg(c, "cannot encode the request (%s)", r > 0 ? proto_strerror(r) : strerror(-r));
                return r > 0 ? GPUIPC_E_INVALID : r;
        }
        r = send_frame(c, &c->wbuf, fd, deadline);
        if (r < 0)
                return r;
        for (;;) {
                Frame f = { .fd = -1 };

                r = recv_frame(c, deadline, &f);
                if (r == GPUIPC_E_TIMEOUT) {
                        client_abandon(c, req);
                        client_errmsg(c, "no reply from the broker in time");
                        return r;
                }
                if (r < 0)
                        return r;
                if (f.msg.type == PROTO_REPLY && f.msg.reply == req->id) {
                        if (f.msg.status != PROTO_STATUS_OK) {
                                frame_free(&f);
                                return reply_error(c, &f.msg);
                        }
                        *ret = f;
                        return 0;
                }
                r = dispatch(c, &f);
                if (r < 0)
                        return r;
        }
}

int client_send_nowait(gpuipc_t *c, ProtoMsg *req)
{
        int r;

        if (c->fd < 0)
                return GPUIPC_E_DISCONNECTED;
        proto_set_id(req, ++c->next_id);
        c->nbuf.len = 0;
        r = proto_frame_encode(&c->nbuf, req, 0);
        if (r != 0)
                return r > 0 ? GPUIPC_E_INVALID : r;
        r = fdpass_send(c->fd, c->nbuf.data, c->nbuf.len, -1);
        return r == -EAGAIN ? 0 : r; /* a full socket: the broker learns it from our next request or close */
}

int client_request(gpuipc_t *c, ProtoMsg *req, int fd, int timeout_ms, Frame *ret)
{
        int r;

        client_errbuf(c)[0] = 0;
        for (int attempt = 0;; attempt++) {
                if (c->broken) {
                        if (!c->reconnect || c->restoring) {
                                client_errmsg(c, c->restoring ? "the broker went away again while this connection "
                                              "was being restored" : "the broker went away, and this connection "
                                              "was made with no_reconnect: connect again");
                                return GPUIPC_E_DISCONNECTED;
                        }
                        r = c->hooks.reconnect(c, c->connect_timeout_ms);
                        if (r < 0)
                                return r;
                }
                r = request_once(c, req, fd, client_deadline(timeout_ms), ret);
                /* Lost on the way: once everything is registered again, the request means what it
                 * meant before (ids are the producer's, so they are still right), so send it again,
                 * once. A request the old broker had carried out is answered alike: what it did
                 * went down with it and the restore brought back the state the request expects. */
                if (r != GPUIPC_E_DISCONNECTED || !c->reconnect || c->restoring || attempt > 0)
                        return r;
        }
}

static int pump_frames(gpuipc_t *c, int timeout_ms);

int client_pump(gpuipc_t *c, int timeout_ms)
{
        int r = pump_frames(c, timeout_ms);

        c->hooks.after_events(c);
        return r;
}

/* Reads and dispatches frames, waiting at most timeout_ms for the first; how many were read, or an
 * error. */
static int pump_frames(gpuipc_t *c, int timeout_ms)
{
        uint64_t deadline = client_deadline(timeout_ms);
        int r, n = 0;

        for (;;) {
                Frame f = { .fd = -1 };

                if (c->broken) {
                        if (!c->reconnect || c->restoring)
                                return n ? n : GPUIPC_E_DISCONNECTED;
                        /* Waiting (for drained, for events) goes on through a restart: reconnect
                         * within what is left of the wait; with nothing left, try once. */
                        r = c->hooks.reconnect(c, client_remaining_ms(deadline));
                        if (r == GPUIPC_E_NO_BROKER)
                                return n; /* nobody listens yet; the next call tries again */
                        if (r < 0)
                                return r;
                        n++; /* the RECONNECTED event is queued */
                        continue;
                }
                r = recv_frame(c, n == 0 ? deadline : 0, &f);
                if (r == GPUIPC_E_TIMEOUT)
                        return n;
                if (r == GPUIPC_E_DISCONNECTED && c->reconnect && !c->restoring)
                        continue;
                if (r < 0)
                        return r;
                r = dispatch(c, &f);
                if (r == GPUIPC_E_DISCONNECTED && c->reconnect && !c->restoring)
                        continue;
                if (r < 0)
                        return r;
                n++;
        }
}
