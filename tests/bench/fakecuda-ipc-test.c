/* The stand-in libcuda's legacy IPC between containers, against what the real driver did on an H100
 * (driver 580.159.04, CUDA 13.0): each "container" is a process in a PID namespace of its own (and,
 * where /dev/shm must differ, a mount namespace with a private tmpfs on /dev/shm), a sibling of
 * the other's. Memory handles open across them when the two PIDs differ, are 201 when they are
 * equal (both PID 1), 205 in the exporting process, 400 once the exporter freed the memory or
 * exited; IPC events open across them with one /dev/shm (a record in one process is waited for in
 * the other), and are 205 with a private /dev/shm each, 201 with equal PIDs. Needs root (unshare);
 * exits 77 where namespaces cannot be made. Linked with the stand-in itself. */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

typedef unsigned int Res;
typedef unsigned long long DevPtr;
typedef struct H64 {
        char bytes[64];
} H64;

/* The stand-in's entry points (client/cuda.h has their CUDA signatures). */
Res cuMemAlloc_v2(DevPtr *p, size_t size);
Res cuMemFree_v2(DevPtr p);
Res cuIpcGetMemHandle(H64 *h, DevPtr p);
Res cuIpcOpenMemHandle_v2(DevPtr *p, H64 h, unsigned flags);
Res cuIpcCloseMemHandle(DevPtr p);
Res cuEventCreate(void **e, unsigned flags);
Res cuEventDestroy_v2(void *e);
Res cuEventRecord(void *e, void *s);
Res cuEventQuery(void *e);
Res cuEventSynchronize(void *e);
Res cuIpcGetEventHandle(H64 *h, void *e);
Res cuIpcOpenEventHandle(void **e, H64 h);
Res cuStreamCreate(void **s, unsigned flags);
Res cuStreamDestroy_v2(void *s);
Res cuStreamSynchronize(void *s);
Res cuStreamWaitEvent(void *s, void *e, unsigned flags);
Res cuStreamWaitValue64_v2(void *s, DevPtr addr, uint64_t v, unsigned flags);
Res cuStreamWriteValue64_v2(void *s, DevPtr addr, uint64_t v, unsigned flags);

#define SKIP              77
#define SIZE              (64u << 10)
#define IPC_EVENT_FLAGS   0x6 /* CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING */
#define INVALID_CONTEXT   201u
#define MAP_FAILED_       205u
#define INVALID_HANDLE    400u
#define NOT_READY         600u

#define CHECK(cond, ...)                                                                                     \
        do {                                                                                                 \
                if (!(cond)) {                                                                               \
                        fprintf(stderr, "FAIL %s:%d (pid %d here): %s: ", __FILE__, __LINE__, (int)getpid(), \
                                #cond);                                                                      \
                        fprintf(stderr, __VA_ARGS__);                                                        \
                        fputc('\n', stderr);                                                                 \
                        return 1;                                                                            \
                }                                                                                            \
        } while (0)
#define CHECK_RES(call, want)                                                                                \
        do {                                                                                                 \
                Res r_ = (call);                                                                             \
                CHECK(r_ == (want), "%s returned %u, not %u", #call, r_, (unsigned)(want));                  \
        } while (0)

/* What the exporter sends first: a live allocation's handle and a freed one's; then an IPC
 * event's handle. */
typedef struct Handles {
        H64 mem, freed;
} Handles;

/* One pair of containers: the exporter writes to x2o (and its live handle to x2t, for this test
 * process), the opener to o2x. */
typedef struct Pair {
        int x2o[2], o2x[2], x2t[2];
        bool private_shm; /* each side has a /dev/shm of its own */
        Handles parent;   /* exported by the test process before the fork */
} Pair;

static DevPtr parent_mem;

static void fill(unsigned char *p, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i++)
                p[i] = (unsigned char)(i * 31u + seed);
}

static bool filled(const unsigned char *p, size_t n, unsigned seed)
{
        for (size_t i = 0; i < n; i++)
                if (p[i] != (unsigned char)(i * 31u + seed))
                        return false;
        return true;
}

static bool put(int fd, const void *p, size_t n)
{
        return write(fd, p, n) == (ssize_t)n;
}

static bool get(int fd, void *p, size_t n)
{
        size_t done = 0;

        while (done < n) {
                ssize_t k = read(fd, (char *)p + done, n - done);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0) {
                        fprintf(stderr, "(pid %d here) read: %s\n", (int)getpid(), k ? strerror(errno) : "end of file");
                        return false;
                }
                done += (size_t)k;
        }
        return true;
}

/* The fakecuda-ev-* files in this process's /dev/shm. */
static int event_files(void)
{
        DIR *d = opendir("/dev/shm");
        struct dirent *e;
        int n = 0;

        if (!d)
                return -1;
        while ((e = readdir(d)))
                n += strncmp(e->d_name, "fakecuda-ev-", 12) == 0;
        closedir(d);
        return n;
}

static void on_alarm(int sig)
{
        (void)sig;
        _exit(3);
}

static int wait_status(pid_t pid)
{
        int st;

        while (waitpid(pid, &st, 0) < 0)
                if (errno != EINTR)
                        return 1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Closes the pipe ends a side (and the processes between it and this one) does not use, so that
 * the other sees it gone. */
static void keep_ends(Pair *p, bool exporter)
{
        if (!p)
                return;
        close(p->x2t[0]);
        close(exporter ? p->x2o[0] : p->x2o[1]);
        close(exporter ? p->o2x[1] : p->o2x[0]);
        if (!exporter)
                close(p->x2t[1]);
}

typedef int (*Body)(Pair *p);

/* In a fresh PID namespace: forks until the child has PID want, each process waiting for the next
 * (a namespace dies with its PID 1), and runs body there. */
static int as_pid(int want, Body body, Pair *p)
{
        pid_t c = fork();

        if (c == 0) {
                int r;

                if (getpid() < want) {
                        r = as_pid(want, body, p);
                        if (r)
                                fprintf(stderr, "(pid %d here) PID %d exited %d\n", (int)getpid(), want, r);
                        _exit(r);
                }
                if (getpid() != want)
                        _exit(2);
                signal(SIGALRM, on_alarm); /* PID 1 ignores a signal it has no handler for */
                alarm(60);
                r = body(p);
                /* after a failure, the stand-in's exit handler removes what it left in /dev/shm;
                 * otherwise no exit handlers (LeakSanitizer's cannot see this namespace's threads) */
                if (r)
                        exit(r);
                _exit(0);
        }
        return c < 0 ? 1 : wait_status(c);
}

/* A container: a child of this process that unshares its PID namespace (and, with a private
 * /dev/shm, its mount namespace, where a tmpfs covers /dev/shm) and runs body as PID want. */
static pid_t container(int want, bool private_shm, Body body, Pair *p, bool exporter)
{
        pid_t c = fork();

        if (c != 0)
                return c;
        keep_ends(p, exporter);
        if (unshare(CLONE_NEWPID | (private_shm ? CLONE_NEWNS : 0)) < 0)
                _exit(SKIP);
        /* without this, the tmpfs would propagate back to the parent's namespace */
        if (private_shm && (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
                            mount("fakecuda-test", "/dev/shm", "tmpfs", 0, "mode=1777,size=1m") < 0))
                _exit(SKIP);
        _exit(as_pid(want, body, p));
}

static int probe(Pair *p)
{
        (void)p;
        return 0;
}

/* ---- the two sides ---- */

static int exporter(Pair *p)
{
        Handles h;
        H64 evh;
        DevPtr mem, gone, opened;
        void *ev, *stream;
        uint64_t gate = 0;
        char c;

        CHECK_RES(cuMemAlloc_v2(&mem, SIZE), 0);
        fill((unsigned char *)(uintptr_t)mem, SIZE, 7);
        CHECK_RES(cuIpcGetMemHandle(&h.mem, mem), 0);
        CHECK_RES(cuIpcOpenMemHandle_v2(&opened, h.mem, 1), MAP_FAILED_);
        /* forked from the test process, this one serves its own handles, not the parent's */
        CHECK_RES(cuIpcOpenMemHandle_v2(&opened, p->parent.mem, 1), 0);
        CHECK(filled((unsigned char *)(uintptr_t)opened, SIZE, 1), "the parent's bytes");
        CHECK_RES(cuIpcCloseMemHandle(opened), 0);
        CHECK_RES(cuMemAlloc_v2(&gone, SIZE), 0);
        CHECK_RES(cuIpcGetMemHandle(&h.freed, gone), 0);
        CHECK_RES(cuMemFree_v2(gone), 0);
        CHECK(put(p->x2o[1], &h, sizeof(h)) && put(p->x2t[1], &h.mem, sizeof(h.mem)), "sending the handles");

        /* an IPC event recorded behind a gate the opener lifts */
        CHECK_RES(cuEventCreate(&ev, IPC_EVENT_FLAGS), 0);
        CHECK(!p->private_shm || event_files() == 1, "%d event files in the private /dev/shm", event_files());
        CHECK_RES(cuIpcGetEventHandle(&evh, ev), 0);
        CHECK_RES(cuStreamCreate(&stream, 1), 0);
        CHECK_RES(cuStreamWaitValue64_v2(stream, (DevPtr)(uintptr_t)&gate, 1, 0), 0);
        CHECK_RES(cuEventRecord(ev, stream), 0);
        CHECK_RES(cuEventQuery(ev), NOT_READY);
        CHECK(put(p->x2o[1], &evh, sizeof(evh)), "sending the event's handle");

        CHECK(get(p->o2x[0], &c, 1), "the opener's word");
        __atomic_store_n(&gate, 1, __ATOMIC_SEQ_CST);
        CHECK_RES(cuStreamSynchronize(stream), 0);
        CHECK(get(p->o2x[0], &c, 1), "the opener's last word");
        CHECK_RES(cuEventQuery(ev), 0); /* the opener's record too */
        CHECK_RES(cuStreamDestroy_v2(stream), 0);
        CHECK_RES(cuEventDestroy_v2(ev), 0);
        CHECK(!p->private_shm || event_files() == 0, "%d event files left", event_files());
        return 0;
}

static int opener_distinct(Pair *p)
{
        Handles h;
        H64 evh;
        DevPtr mem;
        void *ev, *stream;
        uint64_t after = 0;
        char c = 'g';

        CHECK(get(p->x2o[0], &h, sizeof(h)), "the exporter's handles");
        CHECK_RES(cuIpcOpenMemHandle_v2(&mem, h.mem, 1), 0);
        CHECK(filled((unsigned char *)(uintptr_t)mem, SIZE, 7), "the exporter's bytes");
        CHECK_RES(cuIpcCloseMemHandle(mem), 0);
        CHECK_RES(cuIpcOpenMemHandle_v2(&mem, h.freed, 1), INVALID_HANDLE);
        CHECK_RES(cuIpcOpenMemHandle_v2(&mem, p->parent.mem, 1), 0);
        CHECK(filled((unsigned char *)(uintptr_t)mem, SIZE, 1), "the parent's bytes");
        CHECK_RES(cuIpcCloseMemHandle(mem), 0);

        CHECK(get(p->x2o[0], &evh, sizeof(evh)), "the exporter's event handle");
        if (p->private_shm) {
                CHECK_RES(cuIpcOpenEventHandle(&ev, evh), MAP_FAILED_);
                CHECK(put(p->o2x[1], &c, 1) && put(p->o2x[1], &c, 1), "telling the exporter");
                return 0;
        }
        /* the exporter's record is pending: a wait queued here holds this stream until it ran there */
        CHECK_RES(cuIpcOpenEventHandle(&ev, evh), 0);
        CHECK_RES(cuEventQuery(ev), NOT_READY);
        CHECK_RES(cuStreamCreate(&stream, 1), 0);
        CHECK_RES(cuStreamWaitEvent(stream, ev, 0), 0);
        CHECK_RES(cuStreamWriteValue64_v2(stream, (DevPtr)(uintptr_t)&after, 1, 0), 0);
        usleep(20000);
        CHECK(__atomic_load_n(&after, __ATOMIC_SEQ_CST) == 0, "the stream passed an event not yet reached");
        CHECK(put(p->o2x[1], &c, 1), "telling the exporter");
        CHECK_RES(cuEventSynchronize(ev), 0);
        CHECK_RES(cuStreamSynchronize(stream), 0);
        CHECK(__atomic_load_n(&after, __ATOMIC_SEQ_CST) == 1, "the stream's write after the wait");
        /* and a record here is seen there: opened events record too */
        CHECK_RES(cuEventRecord(ev, stream), 0);
        CHECK_RES(cuStreamSynchronize(stream), 0);
        CHECK_RES(cuEventQuery(ev), 0);
        CHECK_RES(cuStreamDestroy_v2(stream), 0);
        CHECK_RES(cuEventDestroy_v2(ev), 0);
        /* an opener's destroy leaves the event to its creator */
        CHECK_RES(cuIpcOpenEventHandle(&ev, evh), 0);
        CHECK_RES(cuEventDestroy_v2(ev), 0);
        CHECK(put(p->o2x[1], &c, 1), "telling the exporter");
        return 0;
}

static int opener_same_pid(Pair *p)
{
        Handles h;
        H64 evh;
        DevPtr mem;
        void *ev;
        char c = 'g';

        CHECK(get(p->x2o[0], &h, sizeof(h)), "the exporter's handles");
        CHECK_RES(cuIpcOpenMemHandle_v2(&mem, h.mem, 1), INVALID_CONTEXT);
        CHECK(get(p->x2o[0], &evh, sizeof(evh)), "the exporter's event handle");
        CHECK_RES(cuIpcOpenEventHandle(&ev, evh), INVALID_CONTEXT);
        CHECK(put(p->o2x[1], &c, 1) && put(p->o2x[1], &c, 1), "telling the exporter");
        return 0;
}

/* Runs one pair of sibling containers, keeping the exporter's live memory handle in *kept. */
static int pair(const char *what, int exporter_pid, int opener_pid, bool private_shm, Body opener, H64 *kept)
{
        Pair p = { .private_shm = private_shm };
        pid_t x, o;
        bool got;
        int rx, ro;

        CHECK_RES(cuIpcGetMemHandle(&p.parent.mem, parent_mem), 0);
        CHECK(pipe(p.x2o) == 0 && pipe(p.o2x) == 0 && pipe(p.x2t) == 0, "pipes");
        x = container(exporter_pid, private_shm, exporter, &p, true);
        o = container(opener_pid, private_shm, opener, &p, false);
        for (int i = 0; i < 2; i++) {
                close(p.x2o[i]);
                close(p.o2x[i]);
        }
        close(p.x2t[1]);
        got = get(p.x2t[0], kept, sizeof(*kept));
        close(p.x2t[0]);
        rx = x < 0 ? 1 : wait_status(x);
        ro = o < 0 ? 1 : wait_status(o);
        CHECK(rx == 0 && ro == 0 && got, "%s: exporter (PID %d) exited %d, opener (PID %d) %d", what,
              exporter_pid, rx, opener_pid, ro);
        printf("ok %s\n", what);
        return 0;
}

int main(void)
{
        H64 dead;
        DevPtr mem;
        pid_t c;
        int r;

        setvbuf(stdout, NULL, _IONBF, 0);
        c = container(1, true, probe, NULL, false);
        r = c < 0 ? 1 : wait_status(c);
        if (r == SKIP) {
                printf("SKIP: no PID and mount namespaces here (unshare needs root)\n");
                return SKIP;
        }
        CHECK(r == 0, "the probe exited %d", r);

        /* as the driver: IPC events take no timings, and only they have handles */
        {
                void *ev;
                H64 h;

                CHECK_RES(cuEventCreate(&ev, 0x4), 1u);
                CHECK_RES(cuEventCreate(&ev, 0x2), 0);
                CHECK_RES(cuIpcGetEventHandle(&h, ev), 1u);
                CHECK_RES(cuEventDestroy_v2(ev), 0);
        }

        /* this process exports too, before the containers fork from it */
        CHECK_RES(cuMemAlloc_v2(&parent_mem, SIZE), 0);
        fill((unsigned char *)(uintptr_t)parent_mem, SIZE, 1);

        if (pair("distinct PIDs, one /dev/shm: memory and event open", 1, 2, false, opener_distinct, &dead) ||
            pair("distinct PIDs, a /dev/shm each: memory opens, the event is 205", 2, 1, true, opener_distinct,
                 &dead) ||
            pair("equal PIDs (both PID 1): 201 for memory and event", 1, 1, false, opener_same_pid, &dead))
                return 1;

        /* the exporters have exited: their servers went with them */
        CHECK_RES(cuIpcOpenMemHandle_v2(&mem, dead, 1), INVALID_HANDLE);
        printf("ok an exited exporter's handle is 400\n");
        CHECK_RES(cuMemFree_v2(parent_mem), 0);
        return 0;
}
