/* A connection's life: finding and opening the socket, the hello, reconnecting after the broker
 * restarts or drops us, and closing. It is also where a connection is put together: the transport's
 * hooks are installed here, and a reconnect's restore runs in order (own buffers, then held
 * references, subscriptions, rings), so that a request interrupted by the loss is sent again once
 * everything it may refer to is registered: the caller sees only a RECONNECTED event. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "identity.h"
#include "internal.h"
#include "macro.h"

/* Why the last gpuipc_connect() of this thread failed: the connection is gone by then. Per thread,
 * so two threads connecting at once each read their own reason. */
static __thread char connect_errmsg[PROTO_MAX_TEXT + 1];

_public_ const char *gpuipc_errmsg(const gpuipc_t *c)
{
        return c ? c->errmsg : connect_errmsg;
}

/* Whether path exists as something other than a socket; what it is, in words, into what. */
static bool path_is_not_socket(const char *path, char *what, size_t cap)
{
        struct stat st;

        if (stat(path, &st) < 0 || S_ISSOCK(st.st_mode))
                return false;
        snprintf(what, cap, "%s", S_ISREG(st.st_mode) ? "a regular file" : S_ISDIR(st.st_mode) ? "a directory" :
                                  S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or other file");
        return true;
}

static int open_socket(gpuipc_t *c, int timeout_ms)
{
        uint64_t deadline = client_deadline(timeout_ms);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        char what[32];

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
                        client_forget_abandoned(c); /* a new connection: the old one's replies never come */
                        client_watch_socket(c);
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
                /* connect(2) says "refused" for a file that is no socket at all: that never gets
                 * better by waiting, and "refused" would send the reader looking for a broker. */
                if (err == ECONNREFUSED && path_is_not_socket(c->path, what, sizeof(what))) {
                        client_errmsg(c, "%s is not a socket (%s): point GPUIPC_SOCKET or the socket option at the "
                                      "broker's socket", c->path, what);
                        return GPUIPC_E_NO_BROKER;
                }
                /* ENOENT (no socket yet), ECONNREFUSED (a stale socket, broker restarting) and
                 * EAGAIN (a full backlog) may end by themselves: those are waited through. */
                if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) {
                        client_errmsg(c, "cannot connect to %s: %s", c->path, strerror(err));
                        return -err;
                }
                if (client_remaining_ms(deadline) == 0) {
                        client_errmsg(c, "nothing listens on %s (%s); is gpuipc-broker running, and is its socket "
                                      "directory mounted into this container at that path?", c->path, strerror(err));
                        return GPUIPC_E_NO_BROKER;
                }
                /* A plain sleep: there is no connection to wait on yet, and a socket file appearing
                 * gives no event a poll could see. */
                usleep(CLIENT_RETRY_MS * 1000);
        }
}

static int say_hello(gpuipc_t *c)
{
        uint64_t shm_dev, shm_ino;
        Frame f = { .fd = -1 };
        ProtoMsg req;
        int r;

        proto_request_init(&req, PROTO_OP_HELLO);
        proto_set_version(&req, PROTO_VERSION);
        proto_set_pid(&req, (uint64_t)getpid());
        proto_set_pidns(&req, c->pidns);
        if (ipc_shm_identity(&shm_dev, &shm_ino) == 0) {
                proto_set_shm_dev(&req, shm_dev);
                proto_set_shm_ino(&req, shm_ino);
        }
        proto_set_label(&req, proto_str(c->label));
        proto_set_gpus(&req, c->gpus, c->n_gpus);
        /* A caller that bounds connecting bounds the greeting too: a stopped broker accepts (the
         * kernel queues the connection) but never answers. */
        r = client_request(c, &req, -1, c->connect_timeout_ms > 0 ? c->connect_timeout_ms : 10000, &f);
        if (r < 0)
                return r;
        /* Kept for gpuipc_connection_info: a new epoch after a reconnect tells the caller that the
         * broker restarted, not just dropped the connection. */
        c->peer_id = f.msg.peer;
        c->pidns_same = f.msg.pidns_same;
        c->epoch = f.msg.epoch;
        frame_free(&f);
        return 0;
}

/* Registers again, with the broker we reconnected to, everything this connection had: own buffers
 * first (so that reclaims of our own consumers find them), held references, subscriptions, rings;
 * then tells the caller. 0, or GPUIPC_E_DISCONNECTED if the broker was lost again. */
static int restore(gpuipc_t *c)
{
        gpuipc_event_t ev = { .type = GPUIPC_EVENT_RECONNECTED };
        int r = buffer_after_reconnect(c);

        if (r == 0)
                r = client_resubscribe(c);
        if (r == 0)
                r = ring_after_reconnect(c);
        if (r < 0)
                return r;
        client_queue_event(c, &ev);
        return 0;
}

static int reconnect(gpuipc_t *c, int timeout_ms)
{
        uint64_t deadline = client_deadline(timeout_ms);
        int r;

        for (;;) {
                c->broken = false;
                c->restoring = true;
                r = open_socket(c, client_remaining_ms(deadline));
                if (r == 0)
                        r = say_hello(c);
                if (r == 0)
                        r = restore(c);
                c->restoring = false;
                if (r == 0)
                        return 0;
                client_mark_broken(c);
                /* A broker that is being killed still accepts for a moment, then drops what it
                 * accepted; a restarting one is not there yet. Either way: try again in time. */
                if (r != GPUIPC_E_DISCONNECTED || client_remaining_ms(deadline) == 0)
                        return r;
                usleep(CLIENT_RETRY_MS * 1000);
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

/* What a request the caller was told had failed (no reply in time) did after all is undone, where it
 * left something behind. The others: release, unmap, retire and free are what a retry would do too;
 * a ring's create or join was undone when it timed out (ring_undo), and its late reply's fds are
 * closed with it. */
static void route_late_reply(gpuipc_t *c, ProtoOp op, const ProtoMsg *reply, bool with_fd)
{
        if (reply->status != PROTO_STATUS_OK)
                return;
        switch (op) {
        case PROTO_OP_ATTACH: buffer_on_late_attach(c, reply, with_fd); break;
        case PROTO_OP_PUBLISH: buffer_on_late_publish(c, reply); break;
        case PROTO_OP_SUBSCRIBE: events_on_late_subscribe(c, reply); break;
        default: break;
        }
}

/* Broker events go to whoever keeps the state they are about: rings their members, buffers the rest. */
static void route_event(gpuipc_t *c, const ProtoMsg *ev)
{
        if (ev->event == PROTO_EV_MEMBER_JOINED || ev->event == PROTO_EV_MEMBER_LEFT)
                ring_on_event(c, ev);
        else
                buffer_on_event(c, ev);
}

/* Recursive: a public call may make others (a ring allocates its parts with gpuipc_buffer_alloc). */
static void lock_init(pthread_mutex_t *lock)
{
        pthread_mutexattr_t a;

        pthread_mutexattr_init(&a);
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(lock, &a);
        pthread_mutexattr_destroy(&a);
}

_public_ int gpuipc_connect(gpuipc_t **ret, const gpuipc_options_t *opts)
{
        gpuipc_options_t o;
        const char *path;
        size_t max_idle;
        gpuipc_t *c;
        int r;

        if (!ret)
                return -EINVAL;
        connect_errmsg[0] = 0;
        if (client_copy_options(&o, sizeof(o), opts) < 0) {
                snprintf(connect_errmsg, sizeof(connect_errmsg), "gpuipc_options_t.struct_size is 0: set it to "
                         "sizeof(gpuipc_options_t)");
                return GPUIPC_E_INVALID;
        }
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
        list_init(&c->pools);
        list_init(&c->idle);
        c->fd = c->retry_timer = c->watch_epfd = c->news_fd = -1;
        c->hooks = (ClientHooks){ .event = route_event, .late_reply = route_late_reply, .reconnect = reconnect,
                                  .after_events = ring_after_events };
        lock_init(&c->lock);
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
        c->reconnect = !o.no_reconnect;
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

/* Ends c: with release_memory, as gpuipc_close says; without, as gpuipc_abandon does. */
static void close_connection(gpuipc_t *c, bool release_memory)
{
        /* First, and without the lock, which the thread may be waiting for: nobody else uses c now. */
        ring_thread_stop(c);
        if (release_memory) {
                ring_close_all(c);
                buffer_close_all(c); /* views first: their pools' segments go after them */
                pool_close_all(c);
        } else {
                ring_abandon_all(c);
                buffer_abandon_all(c);
                pool_abandon_all(c);
        }
        while (!list_empty(&c->subs)) {
                Subscription *s = list_entry(c->subs.next, Subscription, link);
                list_unlink(&s->link);
                free(s);
        }
        safe_close(c->fd);
        safe_close(c->retry_timer);
        safe_close(c->epfd);
        safe_close(c->watch_epfd);
        safe_close(c->news_fd);
        free(c->path);
        hmap_deinit(&c->maps_by_id);
        free(c->abandoned);
        free(c->events);
        free(c->rbuf);
        proto_buf_free(&c->wbuf);
        proto_buf_free(&c->nbuf);
        pthread_mutex_destroy(&c->lock);
        free(c);
}

_public_ void gpuipc_close(gpuipc_t *c)
{
        if (c)
                close_connection(c, true);
}

_public_ void gpuipc_abandon(gpuipc_t *c)
{
        if (c)
                close_connection(c, false);
}

_public_ int gpuipc_ping(gpuipc_t *c, int timeout_ms)
{
        Frame f = { .fd = -1 };
        ProtoMsg req;
        int r;

        CLIENT_LOCKED(c);
        proto_request_init(&req, PROTO_OP_PING);
        r = client_request(c, &req, -1, timeout_ms, &f);
        if (r == 0)
                frame_free(&f);
        return r;
}
