/* The metrics exporter's HTTP server; see http.h. Each connection reads one request head (at most
 * HEAD_MAX bytes within DEADLINE_MS), gets one response, and is closed. What it must never do: let
 * one client hold the others up (every socket is non-blocking, every connection has a deadline, at
 * most MAX_CLIENTS at once), or read a request body: nothing here takes input beyond a path. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Scrapers and probes come now and then: 16 at once is plenty, and while every slot is taken the
 * listener is not polled, so the next connection waits in the kernel's backlog and costs us nothing. */
#define MAX_CLIENTS 16
#define HEAD_MAX 8192       /* request line and headers; Prometheus sends a few hundred bytes */
#define DEADLINE_MS 10000   /* a connection's whole life: request, handling, response */
#define TICK_MS 1000        /* how often the loop looks at *stop even without a signal */

typedef struct Client {
        int fd;             /* -1: a free slot */
        uint64_t deadline;
        char head[HEAD_MAX + 1];
        size_t head_len;
        char *out;          /* the response, once there is one */
        size_t out_len, out_off;
} Client;

static uint64_t now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
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
        if (n >= cap || !colon[1])
                return -EINVAL;
        memcpy(host, spec, n);
        host[n] = 0;
        *port = colon + 1;
        for (const char *p = *port; *p; p++)
                if (*p < '0' || *p > '9')
                        return -EINVAL;
        return strtol(*port, NULL, 10) > 65535 ? -EINVAL : 0;
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

        if (split_spec(spec, host, sizeof(host), &port) < 0) {
                *why = "expected HOST:PORT, [IPv6]:PORT or :PORT with a port from 0 to 65535";
                return -EINVAL;
        }
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
                setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
                if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0)
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

/* ---- serving ---- */

static const char *reason_phrase(int status)
{
        switch (status) {
        case 200: return "OK";
        case 400: return "Bad Request";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 408: return "Request Timeout";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        case 503: return "Service Unavailable";
        }
        return "Unknown";
}

static void client_close(Client *c)
{
        if (c->fd >= 0)
                close(c->fd);
        free(c->out);
        c->fd = -1;
        c->out = NULL;
}

/* Builds the response: status line, headers, and (unless HEAD) the body. */
static void respond(Client *c, int status, const char *content_type, const char *body, size_t len, bool head_only)
{
        char hdr[512];
        int n = snprintf(hdr, sizeof(hdr),
                         "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                         status, reason_phrase(status), content_type, len, status == 405 ? "Allow: GET, HEAD\r\n" : "");
        size_t body_len = head_only ? 0 : len;

        c->out = malloc((size_t)n + body_len);
        if (!c->out) {
                client_close(c);
                return;
        }
        memcpy(c->out, hdr, (size_t)n);
        if (body_len)
                memcpy(c->out + n, body, body_len);
        c->out_len = (size_t)n + body_len;
        c->out_off = 0;
}

static void respond_text(Client *c, int status, const char *text)
{
        respond(c, status, "text/plain; charset=utf-8", text, strlen(text), false);
}

/* The head is complete: "METHOD SP TARGET SP HTTP/1.x". */
static void handle_request(Client *c, HttpHandler handler, void *ud)
{
        char method[16], target[1024], version[16], *q;
        HttpResponse r = { 0 };
        bool head_only;

        if (sscanf(c->head, "%15s %1023s %15s", method, target, version) != 3 || target[0] != '/' ||
            (strcmp(version, "HTTP/1.1") != 0 && strcmp(version, "HTTP/1.0") != 0)) {
                respond_text(c, 400, "not an HTTP/1.x request\n");
                return;
        }
        head_only = strcmp(method, "HEAD") == 0;
        if (!head_only && strcmp(method, "GET") != 0) {
                respond_text(c, 405, "only GET and HEAD\n");
                return;
        }
        q = strchr(target, '?');
        if (q)
                *q = 0;
        handler(target, &r, ud);
        if (!r.body && r.len) {
                respond_text(c, 500, "out of memory\n");
                return;
        }
        respond(c, r.status, r.content_type ? r.content_type : "text/plain; charset=utf-8", r.body ? r.body : "",
                r.len, head_only);
        free(r.body);
}

static void client_read(Client *c, HttpHandler handler, void *ud)
{
        ssize_t n = recv(c->fd, c->head + c->head_len, HEAD_MAX - c->head_len, 0);

        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        if (n <= 0) {
                client_close(c);
                return;
        }
        c->head_len += (size_t)n;
        c->head[c->head_len] = 0;
        if (strstr(c->head, "\r\n\r\n") || strstr(c->head, "\n\n"))
                handle_request(c, handler, ud);
        else if (c->head_len == HEAD_MAX)
                respond_text(c, 431, "request head too large\n");
}

static void client_write(Client *c)
{
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);

        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return;
        if (n < 0) {
                client_close(c);
                return;
        }
        c->out_off += (size_t)n;
        if (c->out_off == c->out_len) {
                shutdown(c->fd, SHUT_WR);
                client_close(c);
        }
}

static void accept_one(int fd, Client *clients)
{
        int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

        if (cfd < 0)
                return;
        for (int i = 0; i < MAX_CLIENTS; i++) {
                if (clients[i].fd < 0) {
                        clients[i] = (Client){ .fd = cfd, .deadline = now_ms() + DEADLINE_MS };
                        return;
                }
        }
        close(cfd); /* cannot happen: the listener is not polled while every slot is taken */
}

int http_serve(int fd, HttpHandler handler, void *ud, volatile sig_atomic_t *stop)
{
        Client *clients = calloc(MAX_CLIENTS, sizeof(*clients));
        int r = 0;

        if (!clients) {
                close(fd);
                return -ENOMEM;
        }
        for (int i = 0; i < MAX_CLIENTS; i++)
                clients[i].fd = -1;
        while (!*stop) {
                struct pollfd pfd[MAX_CLIENTS + 1];
                int map[MAX_CLIENTS + 1], n = 0, busy = 0, timeout = TICK_MS;
                uint64_t now = now_ms();

                for (int i = 0; i < MAX_CLIENTS; i++) {
                        Client *c = &clients[i];
                        if (c->fd < 0)
                                continue;
                        if (now >= c->deadline) {
                                client_close(c);
                                continue;
                        }
                        busy++;
                        timeout = (int)(c->deadline - now < (uint64_t)timeout ? c->deadline - now : (uint64_t)timeout);
                        pfd[n] = (struct pollfd){ c->fd, c->out ? POLLOUT : POLLIN, 0 };
                        map[n++] = i;
                }
                if (busy < MAX_CLIENTS) {
                        pfd[n] = (struct pollfd){ fd, POLLIN, 0 };
                        map[n++] = -1;
                }
                if (poll(pfd, (nfds_t)n, timeout) < 0) {
                        if (errno == EINTR)
                                continue;
                        r = -errno;
                        break;
                }
                for (int k = 0; k < n; k++) {
                        if (!pfd[k].revents)
                                continue;
                        if (map[k] < 0) {
                                if (pfd[k].revents & (POLLERR | POLLNVAL)) {
                                        r = -EIO;
                                        goto out;
                                }
                                accept_one(fd, clients);
                        } else if (pfd[k].revents & (POLLERR | POLLNVAL)) {
                                client_close(&clients[map[k]]);
                        } else if (clients[map[k]].out) {
                                client_write(&clients[map[k]]);
                        } else {
                                client_read(&clients[map[k]], handler, ud);
                        }
                }
        }
out:
        for (int i = 0; i < MAX_CLIENTS; i++)
                client_close(&clients[i]);
        free(clients);
        close(fd);
        return r;
}
