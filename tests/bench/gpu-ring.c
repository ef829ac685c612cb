/* The GPU part's rings, in C (part of --gpu): a ring of 8 cuda-vmm slots of 16 MiB passed round
 * F times to N consumer processes (N = 1 and 8), two ways, in the same run:
 *
 *   - the stream-ordered ring (GPUIPC_RING_STREAM): the producer fills a slot in its stream and
 *     publishes; each consumer takes in its stream, copies the frame's first word into an array of
 *     its own on the GPU and releases; nobody's host waits for a frame;
 *   - the baseline, the same passes through the broker: the producer waits for the slot's drained,
 *     fills it, publishes it (retire_after N, which synchronizes the device); each consumer attaches
 *     it, copies the word, synchronizes its stream and releases.
 *
 * Time runs from the producer's first frame until the last consumer's stream has finished. At the
 * end every consumer checks the words it copied (the last 1024 frames) against what the producer
 * wrote: a frame read out of order fails the row. torch_compare.py measures the same rings from
 * Python, where the interpreter's own cost per frame shows. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cuda.h"
#include "internal.h"

#define SLOTS      8
#define SLOT_SIZE  (16u << 20)
#define WORDS_KEPT 1024 /* the words a consumer keeps to check */
#define MAX_CONS   8

typedef GcuResult (*MemsetD32Async)(GcuDevicePtr dst, unsigned v, size_t n, GcuStream s);
typedef GcuResult (*MemcpyDtoDAsync)(GcuDevicePtr dst, GcuDevicePtr src, size_t n, GcuStream s);
typedef GcuResult (*MemAlloc)(GcuDevicePtr *p, size_t n);

typedef struct RingShared {
        _Atomic int ready;
        _Atomic uint64_t t_start, t_end[MAX_CONS];
        _Atomic int bad, failed;
} RingShared;

typedef struct RingArgs {
        const Broker *broker;
        RingShared *sh;
        bool stream; /* the stream ring, else publish/attach */
        int n_consumers, idx;
        unsigned frames;
        char name[64];
} RingArgs;

typedef struct Gx {
        MemsetD32Async memset32;
        MemcpyDtoDAsync copy;
        MemAlloc alloc;
} Gx;

static uint32_t value_of(uint64_t frame)
{
        return 0x7e000000u + (uint32_t)frame;
}

static void gx_load(Gx *g)
{
        void *h = bench_libcuda();

        *(void **)&g->memset32 = dlsym(h, "cuMemsetD32Async");
        *(void **)&g->copy = dlsym(h, "cuMemcpyDtoDAsync_v2");
        *(void **)&g->alloc = dlsym(h, "cuMemAlloc_v2");
        if (!g->memset32 || !g->copy || !g->alloc)
                die("this libcuda lacks cuMemsetD32Async, cuMemcpyDtoDAsync_v2 or cuMemAlloc_v2");
}

#define CUCHECK(call)                                                                                       \
        do {                                                                                                \
                GcuResult r_ = (call);                                                                      \
                if (r_ != GCU_SUCCESS)                                                                      \
                        die("%s:%d: %s = %d", __FILE__, __LINE__, #call, (int)r_);                          \
        } while (0)

static GcuDevicePtr slot_ptr(gpuipc_buffer_t *b)
{
        return (GcuDevicePtr)(uintptr_t)gpuipc_buffer_ptr(b);
}

/* ---- the producer ---- */

static void produce_stream(gpuipc_t *c, const RingArgs *a, const Gx *g, GcuStream s)
{
        gpuipc_ring_options_t o = { .struct_size = sizeof(o), .kind = GPUIPC_KIND_CUDA_VMM, .slot_size = SLOT_SIZE,
                                    .slots = SLOTS, .max_members = (unsigned)a->n_consumers,
                                    .mode = GPUIPC_RING_STREAM, .lease_ms = 60000 };
        gpuipc_ring_t *r;

        TRY(c, gpuipc_ring_create(c, a->name, &o, &r));
        while (atomic_load(&a->sh->ready) < a->n_consumers)
                sleep_ns(1000000);
        TRY(c, gpuipc_process(c)); /* the member-joined events: every consumer is seated from frame 1 */
        atomic_store(&a->sh->t_start, monotonic_ns());
        for (uint64_t n = 1; n <= a->frames; n++) {
                gpuipc_buffer_t *slot;
                uint64_t frame;

                TRY(c, gpuipc_ring_stream_acquire(r, s, 60000, &slot));
                TRY(c, cuda_ctx_push(c, 0));
                CUCHECK(g->memset32(slot_ptr(slot), value_of(n), SLOT_SIZE / 4, s));
                TRY(c, cuda_ctx_pop(c, 0));
                TRY(c, gpuipc_ring_stream_publish(r, s, &frame));
                if (frame != n)
                        die("published frame %llu, expected %llu", (unsigned long long)frame,
                            (unsigned long long)n);
        }
        for (int i = 0; i < a->n_consumers; i++)
                while (!atomic_load(&a->sh->t_end[i]) && !atomic_load(&a->sh->failed))
                        sleep_ns(1000000);
        gpuipc_ring_close(r);
}

static void produce_published(gpuipc_t *c, const RingArgs *a, const Gx *g, GcuStream s)
{
        gpuipc_publish_options_t po = { .struct_size = sizeof(po), .retire_after = (unsigned)a->n_consumers };
        gpuipc_buffer_t *slot[SLOTS];
        bool used[SLOTS] = { false };
        char name[96];

        for (int k = 0; k < SLOTS; k++)
                TRY(c, gpuipc_buffer_alloc(c, GPUIPC_KIND_CUDA_VMM, SLOT_SIZE, 0, &slot[k]));
        while (atomic_load(&a->sh->ready) < a->n_consumers)
                sleep_ns(1000000);
        atomic_store(&a->sh->t_start, monotonic_ns());
        for (uint64_t n = 1; n <= a->frames; n++) {
                int k = (int)((n - 1) % SLOTS);

                if (used[k])
                        TRY(c, gpuipc_wait_drained(c, slot[k], 60000));
                TRY(c, cuda_ctx_push(c, 0));
                CUCHECK(g->memset32(slot_ptr(slot[k]), value_of(n), SLOT_SIZE / 4, s));
                TRY(c, cuda_ctx_pop(c, 0));
                snprintf(name, sizeof(name), "%s/%llu", a->name, (unsigned long long)n);
                TRY(c, gpuipc_publish(c, slot[k], name, &po)); /* synchronizes the device first */
                used[k] = true;
        }
        for (int k = 0; k < SLOTS; k++) {
                if (used[k])
                        TRY(c, gpuipc_wait_drained(c, slot[k], 60000));
                TRY(c, gpuipc_buffer_free(c, slot[k]));
        }
}

static int producer_main(void *arg)
{
        const RingArgs *a = arg;
        gpuipc_t *c = bench_connect_gpus(a->broker, "bench-ring-producer");
        GcuStream s = NULL;
        Gx g;

        gx_load(&g);
        TRY(c, cuda_ctx_push(c, 0));
        CUCHECK(CU(cuStreamCreate, &s, GCU_STREAM_NON_BLOCKING));
        TRY(c, cuda_ctx_pop(c, 0));
        if (a->stream)
                produce_stream(c, a, &g, s);
        else
                produce_published(c, a, &g, s);
        TRY(c, cuda_ctx_push(c, 0));
        CUCHECK(CU(cuStreamSynchronize, s));
        CUCHECK(CU(cuStreamDestroy, s));
        TRY(c, cuda_ctx_pop(c, 0));
        gpuipc_close(c);
        return 0;
}

/* ---- a consumer ---- */

static void consume_stream(gpuipc_t *c, const RingArgs *a, const Gx *g, GcuStream s, GcuDevicePtr kept)
{
        gpuipc_ring_t *r;

        TRY(c, gpuipc_ring_join(c, a->name, 60000, &r));
        atomic_fetch_add(&a->sh->ready, 1);
        for (uint64_t i = 1; i <= a->frames; i++) {
                gpuipc_buffer_t *slot;
                uint64_t n;

                TRY(c, gpuipc_ring_stream_take(r, s, 60000, &slot, &n));
                if (n != i)
                        die("took frame %llu, expected %llu", (unsigned long long)n, (unsigned long long)i);
                TRY(c, cuda_ctx_push(c, 0));
                CUCHECK(g->copy(kept + (n % WORDS_KEPT) * 4, slot_ptr(slot), 4, s));
                TRY(c, cuda_ctx_pop(c, 0));
                TRY(c, gpuipc_ring_stream_release(r, s));
        }
        TRY(c, cuda_ctx_push(c, 0));
        CUCHECK(CU(cuStreamSynchronize, s));
        TRY(c, cuda_ctx_pop(c, 0));
        gpuipc_ring_close(r);
}

static void consume_published(gpuipc_t *c, const RingArgs *a, const Gx *g, GcuStream s, GcuDevicePtr kept)
{
        char name[96];

        atomic_fetch_add(&a->sh->ready, 1);
        for (uint64_t n = 1; n <= a->frames; n++) {
                gpuipc_buffer_t *b;

                snprintf(name, sizeof(name), "%s/%llu", a->name, (unsigned long long)n);
                TRY(c, gpuipc_attach(c, name, 60000, &b));
                TRY(c, cuda_ctx_push(c, 0));
                CUCHECK(g->copy(kept + (n % WORDS_KEPT) * 4, slot_ptr(b), 4, s));
                CUCHECK(CU(cuStreamSynchronize, s)); /* done reading before it is released */
                TRY(c, cuda_ctx_pop(c, 0));
                TRY(c, gpuipc_release(c, b));
        }
}

static int consumer_main(void *arg)
{
        const RingArgs *a = arg;
        gpuipc_t *c = bench_connect_gpus(a->broker, "bench-ring-consumer");
        uint32_t *words = calloc(WORDS_KEPT, sizeof(*words));
        GcuDevicePtr kept = 0;
        GcuStream s = NULL;
        int bad = 0;
        Gx g;

        if (!words)
                die("out of memory");
        gx_load(&g);
        TRY(c, cuda_ctx_push(c, 0));
        CUCHECK(CU(cuStreamCreate, &s, GCU_STREAM_NON_BLOCKING));
        CUCHECK(g.alloc(&kept, WORDS_KEPT * 4));
        TRY(c, cuda_ctx_pop(c, 0));
        if (a->stream)
                consume_stream(c, a, &g, s, kept);
        else
                consume_published(c, a, &g, s, kept);
        atomic_store(&a->sh->t_end[a->idx], monotonic_ns());
        TRY(c, cuda_ctx_push(c, 0));
        CUCHECK(CU(cuMemcpyDtoH, words, kept, WORDS_KEPT * 4));
        CUCHECK(CU(cuStreamDestroy, s));
        TRY(c, cuda_ctx_pop(c, 0));
        for (uint64_t n = a->frames > WORDS_KEPT ? a->frames - WORDS_KEPT + 1 : 1; n <= a->frames; n++)
                bad += words[n % WORDS_KEPT] != value_of(n);
        atomic_fetch_add(&a->sh->bad, bad);
        free(words);
        gpuipc_close(c);
        return 0;
}

/* ---- one measurement ---- */

/* Microseconds per frame, or NAN when a process failed or a frame was read wrong. */
static double run_ring(const Broker *broker, bool stream, int n, unsigned frames)
{
        RingShared *sh = shared_alloc(sizeof(*sh));
        RingArgs a = { broker, sh, stream, n, 0, frames, "" };
        pid_t prod, cons[MAX_CONS];
        uint64_t end = 0;
        int rc = 0;

        snprintf(a.name, sizeof(a.name), "bench/%s/%d", stream ? "sring" : "pring", n);
        prod = spawn(producer_main, &a, NULL, 0);
        for (int i = 0; i < n; i++) {
                a.idx = i;
                cons[i] = spawn(consumer_main, &a, NULL, 0);
        }
        for (int i = 0; i < n; i++)
                if (child_wait(cons[i]) != 0) {
                        rc = 1;
                        atomic_store(&sh->failed, 1);
                }
        rc |= child_wait(prod) != 0;
        for (int i = 0; i < n; i++)
                end = end > sh->t_end[i] ? end : sh->t_end[i];
        if (rc || sh->bad || !sh->t_start || end < sh->t_start) {
                printf("GPU part: the %s ring to %d consumer(s) failed (%d wrong frames; messages above)\n",
                       stream ? "stream" : "publish/attach", n, (int)sh->bad);
                return NAN;
        }
        return (double)(end - sh->t_start) / 1000.0 / frames;
}

void gpu_ring_rows(const char *suffix, double ret_stream_us[2])
{
        unsigned frames = bench_opts.quick ? 200 : 2000;
        static const int counts[] = { 1, 8 };
        Broker broker;

        broker_start(&broker, NULL, 0);
        for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
                int n = counts[i];
                double pa, st;
                char metric[96];
                Row *r;

                note("rings in C: publish/attach, %d consumer(s)", n);
                pa = run_ring(&broker, false, n, frames);
                note("rings in C: stream-ordered, %d consumer(s)", n);
                st = run_ring(&broker, true, n, frames);
                ret_stream_us[i] = st;
                /* Said at once as well: the table comes only at the end of the run. */
                note("stream ring (C)%s to %d consumer(s): %.1f us per frame (publish/attach: %.1f)", suffix, n, st,
                     pa);
                snprintf(metric, sizeof(metric), "stream ring (C), 8 x 16 MiB to %d consumer(s), per frame%s", n,
                         suffix);
                r = row_add(metric, st, "us", "publish/attach ring (C)", pa);
                row_note(r, "%u frames; every consumer checked its last %d on the GPU", frames, WORDS_KEPT);
        }
        broker_stop(&broker);
}
