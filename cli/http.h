/* A deliberately small HTTP/1.1 server for `gpuipcctl metrics --listen`: GET and HEAD only, one
 * response per connection (Connection: close), requests bounded in size and time, a bounded number
 * of connections, none of which an idle, slow or greedy client can keep from others: the request
 * head must be complete within a few seconds, a full server makes room by closing the connection
 * that has been idle (or slow to read its answer) longest, and one address holds at most a quarter
 * of the connections. Everything is non-blocking and the handler never blocks either: an answer
 * that is not ready yet (a scrape waiting for the broker) is asked for again when the wake fd says
 * so, or at the time the handler named. */
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
        const char *path;    /* the target without its query string */
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
        int listen_fd;       /* from http_listen; http_serve closes it */
        HttpHandler handler;
        void *userdata;
        int wake_fd;         /* -1, or a non-blocking eventfd that becomes readable when a pending
                              * answer may be ready (the server reads it) */
} HttpServerConfig;

/* Checks "HOST:PORT" / "[IPv6]:PORT" / ":PORT" without resolving anything: 0, or -EINVAL with *why
 * saying what is expected. */
int http_check_spec(const char *spec, const char **why);

/* Binds and listens on "HOST:PORT": an IPv4 address, "[IPv6]", a name from /etc/hosts, or nothing
 * before the colon for every address. Returns the listening fd or a negative errno (with *why
 * naming the problem); ret_bound receives "ADDRESS:PORT" as bound (port 0 picks one). */
int http_listen(const char *spec, char *ret_bound, size_t cap, const char **why);

/* Serves until *stop becomes non-zero (a signal handler sets it). Returns 0, or a negative errno
 * when the listening socket fails. Closes the listening fd. */
int http_serve(const HttpServerConfig *cfg, volatile sig_atomic_t *stop);
