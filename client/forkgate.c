/* The library's own threads (a connection's ring thread, a ring fd's helper) and fork(2).
 *
 * A process that forks without exec gets a child with one thread and a copy of every lock as it was
 * at that instant: a lock another thread held then stays held in the child for good. The C library
 * takes its own allocator's locks around fork, but not every allocator does; AddressSanitizer's
 * (GCC 12) does not, so a thread of ours caught inside it, starting (the runtime sets a new thread
 * up with allocations before our code runs), working or ending, left the child hung at its first
 * allocation of that size class: a forked ring member that never joined, or never got through
 * gpuipc_close. The caller cannot see our threads, let alone wait for them; the gate does.
 *
 * A thread of ours passes the gate (forkgate_enter) before it does anything but sleep: its work
 * under the connection's lock, and its start and end, which its creator and its joiner pass for it
 * (the runtime's share of a thread's life lies outside the thread's own code). fork waits in a
 * pthread_atfork handler until no thread of ours is past the gate, and keeps the gate shut until it
 * returns. What a thread of ours does outside the gate (poll, read an eventfd, wait for a lock,
 * futex waits on a ring's doorbell) allocates nothing. Threads wait at the gate only while a fork
 * is under way, and a fork waits only for work that is bounded (requests have deadlines): never
 * for a caller's call, however long that blocks. */
#include <pthread.h>
#include <stdbool.h>

#include "internal.h"

static pthread_once_t gate_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_changed = PTHREAD_COND_INITIALIZER; /* passed drops to 0, or a fork ended */
static unsigned passed;  /* threads of ours past the gate (starting, working, ending) */
static bool forking;     /* a fork is waiting for them, or under way: nobody passes */

static void before_fork(void)
{
        /* Held until the fork is over: in the child it is the one thread's, which lets go of it. */
        pthread_mutex_lock(&gate_lock);
        forking = true;
        while (passed)
                pthread_cond_wait(&gate_changed, &gate_lock);
}

static void after_fork_in_parent(void)
{
        forking = false;
        pthread_cond_broadcast(&gate_changed);
        pthread_mutex_unlock(&gate_lock);
}

/* The child has none of our threads, nor anyone waiting at the gate: a fresh gate. */
static void after_fork_in_child(void)
{
        passed = 0;
        forking = false;
        gate_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        gate_changed = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
}

static void gate_install(void)
{
        (void)pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

void forkgate_enter(void)
{
        pthread_once(&gate_once, gate_install);
        pthread_mutex_lock(&gate_lock);
        while (forking)
                pthread_cond_wait(&gate_changed, &gate_lock);
        passed++;
        pthread_mutex_unlock(&gate_lock);
}

void forkgate_leave(void)
{
        pthread_mutex_lock(&gate_lock);
        if (--passed == 0)
                pthread_cond_broadcast(&gate_changed);
        pthread_mutex_unlock(&gate_lock);
}
