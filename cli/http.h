/* A deliberately small HTTP/1.1 server for `gpuipcctl metrics --listen`: GET and HEAD only, one
 * response per connection (Connection: close), requests bounded in size and time, a bounded number
 * of connections at once. The handler runs on the serving thread and may block (it asks the
 * broker); everything else is non-blocking, so a client that stops reading or sending holds only
 * its own slot, until its deadline. */
#pragma once

#include <signal.h>
#include <stddef.h>

typedef struct HttpResponse {
        int status;               /* 200, 404, 503, ... */
        const char *content_type;
        char *body;               /* malloc'ed; the server frees it */
        size_t len;
} HttpResponse;

/* Fills *ret for a GET of path (the target without its query string). */
typedef void (*HttpHandler)(const char *path, HttpResponse *ret, void *userdata);

/* Binds and listens on "HOST:PORT": an IPv4 address, "[IPv6]", a name from /etc/hosts, or nothing
 * before the colon for every address. Returns the listening fd or a negative errno (with *why
 * naming the problem); ret_bound receives "ADDRESS:PORT" as bound (port 0 picks one). */
int http_listen(const char *spec, char *ret_bound, size_t cap, const char **why);

/* Serves on fd until *stop becomes non-zero (a signal handler sets it). Returns 0, or a negative
 * errno when the listening socket fails. Closes fd. */
int http_serve(int fd, HttpHandler handler, void *userdata, volatile sig_atomic_t *stop);
