/* The metrics exporter's HTTP server; see http.h. Each connection reads one request head, gets one
 * response, and is closed. What it must never do: let one client hold the others up, or run out of
 * room for a scraper because of clients that do nothing. So every socket is non-blocking; the
 * listener is always polled and every connection accepted at once (a kernel backlog full of
 * waiting scrapers is what an attacker wants); a head must be complete within HEAD_TIMEOUT_MS; a
 * full server closes the connection idle longest (or slowest to read its answer) to make room; one
 * address holds at most PER_ADDRESS_MAX connections, and over that its own oldest goes. Nothing here
 * reads a request body: nothing takes input beyond a path. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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
#define PER_ADDRESS_MAX (MAX_CLIENTS / 4) /* an IPv4 address, or an IPv6 /64 */
#define HEAD_MAX 8192                     /* request line and headers; Prometheus sends a few hundred bytes */
#define TARGET_MAX 1024                   /* the path and query; longer is 414 */
#define HEAD_TIMEOUT_MS 3000              /* from accept to a complete head: scrapers send it at once */
#define DEADLINE_MS 10000                 /* a connection's life: request, waiting, response (a handler
                                           * that waits longer moves it) */
#define ACCEPT_BATCH 64                   /* connections taken per wake-up, so that clients get read too */
#define TICK_MS 1000                      /* how often the loop looks at *stop even without a signal */

/* Shared between the sampler thread, which renders a scrape's body once, and every connection
 * sending it: the count is atomic because the last reference may go on either thread. */
struct HttpBody {
        atomic_uint refs;
        size_t len;
        char data[];
};

typedef enum ClientState {
        CLIENT_FREE,
        CLIENT_READING, /* the request head */
        CLIENT_WAITING, /* for the handler's answer */
        CLIENT_WRITING, /* the response */
} ClientState;

typedef struct Client {
        ClientState state;
        int fd;
        uint8_t addr[8];   /* whose it is, for the per-address limit: IPv4, or an IPv6 /64 */
        uint64_t accepted, head_deadline, deadline, writing_since, retry_at;
        char head[HEAD_MAX + 1];
        size_t head_len;
        char path[TARGET_MAX + 1];
        bool head_only;
        HttpRequest req;
        char hdr[256];     /* the status line and headers of the response */
        size_t hdr_len, off; /* off: bytes sent, over hdr then body */
        HttpBody *body;
} Client;

typedef struct Server {
        const HttpServerConfig *cfg;
        Client clients[MAX_CLIENTS];
        bool woken;        /* the wake fd was readable in this round */
        uint64_t accept_paused_until;
} Server;

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

/* ---- one connection ---- */

static const char *reason_phrase(int status)
{
        switch (status) {
        case 200: return "OK";
        case 400: return "Bad Request";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 408: return "Request Timeout";
        case 414: return "URI Too Long";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        case 503: return "Service Unavailable";
        }
        return "Unknown";
}

static void client_write(Client *c);

/* Leaves the slot reusable at once (fd -1, no body): evictable() and free_slot() may hand it to
 * the next connection in the same round. */
static void client_close(Client *c)
{
        if (c->fd >= 0)
                close(c->fd);
        http_body_unref(c->body);
        c->fd = -1;
        c->body = NULL;
        c->state = CLIENT_FREE;
}

/* Starts sending the response: status line, headers, and (unless HEAD) the body, whose reference
 * the client takes. */
static void respond(Client *c, int status, const char *content_type, HttpBody *body, uint64_t now)
{
        int n = snprintf(c->hdr, sizeof(c->hdr),
                         "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                         status, reason_phrase(status), content_type ? content_type : "text/plain; charset=utf-8",
                         body ? body->len : 0, status == 405 ? "Allow: GET, HEAD\r\n" : "");

        c->hdr_len = n > 0 && (size_t)n < sizeof(c->hdr) ? (size_t)n : 0;
        c->body = c->head_only ? http_body_unref(body) : body;
        c->off = 0;
        c->state = CLIENT_WRITING;
        c->writing_since = now;
        client_write(c); /* most answers fit the socket buffer at once */
}

static void respond_text(Client *c, int status, const char *text, uint64_t now)
{
        HttpBody *b = http_body_new(text, strlen(text));

        if (!b) {
                client_close(c);
                return;
        }
        respond(c, status, NULL, b, now);
}

/* Asks the handler (again); answers, or waits for it. */
static void client_ask(Server *s, Client *c, uint64_t now)
{
        HttpResponse r = { 0 };

        s->cfg->handler(&c->req, &r, s->cfg->userdata);
        if (r.status) {
                respond(c, r.status, r.content_type, r.body, now);
                return;
        }
        http_body_unref(r.body);
        c->state = CLIENT_WAITING;
        /* Never without a time to ask again. The handler's deadline (a scrape's --timeout) may lie
         * past the connection's: it moves, leaving the answer time to be sent. */
        c->retry_at = r.retry_at_ms ? r.retry_at_ms : c->deadline;
        if (c->retry_at + DEADLINE_MS / 2 > c->deadline)
                c->deadline = c->retry_at + DEADLINE_MS / 2;
}

/* The head is complete: "METHOD SP TARGET SP HTTP/1.x", then headers we do not need. */
static void handle_request(Server *s, Client *c, uint64_t now)
{
        const char *line = c->head, *eol = memchr(line, '\n', c->head_len), *sp1, *sp2, *q;
        size_t line_len, target_len;

        /* head_complete() saw an empty line, so eol is not NULL. */
        line_len = (size_t)(eol - line);
        if (line_len && line[line_len - 1] == '\r')
                line_len--;
        sp1 = memchr(line, ' ', line_len);
        sp2 = sp1 ? memchr(sp1 + 1, ' ', line_len - (size_t)(sp1 + 1 - line)) : NULL;
        if (!sp1 || !sp2 || sp1 - line > 15 || sp1[1] != '/' ||
            !((line + line_len - sp2 - 1 == 8) &&
              (memcmp(sp2 + 1, "HTTP/1.1", 8) == 0 || memcmp(sp2 + 1, "HTTP/1.0", 8) == 0))) {
                respond_text(c, 400, "not an HTTP/1.x request\n", now);
                return;
        }
        target_len = (size_t)(sp2 - sp1 - 1);
        if (target_len > TARGET_MAX) {
                respond_text(c, 414, "the path is longer than 1024 bytes\n", now);
                return;
        }
        c->head_only = sp1 - line == 4 && memcmp(line, "HEAD", 4) == 0;
        if (!c->head_only && !(sp1 - line == 3 && memcmp(line, "GET", 3) == 0)) {
                respond_text(c, 405, "only GET and HEAD\n", now);
                return;
        }
        /* The query is ignored: the one resource is the metrics page, and keeping it out of the
         * path means "/metrics?x" is not a 404. */
        q = memchr(sp1 + 1, '?', target_len);
        if (q)
                target_len = (size_t)(q - sp1 - 1);
        memcpy(c->path, sp1 + 1, target_len);
        c->path[target_len] = 0;
        c->req = (HttpRequest){ .path = c->path, .arrived_ms = now };
        client_ask(s, c, now);
}

/* Bare "\n\n" too: curl and Prometheus send CRLF, but a hand-typed request (nc) may not, and
 * there is nothing to gain from refusing it. */
static bool head_complete(const Client *c)
{
        return memmem(c->head, c->head_len, "\r\n\r\n", 4) || memmem(c->head, c->head_len, "\n\n", 2);
}

static void client_read(Server *s, Client *c, uint64_t now)
{
        ssize_t n = recv(c->fd, c->head + c->head_len, HEAD_MAX - c->head_len, MSG_DONTWAIT);

        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        if (n <= 0) {
                client_close(c);
                return;
        }
        c->head_len += (size_t)n;
        c->head[c->head_len] = 0;
        if (head_complete(c))
                handle_request(s, c, now);
        else if (c->head_len == HEAD_MAX)
                /* A first line that fills the whole head is an over-long path. */
                respond_text(c, memchr(c->head, '\n', c->head_len) ? 431 : 414, "request head too large\n", now);
}

static void client_write(Client *c)
{
        for (;;) {
                size_t body_len = c->body ? c->body->len : 0;
                const char *p;
                size_t left;
                ssize_t n;

                /* Connection: close, so the end of the response is the end of the stream; SHUT_WR
                 * sends the FIN before close, so the client sees all of it. */
                if (c->off == c->hdr_len + body_len) {
                        shutdown(c->fd, SHUT_WR);
                        client_close(c);
                        return;
                }
                p = c->off < c->hdr_len ? c->hdr + c->off : c->body->data + (c->off - c->hdr_len);
                left = c->off < c->hdr_len ? c->hdr_len - c->off : c->hdr_len + body_len - c->off;
                n = send(c->fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                        return;
                if (n < 0) {
                        client_close(c);
                        return;
                }
                c->off += (size_t)n;
        }
}

/* ---- who gets a slot ---- */

/* Whose a connection is: an IPv4 address (as ff:ff:ff:ff:A:B:C:D, which no IPv6 /64 is), or an
 * IPv6 address's /64, which one host easily has whole. */
static void addr_key(const struct sockaddr_storage *ss, uint8_t key[8])
{
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)ss)->sin6_addr;

        memset(key, 0, 8);
        if (ss->ss_family == AF_INET6 && !IN6_IS_ADDR_V4MAPPED(a6)) {
                memcpy(key, a6->s6_addr, 8);
                return;
        }
        memset(key, 0xff, 4);
        if (ss->ss_family == AF_INET6)
                memcpy(key + 4, &a6->s6_addr[12], 4);
        else if (ss->ss_family == AF_INET)
                memcpy(key + 4, &((const struct sockaddr_in *)ss)->sin_addr, 4);
}

/* The connection to give up for a newcomer (among those of key, or all with key NULL): the one
 * waiting longest for its head, else the one reading its answer longest past HEAD_TIMEOUT_MS.
 * Never one waiting for its answer: that ends by itself within the scrape deadline. */
static Client *evictable(Server *s, const uint8_t *key, uint64_t now)
{
        Client *idle = NULL, *slow = NULL;

        for (int i = 0; i < MAX_CLIENTS; i++) {
                Client *c = &s->clients[i];

                if (c->state == CLIENT_FREE || (key && memcmp(c->addr, key, 8) != 0))
                        continue;
                if (c->state == CLIENT_READING && (!idle || c->accepted < idle->accepted))
                        idle = c;
                if (c->state == CLIENT_WRITING && now - c->writing_since >= HEAD_TIMEOUT_MS &&
                    (!slow || c->writing_since < slow->writing_since))
                        slow = c;
        }
        return idle ? idle : slow;
}

/* A fixed array of MAX_CLIENTS: no allocation per connection, and a linear scan of 64 is cheaper
 * than any structure that would index it. */
static Client *free_slot(Server *s)
{
        for (int i = 0; i < MAX_CLIENTS; i++)
                if (s->clients[i].state == CLIENT_FREE)
                        return &s->clients[i];
        return NULL;
}

/* Takes one connection from the listener: 1, 0 when there was none, or -errno. */
static int accept_one(Server *s, uint64_t now)
{
        struct sockaddr_storage ss = { 0 };
        socklen_t len = sizeof(ss);
        uint8_t key[8];
        Client *c, *victim;
        unsigned same = 0;
        int fd = accept4(s->cfg->listen_fd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);

        if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
                /* Out of fds or memory: the listener stays readable, so look again a little later
                 * rather than spin; closing idle connections meanwhile makes room. */
                s->accept_paused_until = now + 100;
                return 0;
        }
        if (fd < 0)
                return errno == EAGAIN || errno == EINTR || errno == ECONNABORTED ? 0 : -errno;
        addr_key(&ss, key);
        for (int i = 0; i < MAX_CLIENTS; i++)
                same += s->clients[i].state != CLIENT_FREE && memcmp(s->clients[i].addr, key, 8) == 0;
        victim = same >= PER_ADDRESS_MAX ? evictable(s, key, now) : NULL;
        if (same >= PER_ADDRESS_MAX && !victim) {
                close(fd); /* this address's connections all wait for answers already */
                return 1;
        }
        if (victim)
                client_close(victim);
        c = free_slot(s);
        if (!c && (victim = evictable(s, NULL, now)))
                client_close(victim), c = victim;
        if (!c) {
                close(fd);
                return 1;
        }
        *c = (Client){ .state = CLIENT_READING, .fd = fd, .accepted = now, .head_deadline = now + HEAD_TIMEOUT_MS,
                       .deadline = now + DEADLINE_MS };
        memcpy(c->addr, key, 8);
        /* A scraper's request is usually there already: read it now, and the connection is no
         * longer idle (nor evictable) before the next newcomer comes. */
        client_read(s, c, now);
        return 1;
}

/* ---- the loop ---- */

/* The wake fd is an eventfd the sampler writes when a sample is in: reading it to
 * empty re-arms it, and woken makes this round ask every waiting connection again. */
static void drain_wake(Server *s)
{
        uint64_t v;

        while (read(s->cfg->wake_fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
                ;
        s->woken = true;
}

/* Deadlines and pending answers: closes what ran out of time, asks the handler again where it may
 * have an answer now; returns how long the loop may sleep. */
static int housekeeping(Server *s, uint64_t now)
{
        uint64_t next = now + TICK_MS;

        for (int i = 0; i < MAX_CLIENTS; i++) {
                Client *c = &s->clients[i];

                if (c->state == CLIENT_FREE)
                        continue;
                if (now >= c->deadline || (c->state == CLIENT_READING && now >= c->head_deadline)) {
                        client_close(c);
                        continue;
                }
                if (c->state == CLIENT_WAITING && (s->woken || now >= c->retry_at))
                        client_ask(s, c, now);
                if (c->state == CLIENT_FREE)
                        continue;
                if (c->deadline < next)
                        next = c->deadline;
                if (c->state == CLIENT_READING && c->head_deadline < next)
                        next = c->head_deadline;
                if (c->state == CLIENT_WAITING && c->retry_at < next)
                        next = c->retry_at;
        }
        s->woken = false;
        return next > now ? (int)(next - now) : 0;
}

int http_serve(const HttpServerConfig *cfg, volatile sig_atomic_t *stop)
{
        Server *s = calloc(1, sizeof(*s));
        int r = 0;

        if (!s) {
                close(cfg->listen_fd);
                return -ENOMEM;
        }
        s->cfg = cfg;
        for (int i = 0; i < MAX_CLIENTS; i++)
                s->clients[i].fd = -1;
        while (!*stop) {
                struct pollfd pfd[MAX_CLIENTS + 2];
                int map[MAX_CLIENTS + 2], n = 0, timeout = housekeeping(s, monotonic_ms());
                uint64_t now;

                /* While accepting is paused the listener is left out of the poll (it would stay
                 * readable and spin), and the wait is capped so the pause ends on time. */
                if (monotonic_ms() >= s->accept_paused_until) {
                        pfd[n] = (struct pollfd){ cfg->listen_fd, POLLIN, 0 };
                        map[n++] = -1;
                } else if (timeout > 100) {
                        timeout = 100;
                }
                if (cfg->wake_fd >= 0) {
                        pfd[n] = (struct pollfd){ cfg->wake_fd, POLLIN, 0 };
                        map[n++] = -2;
                }
                for (int i = 0; i < MAX_CLIENTS; i++) {
                        Client *c = &s->clients[i];

                        if (c->state == CLIENT_READING || c->state == CLIENT_WRITING) {
                                pfd[n] = (struct pollfd){ c->fd, c->state == CLIENT_READING ? POLLIN : POLLOUT, 0 };
                                map[n++] = i;
                        }
                }
                if (poll(pfd, (nfds_t)n, timeout) < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        break;
                }
                now = monotonic_ms();
                for (int k = 0; k < n; k++) {
                        Client *c = map[k] >= 0 ? &s->clients[map[k]] : NULL;

                        if (!pfd[k].revents)
                                continue;
                        if (map[k] == -2) {
                                drain_wake(s);
                        } else if (map[k] == -1) {
                                if (pfd[k].revents & (POLLERR | POLLNVAL)) {
                                        r = -EIO;
                                        goto out;
                                }
                                for (int a = 0; a < ACCEPT_BATCH; a++) {
                                        r = accept_one(s, now);
                                        if (r < 0)
                                                goto out;
                                        if (r == 0)
                                                break;
                                }
                                r = 0;
                        } else if (c->state == CLIENT_READING) {
                                client_read(s, c, now);
                        } else if (c->state == CLIENT_WRITING) {
                                client_write(c);
                        }
                }
        }
out:
        for (int i = 0; i < MAX_CLIENTS; i++)
                if (s->clients[i].state != CLIENT_FREE)
                        client_close(&s->clients[i]);
        free(s);
        close(cfg->listen_fd);
        return r;
}
