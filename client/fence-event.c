/* Fences made of a CUDA IPC event: the producer records the event in its stream, consumers wait
 * for it in theirs. Waiting needs no memory operation, but, as measured (docs/legacy-ipc.md), CUDA
 * opens an IPC event only in a process whose PID (as each sees its own) differs from the creator's
 * and that sees the same /dev/shm; the counter fences of fence.c need neither. What travels is a
 * small memfd buffer holding the event's handle and those two facts of its creator, so that an
 * opener refuses, naming the cause, before CUDA fails obscurely. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fence.h"
#include "identity.h"
#include "macro.h"

/* The published buffer's content. */
#define EVENT_MAGIC "GIPCEVT1"
typedef struct EventRecord {
        char magic[8];
        GcuIpcEventHandle handle;
        char device[PROTO_MAX_UUID + 1]; /* UUID of the GPU the event lives on */
        /* Added later, so absent from older creators' records (then nothing is checked before CUDA):
         * the creator's own PID, its PID namespace, and its /dev/shm. */
        uint64_t creator_pid, creator_pidns, shm_dev, shm_ino;
} EventRecord;

/* An older creator's record ends after the device. */
#define EVENT_RECORD_V1_SIZE offsetof(EventRecord, creator_pid)

bool fence_event_is(const gpuipc_buffer_t *b)
{
        return b->kind == GPUIPC_KIND_MEMFD && b->size >= EVENT_RECORD_V1_SIZE &&
               memcmp(b->ptr, EVENT_MAGIC, sizeof(((EventRecord *)0)->magic)) == 0;
}

/* Runs one driver call in device's primary context: 0, or the call's error (named). */
static int in_ctx(gpuipc_t *c, int device, const char *call, GcuResult (*fn)(void *arg), void *arg)
{
        int r = cuda_ctx_push(c, device);
        GcuResult cr;

        if (r < 0)
                return r;
        cr = fn(arg);
        return cuda_ctx_pop(c, cr == GCU_SUCCESS ? 0 : cuda_error(c, call, cr));
}

typedef struct EventArgs {
        GcuEvent event;
        EventRecord *rec;
} EventArgs;

static GcuResult event_create(void *arg)
{
        EventArgs *a = arg;
        return CU(cuEventCreate, &a->event, GCU_EVENT_DISABLE_TIMING | GCU_EVENT_INTERPROCESS);
}

static GcuResult event_export(void *arg)
{
        EventArgs *a = arg;
        return CU(cuIpcGetEventHandle, &a->rec->handle, a->event);
}

static GcuResult event_destroy(void *arg)
{
        EventArgs *a = arg;
        return CU(cuEventDestroy, a->event);
}

_public_ int gpuipc_fence_create_ipc_event(gpuipc_t *c, const char *name, int device, gpuipc_fence_t **ret)
{
        CLIENT_LOCKED(c);
        gpuipc_buffer_t *b = NULL;
        EventArgs ev = { 0 };
        gpuipc_fence_t *f;
        int r;

        if (!c || !name || !ret)
                return GPUIPC_E_INVALID;
        r = cuda_require(c);
        if (r == 0)
                r = cuda_check_device(c, device);
        if (r == 0)
                r = in_ctx(c, device, "cuEventCreate", event_create, &ev);
        if (r < 0)
                return r;
        f = calloc(1, sizeof(*f));
        r = f ? gpuipc_buffer_alloc(c, GPUIPC_KIND_MEMFD, sizeof(EventRecord), 0, &b) : -ENOMEM;
        if (r == 0) {
                ev.rec = b->ptr;
                memcpy(ev.rec->magic, EVENT_MAGIC, sizeof(ev.rec->magic));
                snprintf(ev.rec->device, sizeof(ev.rec->device), "%s", cuda_device_uuid(device));
                ev.rec->creator_pid = (uint64_t)getpid();
                ev.rec->creator_pidns = c->pidns;
                ipc_shm_identity(&ev.rec->shm_dev, &ev.rec->shm_ino);
                r = in_ctx(c, device, "cuIpcGetEventHandle", event_export, &ev);
        }
        if (r == 0)
                r = gpuipc_publish(c, b, name, NULL); /* read-only: only the creator records */
        if (r < 0) {
                in_ctx(c, device, "cuEventDestroy", event_destroy, &ev);
                free(f);
                return b ? fence_undo(c, b, r) : r;
        }
        *f = (gpuipc_fence_t){ .conn = c, .buf = b, .event = ev.event, .ordinal = device };
        *ret = f;
        return 0;
}

/* What CUDA would refuse, said before it runs: the creator's PID equal to ours (each in its own
 * namespace), or another /dev/shm. A record of an older creator says neither: CUDA decides. */
static int event_precheck(gpuipc_t *c, const char *name, const EventRecord *rec)
{
        uint64_t dev, ino;

        /* Equal PIDs in one namespace: the very process, which CUDA answers for itself. */
        if (rec->creator_pid && rec->creator_pid == (uint64_t)getpid() && rec->creator_pidns != c->pidns) {
                client_errmsg(c, "the IPC-event fence '%s' was created by PID %llu of its PID namespace, and this "
                              "process is PID %llu of its own: CUDA takes such a handle for one of this process's "
                              "own. Start one of them at another PID (gpuipcctl run -- CMD), or use a counter "
                              "fence (gpuipc_fence_create)", name, (unsigned long long)rec->creator_pid,
                              (unsigned long long)rec->creator_pid);
                return GPUIPC_E_SAME_PID;
        }
        if ((rec->shm_dev || rec->shm_ino) && ipc_shm_identity(&dev, &ino) == 0 &&
            (dev != rec->shm_dev || ino != rec->shm_ino)) {
                client_errmsg(c, "the IPC-event fence '%s' was created by a process whose /dev/shm (device %llu, "
                              "inode %llu) is not this process's (device %llu, inode %llu); CUDA would fail with "
                              "'mapping of buffer object failed'. Mount one emptyDir (medium: Memory) at /dev/shm in "
                              "both containers, or use a counter fence (gpuipc_fence_create), which needs neither",
                              name, (unsigned long long)rec->shm_dev, (unsigned long long)rec->shm_ino,
                              (unsigned long long)dev, (unsigned long long)ino);
                return GPUIPC_E_SHM;
        }
        return 0;
}

/* Opens the event on its own GPU (or the one gpuipc_set_device() chose), explaining the failures
 * CUDA reports when the precheck could not tell. */
static int event_open_in_ctx(gpuipc_t *c, const EventRecord *rec, GcuEvent *ret)
{
        GcuResult cr = CU(cuIpcOpenEventHandle, ret, rec->handle);

        if (cr == GCU_ERROR_INVALID_CONTEXT)
                return cuda_error_why(c, "cuIpcOpenEventHandle", cr,
                                      "CUDA opens an IPC event only in a process whose PID differs from its "
                                      "creator's (each in its own PID namespace): start one of them at another PID "
                                      "(gpuipcctl run -- CMD), or use a counter fence (gpuipc_fence_create)");
        if (cr == GCU_ERROR_MAP_FAILED)
                return cuda_error_why(c, "cuIpcOpenEventHandle", cr,
                                      "CUDA opens an IPC event only where /dev/shm is the creator's: mount one "
                                      "emptyDir (medium: Memory) at /dev/shm in both containers, or use a counter "
                                      "fence (gpuipc_fence_create)");
        return cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuIpcOpenEventHandle", cr);
}

int fence_event_open(gpuipc_t *c, gpuipc_buffer_t *b, gpuipc_fence_t **ret)
{
        EventRecord rec;
        gpuipc_fence_t *f;
        GcuEvent ev = NULL;
        int ordinal, r;

        memset(&rec, 0, sizeof(rec));
        memcpy(&rec, b->ptr, MIN(b->size, sizeof(rec)));
        rec.device[sizeof(rec.device) - 1] = 0;
        r = event_precheck(c, b->name, &rec);
        if (r < 0)
                return fence_undo(c, b, r);
        ordinal = c->device_pref >= 0 ? c->device_pref : cuda_device_by_uuid(rec.device);
        if (ordinal < 0) {
                client_errmsg(c, "the IPC-event fence '%s' lives on GPU %s, which this process cannot see: give "
                              "producer and consumer the same ResourceClaim", b->name, rec.device);
                return fence_undo(c, b, GPUIPC_E_DEVICE);
        }
        r = cuda_ctx_push(c, ordinal);
        if (r == 0)
                r = cuda_ctx_pop(c, event_open_in_ctx(c, &rec, &ev));
        f = r == 0 ? calloc(1, sizeof(*f)) : NULL;
        if (r == 0 && !f) {
                in_ctx(c, ordinal, "cuEventDestroy", event_destroy, &(EventArgs){ .event = ev });
                r = -ENOMEM;
        }
        if (r < 0)
                return fence_undo(c, b, r);
        *f = (gpuipc_fence_t){ .conn = c, .buf = b, .event = ev, .ordinal = ordinal };
        *ret = f;
        return 0;
}

int fence_event_enqueue(gpuipc_fence_t *f, GcuStream s, bool wait)
{
        GcuResult cr;

        /* An event fence has no value: a wait waits for the record enqueued last before it. */
        if (wait) {
                cr = CU(cuStreamWaitEvent, s, f->event, 0);
                return cr == GCU_SUCCESS ? 0 : cuda_error(f->conn, "cuStreamWaitEvent", cr);
        }
        cr = CU(cuEventRecord, f->event, s);
        return cr == GCU_SUCCESS ? 0 : cuda_error(f->conn, "cuEventRecord", cr);
}

int fence_event_done(gpuipc_fence_t *f, uint64_t *ret)
{
        GcuResult cr = CU(cuEventQuery, f->event);

        if (cr == GCU_SUCCESS || cr == GCU_ERROR_NOT_READY) {
                *ret = cr == GCU_SUCCESS;
                return 0;
        }
        return cuda_error(f->conn, "cuEventQuery", cr);
}
