/* The connection to the broker: connect and hello, frames in and out with fds, blocking requests
 * with timeouts, the event queue, and reconnecting after the broker restarts or drops us.
 *
 * Reconnecting (with the reconnect option) is meant to be invisible to callers: a call interrupted
 * by the loss is sent again once buffer.c has registered what this connection had (own buffers,
 * held references, subscriptions), and the caller only sees a RECONNECTED event. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "fdpass.h"
#include "internal.h"
#include "macro.h"

#define CONNECT_RETRY_MS 50
#define MAX_RECV_FDS 4

uint64_t client_now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Why the last gpuipc_connect() of this thread failed: the connection is gone by then. */
static __thread char connect_errmsg[PROTO_MAX_TEXT + 1];

void client_errmsg(gpuipc_t *c, const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
        va_end(ap);
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

_public_ const char *gpuipc_errmsg(const gpuipc_t *c)
{
        return c ? c->errmsg : connect_errmsg;
}

void frame_free(Frame *f)
{
        f->fd = safe_close(f->fd);
}

static int read_last_words(gpuipc_t *c);

/* Milliseconds left until deadline (UINT64_MAX: forever), as poll(2) wants them. */
static int remaining(uint64_t deadline)
{
        uint64_t now;

        if (deadline == UINT64_MAX)
                return -1;
        now = client_now_ms();
        return now >= deadline ? 0 : (int)MIN(deadline - now, (uint64_t)INT32_MAX);
}

static uint64_t deadline_after(int timeout_ms)
{
        return timeout_ms < 0 ? UINT64_MAX : client_now_ms() + (uint64_t)timeout_ms;
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
                epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->retry_timer,
                          &(struct epoll_event){ .events = EPOLLIN, .data.fd = c->retry_timer });
        }
        if (c->retry_timer < 0)
                return;
        if (on)
                its.it_value = its.it_interval = (struct timespec){ 0, CONNECT_RETRY_MS * 1000000L };
        timerfd_settime(c->retry_timer, 0, &its, NULL);
        (void)!read(c->retry_timer, &ticks, sizeof(ticks)); /* clear what fired already */
}

static void mark_broken(gpuipc_t *c)
{
        c->broken = true;
        c->fd = safe_close(c->fd); /* closing also takes it out of the epoll set */
        if (c->reconnect)
                retry_timer_set(c, true);
}

/* The socket joins the epoll set behind gpuipc_fd(). */
static void watch_socket(gpuipc_t *c)
{
        epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->fd, &(struct epoll_event){ .events = EPOLLIN, .data.fd = c->fd });
        retry_timer_set(c, false);
}

uint64_t client_new_buffer_id(void)
{
        uint64_t v = 0;

        /* getrandom blocks only before the kernel's pool is initialized, long before any of this. */
        while ((v & PROTO_MAX_BUFFER_ID) == 0)
                if (getrandom(&v, sizeof(v), 0) != sizeof(v))
                        v = client_now_ms() ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&v;
        return v & PROTO_MAX_BUFFER_ID;
}

/* ---- events ---- */

void client_queue_event(gpuipc_t *c, const gpuipc_event_t *ev)
{
        if (c->ev_count == CLIENT_EVENT_QUEUE_MAX) {
                /* Nobody reads events: keep the newest ones and count what was lost. */
                c->ev_head = (c->ev_head + 1) % CLIENT_EVENT_QUEUE_MAX;
                c->ev_count--;
                c->events_lost++;
        }
        c->events[(c->ev_head + c->ev_count) % CLIENT_EVENT_QUEUE_MAX] = *ev;
        c->ev_count++;
}

static bool take_event(gpuipc_t *c, gpuipc_event_t *ret)
{
        if (!c->ev_count)
                return false;
        *ret = c->events[c->ev_head];
        c->ev_head = (c->ev_head + 1) % CLIENT_EVENT_QUEUE_MAX;
        c->ev_count--;
        return true;
}

void client_abandon(gpuipc_t *c, uint64_t id)
{
        uint64_t *v = realloc(c->abandoned, (c->n_abandoned + 1) * sizeof(*v));

        if (!v)
                return; /* worst case a late reference stays until we disconnect */
        c->abandoned = v;
        c->abandoned[c->n_abandoned++] = id;
}

static bool unabandon(gpuipc_t *c, uint64_t id)
{
        for (size_t i = 0; i < c->n_abandoned; i++) {
                if (c->abandoned[i] == id) {
                        c->abandoned[i] = c->abandoned[--c->n_abandoned];
                        return true;
                }
        }
        return false;
}

/* ---- frames ---- */

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
                r = poll(&pfd, 1, remaining(deadline));
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
                        mark_broken(c);
                        return GPUIPC_E_DISCONNECTED;
                }
                r = poll(&pfd, 1, remaining(deadline));
                if (r == 0)
                        return GPUIPC_E_TIMEOUT;
                if (r < 0 && errno != EINTR)
                        return -errno;
        }
        if (n == 0 && n_fds == 0) {
                client_errmsg(c, "the broker closed the connection (it stopped or restarted)");
                mark_broken(c);
                return GPUIPC_E_DISCONNECTED;
        }
        if (proto_frame_decode(c->rbuf, (size_t)n, n_fds, truncated, PROTO_NONE, &ret->msg, &err) != 0) {
                for (size_t i = 0; i < n_fds; i++)
                        close(fds[i]);
                client_errmsg(c, "the broker sent a frame we cannot read (%s); are client and broker of the same "
                              "release?", err.text);
                mark_broken(c);
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
        int r = 0;

        if (f->msg.type == PROTO_EVENT) {
                buffer_on_event(c, &f->msg);
        } else if (f->msg.type == PROTO_REPLY && f->msg.reply == 0 && f->msg.status != PROTO_STATUS_OK) {
                r = reply_error(c, &f->msg);
                /* A stopping broker is a lost connection like any other, for callers and for
                 * reconnecting; the message keeps the reason. */
                if (r == GPUIPC_E_SHUTDOWN)
                        r = GPUIPC_E_DISCONNECTED;
                mark_broken(c);
        } else if (f->msg.type == PROTO_REPLY && unabandon(c, f->msg.reply)) {
                buffer_on_late_attach(c, f);
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
        mark_broken(c);
        return GPUIPC_E_DISCONNECTED;
}

static int reconnect(gpuipc_t *c, int timeout_ms);

/* Sends req and waits for its reply; see client_request. */
static int request_once(gpuipc_t *c, ProtoMsg *req, int fd, uint64_t deadline, Frame *ret)
{
        int r;

        req->id = ++c->next_id;
        proto_set(req, PF_ID);
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
                        client_abandon(c, req->id);
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

int client_request(gpuipc_t *c, ProtoMsg *req, int fd, int timeout_ms, Frame *ret)
{
        int r;

        c->errmsg[0] = 0;
        for (int attempt = 0;; attempt++) {
                if (c->broken) {
                        if (!c->reconnect || c->restoring) {
                                client_errmsg(c, "the broker went away; reconnect (or connect with the reconnect "
                                              "option)");
                                return GPUIPC_E_DISCONNECTED;
                        }
                        r = reconnect(c, c->connect_timeout_ms);
                        if (r < 0)
                                return r;
                }
                r = request_once(c, req, fd, deadline_after(timeout_ms), ret);
                /* Lost on the way: once everything is registered again, the request means what it
                 * meant before (ids are the producer's, so they are still right), so send it again,
                 * once. A request the old broker had carried out is answered alike: what it did
                 * went down with it and the restore brought back the state the request expects. */
                if (r != GPUIPC_E_DISCONNECTED || !c->reconnect || c->restoring || attempt > 0)
                        return r;
        }
}

int client_pump(gpuipc_t *c, int timeout_ms)
{
        uint64_t deadline = deadline_after(timeout_ms);
        int r, n = 0;

        for (;;) {
                Frame f = { .fd = -1 };

                if (c->broken) {
                        if (!c->reconnect || c->restoring)
                                return n ? n : GPUIPC_E_DISCONNECTED;
                        /* Waiting (for drained, for events) goes on through a restart: reconnect
                         * within what is left of the wait; with nothing left, try once. */
                        r = reconnect(c, remaining(deadline));
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

/* ---- connecting ---- */

static int open_socket(gpuipc_t *c, int timeout_ms)
{
        uint64_t deadline = deadline_after(timeout_ms);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };

        /* Checked at connect too: never connect to a cut-off path. */
        if (strlen(c->path) >= sizeof(sa.sun_path))
                return -ENAMETOOLONG;
        memcpy(sa.sun_path, c->path, strlen(c->path));
        for (;;) {
                int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), err;

                if (fd < 0)
                        return -errno;
                if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
                        c->fd = fd;
                        watch_socket(c);
                        return 0;
                }
                err = errno;
                close(fd);
                if (err == EACCES || err == EPERM) {
                        struct stat st;
                        if (stat(c->path, &st) == 0)
                                client_errmsg(c, "no permission to connect to %s (mode %04o, owner %u, group %u); run "
                                              "in the socket's group (fsGroup / supplementalGroups)", c->path,
                                              (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)st.st_gid);
                        else
                                client_errmsg(c, "no permission to reach %s", c->path);
                        return -EACCES;
                }
                if (err == EPROTOTYPE) {
                        client_errmsg(c, "%s is not a gpuipc socket (wrong socket type)", c->path);
                        return GPUIPC_E_NO_BROKER;
                }
                if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) {
                        client_errmsg(c, "cannot connect to %s: %s", c->path, strerror(err));
                        return -err;
                }
                if (remaining(deadline) == 0) {
                        client_errmsg(c, "nothing listens on %s (%s); is gpuipc-broker running, and is its socket "
                                      "directory mounted into this container at that path?", c->path, strerror(err));
                        return GPUIPC_E_NO_BROKER;
                }
                usleep(CONNECT_RETRY_MS * 1000);
        }
}

static int say_hello(gpuipc_t *c)
{
        ProtoMsg req = { 0 };
        Frame f = { .fd = -1 };
        int r;

        req.op = PROTO_OP_HELLO;
        req.version = PROTO_VERSION;
        req.pid = (uint64_t)getpid();
        req.pidns = c->pidns;
        req.label = proto_str(c->label);
        req.n_gpus = c->n_gpus;
        for (uint32_t i = 0; i < c->n_gpus; i++)
                req.gpus[i] = proto_str(c->gpus[i]);
        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_VERSION) | PROTO_BIT(PF_PID) | PROTO_BIT(PF_PIDNS) |
                  PROTO_BIT(PF_LABEL) | PROTO_BIT(PF_GPUS);
        /* A caller that bounds connecting bounds the greeting too: a stopped broker accepts (the
         * kernel queues the connection) but never answers. */
        r = client_request(c, &req, -1, c->connect_timeout_ms > 0 ? c->connect_timeout_ms : 10000, &f);
        if (r < 0)
                return r;
        c->peer_id = f.msg.peer;
        c->pidns_same = f.msg.pidns_same;
        c->epoch = f.msg.epoch;
        frame_free(&f);
        return 0;
}

static int reconnect(gpuipc_t *c, int timeout_ms)
{
        uint64_t deadline = deadline_after(timeout_ms);
        int r;

        for (;;) {
                c->broken = false;
                c->restoring = true;
                r = open_socket(c, remaining(deadline));
                if (r == 0)
                        r = say_hello(c);
                if (r == 0)
                        r = buffer_after_reconnect(c);
                c->restoring = false;
                if (r == 0)
                        return 0;
                mark_broken(c);
                /* A broker that is being killed still accepts for a moment, then drops what it
                 * accepted; a restarting one is not there yet. Either way: try again in time. */
                if (r != GPUIPC_E_DISCONNECTED || remaining(deadline) == 0)
                        return r;
                usleep(CONNECT_RETRY_MS * 1000);
        }
}

static uint64_t own_pidns(void)
{
        struct stat st;
        return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static void default_label(char *buf, size_t cap)
{
        char comm[64] = "";
        FILE *f = fopen("/proc/self/comm", "re");

        if (f) {
                if (fgets(comm, sizeof(comm), f))
                        comm[strcspn(comm, "\n")] = 0;
                fclose(f);
        }
        snprintf(buf, cap, "%s", comm[0] ? comm : "gpuipc-client");
}

/* Where to connect: the option, else $GPUIPC_SOCKET, else the default. A value that is given but
 * empty or too long is an error, never a silent fallback. NULL with connect_errmsg set otherwise. */
static const char *socket_path_of(const gpuipc_options_t *o)
{
        const char *path = o->socket_path, *what = "socket_path";

        if (!path) {
                path = getenv("GPUIPC_SOCKET");
                what = "GPUIPC_SOCKET";
        }
        if (!path)
                return GPUIPC_DEFAULT_SOCKET;
        if (!*path) {
                snprintf(connect_errmsg, sizeof(connect_errmsg), "%s is set but empty; give the broker's socket path "
                         "(or leave it unset for %s)", what, GPUIPC_DEFAULT_SOCKET);
                return NULL;
        }
        if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
                snprintf(connect_errmsg, sizeof(connect_errmsg), "%s '%.200s...' is %zu bytes long; a Unix socket "
                         "path has at most %zu", what, path, strlen(path),
                         sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
                return NULL;
        }
        return path;
}

/* $GPUIPC_CACHE_MAX: how many unreferenced mappings to keep (a number, else an error). */
static int cache_max_of(size_t *ret)
{
        const char *env = getenv("GPUIPC_CACHE_MAX");
        char *end;
        unsigned long long v;

        *ret = CLIENT_CACHE_MAX_IDLE;
        if (!env)
                return 0;
        errno = 0;
        v = strtoull(env, &end, 10);
        if (!*env || *end || errno || env[0] == '-' || v > 1000000) {
                snprintf(connect_errmsg, sizeof(connect_errmsg), "GPUIPC_CACHE_MAX='%.64s' is not a number of mappings "
                         "from 0 to 1000000", env);
                return GPUIPC_E_INVALID;
        }
        *ret = (size_t)v;
        return 0;
}

_public_ int gpuipc_connect(gpuipc_t **ret, const gpuipc_options_t *opts)
{
        gpuipc_options_t o = opts ? *opts : (gpuipc_options_t){ 0 };
        const char *path;
        size_t max_idle;
        gpuipc_t *c;
        int r;

        if (!ret)
                return -EINVAL;
        connect_errmsg[0] = 0;
        path = socket_path_of(&o);
        if (!path)
                return GPUIPC_E_INVALID;
        r = cache_max_of(&max_idle);
        if (r < 0)
                return r;
        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        /* First, so that gpuipc_close can undo a half-made connection. */
        list_init(&c->own);
        list_init(&c->attached);
        list_init(&c->subs);
        list_init(&c->rings);
        list_init(&c->idle);
        c->fd = c->retry_timer = -1;
        c->epfd = epoll_create1(EPOLL_CLOEXEC);
        c->rbuf = malloc(PROTO_MAX_FRAME);
        c->events = calloc(CLIENT_EVENT_QUEUE_MAX, sizeof(*c->events));
        c->path = strdup(path);
        if (c->epfd < 0 || !c->rbuf || !c->events || !c->path) {
                r = c->epfd < 0 ? -errno : -ENOMEM;
                gpuipc_close(c);
                return r;
        }
        if (o.label)
                snprintf(c->label, sizeof(c->label), "%s", o.label);
        else
                default_label(c->label, sizeof(c->label));
        c->connect_timeout_ms = o.connect_timeout_ms;
        c->reconnect = o.reconnect;
        c->pidns = own_pidns();
        c->max_idle = max_idle;
        c->device_pref = -1;
        if (!o.no_gpus)
                c->n_gpus = cuda_visible_gpus(c->gpus, PROTO_MAX_GPUS);

        r = open_socket(c, o.connect_timeout_ms);
        if (r == 0)
                r = say_hello(c);
        if (r < 0) {
                snprintf(connect_errmsg, sizeof(connect_errmsg), "%s", c->errmsg[0] ? c->errmsg : gpuipc_strerror(r));
                gpuipc_close(c);
                return r;
        }
        *ret = c;
        return 0;
}

_public_ void gpuipc_close(gpuipc_t *c)
{
        if (!c)
                return;
        ring_close_all(c);
        buffer_close_all(c);
        while (!list_empty(&c->subs)) {
                Subscription *s = list_entry(c->subs.next, Subscription, link);
                list_unlink(&s->link);
                free(s);
        }
        safe_close(c->fd);
        safe_close(c->retry_timer);
        safe_close(c->epfd);
        free(c->path);
        hmap_deinit(&c->maps_by_id);
        free(c->abandoned);
        free(c->events);
        free(c->rbuf);
        proto_buf_free(&c->wbuf);
        free(c);
}

_public_ int gpuipc_ping(gpuipc_t *c, int timeout_ms)
{
        ProtoMsg req = { .op = PROTO_OP_PING, .has = PROTO_BIT(PF_OP) };
        Frame f = { .fd = -1 };
        int r = client_request(c, &req, -1, timeout_ms, &f);

        if (r == 0)
                frame_free(&f);
        return r;
}

/* ---- events API ---- */

_public_ int gpuipc_next_event(gpuipc_t *c, gpuipc_event_t *ret, int timeout_ms)
{
        uint64_t deadline = deadline_after(timeout_ms);
        bool pumped = false;

        for (;;) {
                int left, r;

                if (take_event(c, ret))
                        return 0;
                left = remaining(deadline);
                if (left == 0 && pumped)
                        return GPUIPC_E_TIMEOUT;
                r = client_pump(c, left);
                if (r < 0)
                        return r;
                pumped = true;
        }
}

_public_ int gpuipc_fd(const gpuipc_t *c)
{
        return c->epfd;
}

_public_ int gpuipc_process(gpuipc_t *c)
{
        /* While the broker is away, each wake-up of the retry timer is one attempt (client_pump
         * with no time to wait tries once and says nothing when nobody listens yet). */
        int r = client_pump(c, 0);

        return r < 0 ? r : (int)c->ev_count;
}

_public_ int gpuipc_subscribe(gpuipc_t *c, const char *prefix, uint64_t *ret_subscription)
{
        ProtoMsg req = { .op = PROTO_OP_SUBSCRIBE };
        Frame f = { .fd = -1 };
        Subscription *s;
        int r;

        r = client_check_name(c, prefix, "name prefix", true, 0);
        if (r < 0)
                return r;
        s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        req.prefix = proto_str(prefix);
        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_PREFIX);
        r = client_request(c, &req, -1, 10000, &f);
        if (r < 0) {
                free(s);
                return r;
        }
        s->broker_id = f.msg.sub;
        s->id = ++c->next_sub;
        snprintf(s->prefix, sizeof(s->prefix), "%s", prefix);
        list_append(&c->subs, &s->link);
        frame_free(&f);
        if (ret_subscription)
                *ret_subscription = s->id;
        return 0;
}

_public_ int gpuipc_unsubscribe(gpuipc_t *c, uint64_t subscription)
{
        list_for_each(pos, &c->subs) {
                Subscription *s = list_entry(pos, Subscription, link);
                ProtoMsg req = { .op = PROTO_OP_UNSUBSCRIBE };
                Frame f = { .fd = -1 };
                int r;

                if (s->id != subscription)
                        continue;
                req.sub = s->broker_id;
                req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_SUB);
                r = client_request(c, &req, -1, 10000, &f);
                if (r == 0)
                        frame_free(&f);
                list_unlink(&s->link);
                free(s);
                return r;
        }
        return GPUIPC_E_NOT_FOUND;
}

int client_resubscribe(gpuipc_t *c)
{
        list_for_each(pos, &c->subs) {
                Subscription *s = list_entry(pos, Subscription, link);
                ProtoMsg req = { .op = PROTO_OP_SUBSCRIBE };
                Frame f = { .fd = -1 };
                int r;

                req.prefix = proto_str(s->prefix);
                req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_PREFIX);
                r = client_request(c, &req, -1, 10000, &f);
                if (r < 0)
                        return r;
                s->broker_id = f.msg.sub;
                frame_free(&f);
        }
        return 0;
}

uint64_t client_subscription_id(gpuipc_t *c, uint64_t broker_id)
{
        list_for_each(pos, &c->subs) {
                Subscription *s = list_entry(pos, Subscription, link);
                if (s->broker_id == broker_id)
                        return s->id;
        }
        return 0;
}

_public_ int gpuipc_group_join(gpuipc_t *c, const char *group, unsigned members, int timeout_ms)
{
        ProtoMsg req = { .op = PROTO_OP_GROUP_JOIN };
        Frame f = { .fd = -1 };
        int r;

        if (!group || timeout_ms == 0)
                return GPUIPC_E_INVALID;
        r = client_check_name(c, group, "group name", false, 0);
        if (r < 0)
                return r;
        req.group = proto_str(group);
        req.members = members;
        req.timeout_ms = timeout_ms < 0 ? PROTO_TIMEOUT_INFINITE : (uint64_t)timeout_ms;
        req.has = PROTO_BIT(PF_OP) | PROTO_BIT(PF_GROUP) | PROTO_BIT(PF_MEMBERS) | PROTO_BIT(PF_TIMEOUT_MS);
        r = client_request(c, &req, -1, timeout_ms < 0 ? -1 : timeout_ms + CLIENT_REPLY_GRACE_MS, &f);
        if (r == 0)
                frame_free(&f);
        return r;
}
