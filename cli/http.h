/* The HTTP side of `gpuipcctl metrics --listen`, on libmicrohttpd (loaded when the exporter starts,
 * so that gpuipcctl's other commands need libc alone): GET and HEAD only, one response per
 * connection (Connection: close). libmicrohttpd parses the requests and holds the connections within
 * its limits: 64 at once, 16 of one address, an 8 KiB request head (past it, 414 or 431), 3 s without
 * a byte. What it does not do is done here: a request head must be complete 3 s after the
 * connection was accepted however slowly it trickles in, an answer must be sent within 10 s, and an
 * address (or the server) that reaches its limit makes room by closing its connection that has
 * waited longest for its head (or been slowest to read its answer), so that idle clients cannot
 * lock a scraper out. The handler never blocks: an answer that is not ready yet (a scrape waiting
 * for the broker) is asked for again when the wake fd says so, or at the time the handler named,
 * its connection suspended meanwhile. */
#pragma once

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A response body that several responses may share (the exporter renders one per sample, however
 * many scrapes it answers): reference counted, from any thread. */
typedef struct HttpBody HttpBody;

/* A body holding a copy of len bytes of data; NULL without memory. */
HttpBody *http_body_new(const void *data, size_t len);
HttpBody *http_body_ref(HttpBody *b);
/* Drops a reference (NULL is fine); frees the body with the last one. Returns NULL. */
HttpBody *http_body_unref(HttpBody *b);

typedef struct HttpRequest {
        const char *path;    /* the target without its query string, percent-decoded */
        uint64_t arrived_ms; /* when its head was complete (CLOCK_MONOTONIC) */
        uint64_t note;       /* the handler's own: 0 at the first call, then whatever it left there */
} HttpRequest;

typedef struct HttpResponse {
        int status;               /* 200, 404, 503, ...; 0: no answer yet (see retry_at_ms) */
        uint64_t retry_at_ms;     /* with status 0: ask again at this time (CLOCK_MONOTONIC) at the
                                   * latest, or when the wake fd becomes readable */
        const char *content_type; /* NULL: text/plain */
        HttpBody *body;           /* the server takes this reference; NULL: empty */
} HttpResponse;

/* Answers req into *ret (zeroed by the caller), without blocking. Called again for the same request
 * (same note) until it sets a status. */
typedef void (*HttpHandler)(HttpRequest *req, HttpResponse *ret, void *userdata);

typedef struct HttpServerConfig {
        int listen_fd;       /* from http_listen; http_server_new takes it (closed on failure too) */
        HttpHandler handler;
        void *userdata;
        int wake_fd;         /* -1, or a non-blocking eventfd that becomes readable when a pending
                              * answer may be ready (the server reads it; the caller closes it) */
} HttpServerConfig;

/* Checks "HOST:PORT" / "[IPv6]:PORT" / ":PORT" without resolving anything: 0, or -EINVAL with *why
 * saying what is expected. */
int http_check_spec(const char *spec, const char **why);

/* Binds and listens on "HOST:PORT": an IPv4 address, "[IPv6]", a name from /etc/hosts, or nothing
 * before the colon for every address. Returns the listening fd or a negative errno (with *why
 * naming the problem); ret_bound receives "ADDRESS:PORT" as bound (port 0 picks one). */
int http_listen(const char *spec, char *ret_bound, size_t cap, const char **why);

typedef struct HttpServer HttpServer;

/* Loads libmicrohttpd and starts its daemon on cfg->listen_fd, without serving yet: call it before
 * the process is confined (it opens the library, an epoll fd and an eventfd). 0, or a negative
 * errno with *why naming what failed. cfg must outlive the server. */
int http_server_new(HttpServer **ret, const HttpServerConfig *cfg, const char **why);

/* Serves until *stop becomes non-zero (a signal handler sets it). Returns 0, or a negative errno
 * when the server fails. */
int http_server_run(HttpServer *s, volatile sig_atomic_t *stop);

/* Stops the daemon (closing its connections and the listening fd) and frees the server; NULL is
 * fine. Returns NULL. */
HttpServer *http_server_free(HttpServer *s);
