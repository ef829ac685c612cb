/* The connection's ring thread: the control plane's own thread, started with the connection's first
 * ring and stopped when it closes. It waits for the broker's socket (and, while the broker is away
 * with reconnect on, the retry timer) and for kicks from the data plane, then, under the connection's
 * lock, reads whatever came (ClientHooks route members joining and leaving to the rings, which seat
 * or unseat them at once) and does what needs requests: renewing seats, telling the broker of
 * evictions, freeing retired counters, reconnecting. So a producer that only acquires and publishes,
 * or a member that only takes, hears of members, deaths and restarts although its ring calls never
 * read the socket.
 *
 * Its messages go to a buffer of its own (client_errmsg_sink), never to gpuipc_errmsg(): its work
 * is nobody's call. Events it reads for the caller are queued as any, and gpuipc_fd() is made
 * readable for them (news_fd), since the caller's event loop no longer sees them arrive. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "internal.h"
#include "macro.h"
#include "ring-internal.h"

struct RingThread {
        pthread_t id;
        int kick;          /* eventfd: the data plane left work, or stop */
        bool stop;
        char errmsg[PROTO_MAX_TEXT + 1];
};

static void *ring_thread_main(void *arg)
{
        gpuipc_t *c = arg;
        RingThread *t = c->ring_thread;

        client_errmsg_sink(t->errmsg);
        (void)pthread_setname_np(pthread_self(), "gpuipc-ring");
        forkgate_leave(); /* started: ring_thread_start passed the gate for the runtime's setup */
        for (;;) {
                struct pollfd p[2] = { { t->kick, POLLIN, 0 }, { c->watch_epfd, POLLIN, 0 } };
                int timeout;
                bool watch;
                uint64_t v;

                client_lock(c);
                /* Without rings there is nothing to read for: the caller's calls read the socket. */
                watch = !list_empty(&c->rings);
                timeout = ring_control_timeout(c);
                client_unlock(c);
                (void)poll(p, watch ? 2 : 1, timeout);
                /* The kick first, then stop: a stop whose kick this read takes is seen here. The
                 * other way round, a stop that came between the look and the read lost its kick,
                 * and the thread slept on for good with ring_thread_stop joining it. */
                (void)!read(t->kick, &v, sizeof(v));
                if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE))
                        break;
                client_lock(c);
                /* Past the gate only with the lock: waiting for it (a caller's call may hold it for
                 * long) must not hold up a fork. */
                forkgate_enter();
                if (!list_empty(&c->rings)) {
                        (void)client_pump(c, 0); /* then ClientHooks.after_events: the control plane's work */
                        if (c->ev_count)
                                client_news(c);
                }
                forkgate_leave();
                client_unlock(c);
        }
        forkgate_enter(); /* ending: ring_thread_stop lets go once the runtime is done with us */
        return NULL;
}

bool ring_thread_is_self(gpuipc_t *c)
{
        return c->ring_thread && pthread_equal(c->ring_thread->id, pthread_self());
}

void ring_thread_kick(gpuipc_t *c)
{
        uint64_t one = 1;

        if (c->ring_thread)
                (void)!write(c->ring_thread->kick, &one, sizeof(one));
}

void ring_control_kick(gpuipc_ring_t *r)
{
        ring_thread_kick(r->conn);
}

int ring_thread_start(gpuipc_t *c)
{
        RingThread *t;
        int e;

        if (c->ring_thread) {
                /* It may sleep without the socket (the connection's rings were all closed): the new
                 * ring's news (members joining, leaving) must be read as it comes, from now on. */
                ring_thread_kick(c);
                return 0;
        }
        e = client_watch_start(c);
        if (e < 0)
                return e;
        t = calloc(1, sizeof(*t));
        if (!t)
                return -ENOMEM;
        t->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (t->kick < 0) {
                e = -errno;
                free(t);
                return e;
        }
        c->ring_thread = t;
        forkgate_enter(); /* for the thread, which leaves once it runs */
        e = -pthread_create(&t->id, NULL, ring_thread_main, c);
        if (e < 0) {
                forkgate_leave();
                c->ring_thread = NULL;
                safe_close(t->kick);
                free(t);
                return e;
        }
        return 0;
}

void ring_thread_stop(gpuipc_t *c)
{
        RingThread *t = c->ring_thread;

        if (!t)
                return;
        __atomic_store_n(&t->stop, true, __ATOMIC_RELEASE);
        ring_thread_kick(c);
        pthread_join(t->id, NULL);
        forkgate_leave(); /* what the thread passed the gate for on its way out */
        c->ring_thread = NULL;
        safe_close(t->kick);
        free(t);
}
