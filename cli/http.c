/* The metrics exporter's HTTP server; see http.h. libmicrohttpd reads and parses the requests,
 * sends the responses and enforces its limits; this file keeps what it lacks. A connection's slot
 * (one per connection libmicrohttpd holds, the same 64) says where it stands: reading its head,
 * waiting for the handler (suspended), or being answered. Deadlines and eviction close a connection
 * by shutting its socket down: libmicrohttpd then reads the end of the stream and closes it itself,
 * so the fd is never closed behind its back. Everything runs on one thread, the caller's: the
 * loop polls libmicrohttpd's epoll fd and the wake fd, and calls MHD_run. */
#include "http.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

/* Scrapers and probes come now and then; 64 at once is plenty, and more only costs a close. */
#define MAX_CLIENTS 64
#define PER_ADDRESS_MAX (MAX_CLIENTS / 4)
#define HEAD_MAX 8192        /* libmicrohttpd's memory per connection: the request head (Prometheus sends
                              * a few hundred bytes; past it, 414 or 431) and the response's headers */
#define TARGET_MAX 1024      /* the path and query; longer is 414 */
#define HEAD_TIMEOUT_MS 3000 /* from accept to a complete head: scrapers send it at once */
#define DEADLINE_MS 10000    /* a connection's life: request, waiting, response (a handler that
                              * waits longer moves it) */
#define TICK_MS 1000         /* how often the loop looks at *stop even without a signal */

/* Shared between the sampler thread, which renders a scrape's body once, and every connection
 * sending it: the count is atomic because the last reference may go on either thread. */
struct HttpBody {
        atomic_uint refs;
        size_t len;
        char data[];
};

typedef enum SlotState {
        SLOT_FREE,
        SLOT_READING,  /* the request head */
        SLOT_WAITING,  /* for the handler's answer, suspended */
        SLOT_RESUMING, /* ... resumed: the handler is asked again */
        SLOT_WRITING,  /* the response */
        SLOT_CUT,      /* shut down here; libmicrohttpd has yet to close it */
} SlotState;

typedef struct Slot {
        SlotState state;
        struct MHD_Connection *conn;
        int fd;
        struct in6_addr addr;    /* whose it is (IPv4 as ::ffff:A.B.C.D), as libmicrohttpd counts it */
        uint64_t accepted, writing_since, deadline, retry_at;
        size_t target_len;       /* the request target as sent, query included */
        HttpRequest req;
} Slot;

struct HttpServer {
        const HttpServerConfig *cfg;
        struct MHD_Daemon *daemon;
        int epoll_fd;            /* libmicrohttpd's: readable when it has work */
        bool woken;              /* the wake fd was readable since the last look at the waiting */
        bool closed;             /* a connection closed in this MHD_run */
        Slot slots[MAX_CLIENTS];
};

/* ---- bodies ---- */

HttpBody *http_body_new(const void *data, size_t len)
{
        HttpBody *b = malloc(sizeof(*b) + len + 1);

        if (!b)
                return NULL;
        atomic_init(&b->refs, 1);
        b->len = len;
        if (len)
                memcpy(b->data, data, len);
        b->data[len] = 0;
        return b;
}

HttpBody *http_body_ref(HttpBody *b)
{
        if (b)
                atomic_fetch_add(&b->refs, 1);
        return b;
}

HttpBody *http_body_unref(HttpBody *b)
{
        if (b && atomic_fetch_sub(&b->refs, 1) == 1)
                free(b);
        return NULL;
}

/* ---- listening ---- */

/* Splits "HOST:PORT" / "[V6]:PORT" / ":PORT". */
static int split_spec(const char *spec, char *host, size_t cap, const char **port)
{
        const char *colon;
        size_t n;

        if (spec[0] == '[') {
                const char *end = strchr(spec, ']');
                if (!end || end[1] != ':')
                        return -EINVAL;
                n = (size_t)(end - spec - 1);
                spec++;
                colon = end + 1;
        } else {
                colon = strrchr(spec, ':');
                if (!colon || memchr(spec, ':', (size_t)(colon - spec)))
                        return -EINVAL; /* a bare IPv6 address needs brackets */
                n = (size_t)(colon - spec);
        }
        /* At most five digits before strtol sees them: "99999999999999999999" cannot overflow it. */
        if (n >= cap || !colon[1] || strlen(colon + 1) > 5)
                return -EINVAL;
        memcpy(host, spec, n);
        host[n] = 0;
        *port = colon + 1;
        for (const char *p = *port; *p; p++)
                if (*p < '0' || *p > '9')
                        return -EINVAL;
        return strtol(*port, NULL, 10) > 65535 ? -EINVAL : 0;
}

int http_check_spec(const char *spec, const char **why)
{
        const char *port;
        char host[256];

        if (split_spec(spec, host, sizeof(host), &port) < 0) {
                *why = "expected HOST:PORT, [IPv6]:PORT or :PORT with a port from 0 to 65535";
                return -EINVAL;
        }
        return 0;
}

/* The address the socket is bound to, as HOST:PORT or [HOST]:PORT: read back from the socket, so a
 * :0 request reports the port the kernel picked, which is what a test or supervisor must connect to. */
static void describe_bound(int fd, char *buf, size_t cap)
{
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        char host[INET6_ADDRSTRLEN] = "?";
        unsigned port = 0;

        if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
                snprintf(buf, cap, "?");
                return;
        }
        if (ss.ss_family == AF_INET6) {
                const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
                inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
                port = ntohs(a->sin6_port);
                snprintf(buf, cap, "[%s]:%u", host, port);
        } else {
                const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
                inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
                port = ntohs(a->sin_port);
                snprintf(buf, cap, "%s:%u", host, port);
        }
}

int http_listen(const char *spec, char *ret_bound, size_t cap, const char **why)
{
        struct addrinfo hints = { .ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM }, *res, *ai;
        const char *port;
        char host[256];
        int fd = -1, err = -EADDRNOTAVAIL, one = 1;

        if (http_check_spec(spec, why) < 0)
                return -EINVAL;
        split_spec(spec, host, sizeof(host), &port);
        /* ":PORT" leaves host empty: NULL with AI_PASSIVE gives the wildcard addresses. The port
         * is digits only (AI_NUMERICSERV), so no services database is read. */
        if (getaddrinfo(host[0] ? host : NULL, port, &hints, &res) != 0) {
                *why = "the address does not resolve";
                return -EADDRNOTAVAIL;
        }
        /* Every address: prefer IPv6's wildcard, which takes IPv4 too where the host allows it. */
        for (ai = res; ai; ai = ai->ai_next) {
                fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
                if (fd < 0) {
                        err = -errno;
                        continue;
                }
                /* SO_REUSEADDR: a restarted exporter binds its port at once, without waiting
                 * out the previous one's connections in TIME_WAIT. */
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0)
                        break;
                err = -errno;
                close(fd);
                fd = -1;
        }
        freeaddrinfo(res);
        if (fd < 0) {
                *why = strerror(-err);
                return err;
        }
        describe_bound(fd, ret_bound, cap);
        return fd;
}

/* ---- libmicrohttpd, loaded by the exporter alone ---- */

/* Loaded, not linked: gpuipcctl ships in the client image for application containers, which need
 * libc alone for every other command. The calls keep their prototypes from <microhttpd.h>. */
#define MHD_CALLS(X)                                                                                        \
        X(MHD_start_daemon) X(MHD_stop_daemon) X(MHD_run) X(MHD_get_daemon_info) X(MHD_get_timeout)         \
        X(MHD_get_connection_info) X(MHD_suspend_connection) X(MHD_resume_connection)                      \
        X(MHD_create_response_from_buffer_with_free_callback_cls) X(MHD_add_response_header)               \
        X(MHD_queue_response) X(MHD_destroy_response)

static struct {
#define X(f) __typeof__(f) *f;
        MHD_CALLS(X)
#undef X
} mhd;

/* Resolves every call once (MHD_CALLS): a library that lacks one is refused up front, naming the
 * version needed, instead of failing at the first scrape that reaches the missing call. */
static int mhd_open(const char **why)
{
        static bool loaded;
        void *h;

        if (loaded)
                return 0;
        h = dlopen("libmicrohttpd.so.12", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
                *why = "libmicrohttpd.so.12 cannot be loaded (install libmicrohttpd12)";
                return -ENOENT;
        }
#define X(f)                                                                                                \
        if (!(mhd.f = (__typeof__(mhd.f))dlsym(h, #f))) {                                                   \
                *why = "libmicrohttpd.so.12 lacks " #f " (0.9.73 or newer is needed)";                       \
                return -ENOSYS;                                                                             \
        }
        MHD_CALLS(X)
#undef X
        loaded = true;
        return 0; /* (the handle stays open: the library lives as long as we do) */
}

/* ---- who keeps a slot ---- */

/* Makes libmicrohttpd close the connection: its next read sees the end of the stream. False when
 * there was none to cut. */
static bool cut(Slot *slot)
{
        if (!slot)
                return false;
        shutdown(slot->fd, SHUT_RDWR);
        slot->state = SLOT_CUT;
        return true;
}

/* A slot that holds a connection libmicrohttpd still serves (a cut one only waits for its close). */
static bool live(const Slot *slot)
{
        return slot->state != SLOT_FREE && slot->state != SLOT_CUT;
}

/* The connection to give up for a newcomer (among those of addr, or all with addr NULL): the one
 * waiting longest for its head, else the one reading its answer longest past HEAD_TIMEOUT_MS.
 * Never one waiting for its answer: that ends by itself within the scrape deadline. */
static Slot *evictable(HttpServer *s, const struct in6_addr *addr, uint64_t now)
{
        Slot *idle = NULL, *slow = NULL;

        for (int i = 0; i < MAX_CLIENTS; i++) {
                Slot *c = &s->slots[i];

                if (!live(c) || (addr && memcmp(&c->addr, addr, sizeof(*addr)) != 0))
                        continue;
                if (c->state == SLOT_READING && (!idle || c->accepted < idle->accepted))
                        idle = c;
                if (c->state == SLOT_WRITING && now - c->writing_since >= HEAD_TIMEOUT_MS &&
                    (!slow || c->writing_since < slow->writing_since))
                        slow = c;
        }
        return idle ? idle : slow;
}

/* libmicrohttpd refuses a connection over its limits (all, or one address's) without looking at
 * who holds them. So the one that reaches a limit makes room at once, before the next comes: a
 * scraper behind a flood of idle connections, even from its own address, finds a slot. The
 * newcomer itself goes when the others all wait for answers. */
static void make_room(HttpServer *s, Slot *newcomer, uint64_t now)
{
        unsigned same = 0, all = 0;

        for (int i = 0; i < MAX_CLIENTS; i++) {
                if (!live(&s->slots[i]))
                        continue;
                all++;
                same += memcmp(&s->slots[i].addr, &newcomer->addr, sizeof(newcomer->addr)) == 0;
        }
        if (same >= PER_ADDRESS_MAX && cut(evictable(s, &newcomer->addr, now)))
                all--;
        if (all >= MAX_CLIENTS)
                cut(evictable(s, NULL, now));
}

/* A peer's address as one key for the per-address limit: IPv4 as its IPv4-mapped IPv6 form, so a
 * client counts once whichever family it came over. */
static void addr_key(const struct sockaddr *sa, struct in6_addr *key)
{
        memset(key, 0, sizeof(*key));
        if (sa && sa->sa_family == AF_INET6) {
                *key = ((const struct sockaddr_in6 *)sa)->sin6_addr;
        } else if (sa && sa->sa_family == AF_INET) {
                key->s6_addr[10] = key->s6_addr[11] = 0xff;
                memcpy(&key->s6_addr[12], &((const struct sockaddr_in *)sa)->sin_addr, 4);
        }
}

/* MHD_OPTION_NOTIFY_CONNECTION: a connection accepted (within libmicrohttpd's limits) takes a slot,
 * one closed gives it back. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode what)
{
        HttpServer *s = cls;
        const union MHD_ConnectionInfo *fd, *addr;
        Slot *slot = NULL;
        uint64_t now = monotonic_ms();

        if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
                if (*socket_context)
                        *(Slot *)*socket_context = (Slot){ .state = SLOT_FREE, .fd = -1 };
                s->closed = true;
                return;
        }
        fd = mhd.MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        addr = mhd.MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        /* As many slots as libmicrohttpd holds connections: one is free. */
        for (int i = 0; i < MAX_CLIENTS && !slot; i++)
                if (s->slots[i].state == SLOT_FREE)
                        slot = &s->slots[i];
        if (!slot || !fd) {
                /* Refused at once, as cut does: no connection lives here without a slot, and so
                 * without a deadline. */
                if (fd)
                        shutdown(fd->connect_fd, SHUT_RDWR);
                return;
        }
        *slot = (Slot){ .state = SLOT_READING, .conn = conn, .fd = fd->connect_fd, .accepted = now };
        addr_key(addr ? addr->client_addr : NULL, &slot->addr);
        *socket_context = slot;
        make_room(s, slot, now);
}

/* ---- one request ---- */

/* libmicrohttpd's free callback: the response borrowed the body's bytes, so the reference is only
 * dropped once the response is gone (a shared sample stays alive while any client still reads it). */
static void body_release(void *body)
{
        http_body_unref(body);
}

/* Queues the response (taking the reference to body); MHD_NO closes the connection. */
static enum MHD_Result respond(Slot *slot, int status, const char *content_type, HttpBody *body, uint64_t now)
{
        struct MHD_Response *r = mhd.MHD_create_response_from_buffer_with_free_callback_cls(
                body ? body->len : 0, body ? body->data : NULL, body ? body_release : NULL, body);
        enum MHD_Result ok;

        /* No response took the body: its reference is still ours to drop. */
        if (!r) {
                http_body_unref(body);
                return MHD_NO;
        }
        ok = mhd.MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                         content_type ? content_type : "text/plain; charset=utf-8");
        /* One request per connection: no keep-alive, so a slot's deadline covers one request and
         * an idle kept-alive connection never holds one of the 64. */
        if (ok == MHD_YES)
                ok = mhd.MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
        if (ok == MHD_YES && status == MHD_HTTP_METHOD_NOT_ALLOWED)
                ok = mhd.MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
        if (ok == MHD_YES)
                ok = mhd.MHD_queue_response(slot->conn, (unsigned)status, r);
        mhd.MHD_destroy_response(r); /* libmicrohttpd keeps its own reference while it sends */
        slot->state = SLOT_WRITING;
        slot->writing_since = now;
        /* A handler that waited long (a scrape's --timeout) leaves the answer time to be sent. */
        slot->deadline = slot->accepted + DEADLINE_MS;
        if (slot->deadline < now + DEADLINE_MS / 2)
                slot->deadline = now + DEADLINE_MS / 2;
        return ok;
}

static enum MHD_Result respond_text(Slot *slot, int status, const char *text, uint64_t now)
{
        HttpBody *b = http_body_new(text, strlen(text));

        return b ? respond(slot, status, NULL, b, now) : MHD_NO;
}

/* MHD_OPTION_URI_LOG_CALLBACK: sees the target as sent (libmicrohttpd then splits off the query and
 * decodes the path), for the 414 of a target over TARGET_MAX. Its return becomes the request's
 * context: the slot. */
static void *on_target(void *cls, const char *target, struct MHD_Connection *conn)
{
        const union MHD_ConnectionInfo *ctx = mhd.MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        Slot *slot = ctx ? ctx->socket_context : NULL;

        if (slot)
                slot->target_len = target ? strlen(target) : 0;
        return slot;
}

/* The access handler: the head is complete (first call), or a waiting request was resumed. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **req_cls)
{
        HttpServer *s = cls;
        Slot *slot = *req_cls;
        HttpResponse r = { 0 };
        uint64_t now = monotonic_ms();

        if (!slot || slot->state == SLOT_CUT)
                return MHD_NO;
        /* Nothing here takes a body: its first bytes end the request, before they could keep a
         * resumed connection (which has no deadline here) busy. */
        if (*upload_size)
                return respond_text(slot, MHD_HTTP_BAD_REQUEST, "a request body is not taken here\n", now);
        if (slot->state == SLOT_READING) {
                /* HEAD is answered as GET is; libmicrohttpd leaves the body out. */
                if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
                        return respond_text(slot, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n", now);
                if (slot->target_len > TARGET_MAX)
                        return respond_text(slot, MHD_HTTP_URI_TOO_LONG, "the path is longer than 1024 bytes\n",
                                            now);
                /* The query is ignored: the one resource is the metrics page, and "/metrics?x" is
                 * not a 404. url lives in the connection's memory as long as the request. */
                slot->req = (HttpRequest){ .path = url, .arrived_ms = now };
        }
        s->cfg->handler(&slot->req, &r, s->cfg->userdata);
        if (r.status)
                return respond(slot, r.status, r.content_type, r.body, now);
        http_body_unref(r.body);
        /* Never without a time to ask again. */
        slot->retry_at = r.retry_at_ms ? r.retry_at_ms : now + DEADLINE_MS;
        slot->state = SLOT_WAITING;
        mhd.MHD_suspend_connection(conn);
        return MHD_YES;
}

/* ---- the loop ---- */

/* Takes cfg->listen_fd whatever happens (closed on failure), so the caller has one fd fewer to
 * track on its error paths. */
int http_server_new(HttpServer **ret, const HttpServerConfig *cfg, const char **why)
{
        HttpServer *s;
        const union MHD_DaemonInfo *epoll_fd;
        int r = mhd_open(why);

        if (r < 0) {
                close(cfg->listen_fd);
                return r;
        }
        s = calloc(1, sizeof(*s));
        if (!s) {
                close(cfg->listen_fd);
                *why = strerror(ENOMEM);
                return -ENOMEM;
        }
        s->cfg = cfg;
        for (int i = 0; i < MAX_CLIENTS; i++)
                s->slots[i].fd = -1;
        /* libmicrohttpd's Date header (gmtime_r) reads the time zone once: now, while files may
         * still be opened. */
        tzset();
        /* External polling on epoll: no thread of libmicrohttpd's, the loop below drives it (and
         * resumes the suspended requests itself). The timeout is libmicrohttpd's (3 s without a
         * byte); the head's own deadline is this file's. */
        s->daemon = mhd.MHD_start_daemon(MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME, 0, NULL, NULL, on_request, s,
                                         MHD_OPTION_LISTEN_SOCKET, cfg->listen_fd,
                                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CLIENTS,
                                         MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PER_ADDRESS_MAX,
                                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(HEAD_TIMEOUT_MS / 1000),
                                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HEAD_MAX,
                                         MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                                         MHD_OPTION_URI_LOG_CALLBACK, on_target, s,
                                         MHD_OPTION_END);
        epoll_fd = s->daemon ? mhd.MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
        if (!epoll_fd) {
                if (s->daemon)
                        mhd.MHD_stop_daemon(s->daemon);
                else
                        close(cfg->listen_fd);
                free(s);
                *why = "libmicrohttpd cannot serve on the listening socket";
                return -EIO;
        }
        s->epoll_fd = epoll_fd->epoll_fd;
        *ret = s;
        return 0;
}

/* The wake fd is an eventfd the sampler writes when a sample is in: reading it to empty re-arms
 * it, and woken makes the next look ask every waiting request again. */
static void drain_wake(HttpServer *s)
{
        uint64_t v;

        while (read(s->cfg->wake_fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
                ;
        s->woken = true;
}

/* Deadlines and pending answers: cuts what ran out of time, resumes the waiting requests whose
 * answer may be ready; returns how long the loop may sleep: not at all after a resume, which
 * libmicrohttpd acts on (asking the handler again) in the next MHD_run, with nothing to wake it in
 * external polling. */
static int housekeeping(HttpServer *s, uint64_t now)
{
        uint64_t next = now + TICK_MS, due;

        for (int i = 0; i < MAX_CLIENTS; i++) {
                Slot *c = &s->slots[i];

                if (c->state == SLOT_READING || c->state == SLOT_WRITING) {
                        due = c->state == SLOT_READING ? c->accepted + HEAD_TIMEOUT_MS : c->deadline;
                        if (now >= due)
                                cut(c);
                        else if (due < next)
                                next = due;
                } else if (c->state == SLOT_WAITING) {
                        if (s->woken || now >= c->retry_at) {
                                c->state = SLOT_RESUMING;
                                mhd.MHD_resume_connection(c->conn);
                                next = now;
                        } else if (c->retry_at < next) {
                                next = c->retry_at;
                        }
                }
        }
        s->woken = false;
        return next > now ? (int)(next - now) : 0;
}

/* One thread serves every connection: libmicrohttpd's epoll fd and the sampler's wake fd in one
 * poll, woken by the earliest of the library's own timeout and the scrapes' deadlines; a signal
 * (stop) ends the loop between two runs, never inside one. */
int http_server_run(HttpServer *s, volatile sig_atomic_t *stop)
{
        while (!*stop) {
                struct pollfd pfd[2] = { { s->epoll_fd, POLLIN, 0 }, { s->cfg->wake_fd, POLLIN, 0 } };
                MHD_UNSIGNED_LONG_LONG mhd_ms;
                int timeout;

                if (mhd.MHD_run(s->daemon) != MHD_YES)
                        return -EIO;
                timeout = housekeeping(s, monotonic_ms());
                if (mhd.MHD_get_timeout(s->daemon, &mhd_ms) == MHD_YES && mhd_ms < (MHD_UNSIGNED_LONG_LONG)timeout)
                        timeout = (int)mhd_ms;
                /* At its connection limit libmicrohttpd takes the listening socket out of its epoll
                 * set, and puts it back at the start of an MHD_run once below: after a close, run
                 * again at once, or a scraper waits for the next tick in the kernel's backlog. */
                if (s->closed)
                        timeout = 0;
                s->closed = false;
                if (poll(pfd, s->cfg->wake_fd >= 0 ? 2 : 1, timeout) < 0 && errno != EINTR)
                        return -errno;
                if (pfd[1].revents)
                        drain_wake(s);
        }
        return 0;
}

HttpServer *http_server_free(HttpServer *s)
{
        if (!s)
                return NULL;
        /* libmicrohttpd stops only with no connection suspended. */
        for (int i = 0; i < MAX_CLIENTS; i++)
                if (s->slots[i].state == SLOT_WAITING) {
                        s->slots[i].state = SLOT_RESUMING;
                        mhd.MHD_resume_connection(s->slots[i].conn);
                }
        mhd.MHD_stop_daemon(s->daemon);
        free(s);
        return NULL;
}
