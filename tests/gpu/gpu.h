/* GPU-suite helpers on top of the integration harness (tests/integration/harness.h): deciding
 * whether this machine has a GPU, the few driver entry points libgpuipc does not load itself,
 * checked CUDA calls, data patterns written and verified on a GPU, and children that run in PID
 * namespaces of their own (two containers without a shared PID namespace).
 *
 * CUDA does not survive fork(): a process that initialized the driver has children that cannot
 * use it. So the test binary and each case process never touch CUDA (they connect to the broker
 * with no_gpus set, as h_connect() does); only children started with h_spawn() do, each with a
 * driver of its own. gpu_main() probes the machine in a short-lived child for the same reason. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda.h"
#include "harness.h"

/* ---- the machine ---- */

typedef struct GpuMachine {
        int count;  /* 0: no usable GPU (why says why) */
        int driver; /* 1000 * major + 10 * minor */
        char name[CUDA_MAX_DEVICES][96];
        char uuid[CUDA_MAX_DEVICES][PROTO_MAX_UUID + 1];
        bool vmm[CUDA_MAX_DEVICES];        /* cuda-vmm possible (VMM and POSIX-fd export) */
        bool mem_ops_64[CUDA_MAX_DEVICES]; /* gpuipc fences possible */
        char why[512];
} GpuMachine;

/* What gpu_main() found (valid in every case process: they are forked after the probe). */
extern GpuMachine gpu_machine;

/* The test binary's main(): probes the machine in a child process; without a GPU, or with fewer
 * than min_gpus, prints why on stdout and returns 77 (skipped); otherwise prints the machine and
 * runs the cases with h_main(). */
int gpu_main(int argc, char **argv, const HTest *tests, size_t n_tests, int min_gpus);

/* Inside a case: skips it (77, with the reason) unless the machine has n GPUs. */
void gpu_need(int n);

/* "2 x NVIDIA H200, driver 13.0" */
const char *gpu_machine_line(void);

/* ---- CUDA in a child ---- */

typedef struct CUevent_st *GcuEvent;

/* Driver entry points the tests need beyond libgpuipc's table (filled by gpu_init()). */
typedef struct GpuApi {
        GcuResult (*cuMemsetD8)(GcuDevicePtr dst, unsigned char v, size_t n);
        GcuResult (*cuMemsetD32)(GcuDevicePtr dst, unsigned int v, size_t n);
        GcuResult (*cuMemsetD32Async)(GcuDevicePtr dst, unsigned int v, size_t n, GcuStream s);
        GcuResult (*cuMemcpyDtoD)(GcuDevicePtr dst, GcuDevicePtr src, size_t n);
        GcuResult (*cuMemcpyDtoDAsync)(GcuDevicePtr dst, GcuDevicePtr src, size_t n, GcuStream s);
        GcuResult (*cuMemAllocHost)(void **p, size_t n);
        GcuResult (*cuMemFreeHost)(void *p);
        GcuResult (*cuEventCreate)(GcuEvent *e, unsigned int flags);
        GcuResult (*cuEventRecord)(GcuEvent e, GcuStream s);
        GcuResult (*cuEventSynchronize)(GcuEvent e);
        GcuResult (*cuEventElapsedTime)(float *ms, GcuEvent start, GcuEvent end);
        GcuResult (*cuEventDestroy)(GcuEvent e);
        GcuResult (*cuDeviceCanAccessPeer)(int *can, GcuDevice dev, GcuDevice peer);
        GcuResult (*cuCtxEnablePeerAccess)(GcuContext peer, unsigned int flags);
} GpuApi;

extern GpuApi gx;

#define GCU_ERROR_PEER_ACCESS_ALREADY_ENABLED 704

/* In a child, before any CUDA use: loads the driver through libgpuipc (cuda_load) and resolves
 * gx. A failure fails the test: the probe said there is a GPU. */
void gpu_init(void);

/* "CUDA_ERROR_INVALID_CONTEXT" for a result code. */
const char *gpu_cu_name(GcuResult r);

/* A driver call that must succeed (call it inside gpu_push/gpu_pop). */
#define CHECK_CU(call)                                                                                      \
        do {                                                                                                \
                GcuResult cr_ = (call);                                                                     \
                if (cr_ != GCU_SUCCESS)                                                                     \
                        h_fail(__FILE__, __LINE__, "%s = %u (%s)", #call, cr_, gpu_cu_name(cr_));           \
        } while (0)

/* Calls an entry point of gx, or fails when the driver lacks it. */
#define GX(fn, ...) (gx.fn ? gx.fn(__VA_ARGS__) : (GcuResult)GCU_ERROR_MISSING_ENTRY)

/* ordinal's primary context (retained on first use). */
GcuContext gpu_ctx(int ordinal);

/* Makes ordinal's primary context current / pops it again. */
void gpu_push(int ordinal);
void gpu_pop(void);

/* Connects to the broker declaring this process's GPUs (unlike h_connect, which declares none). */
gpuipc_t *gpu_connect(const HBroker *b, const char *label);

/* cuMemAlloc / cuMemFree in ordinal's primary context. */
GcuDevicePtr gpu_alloc(int ordinal, size_t size);
void gpu_free(int ordinal, GcuDevicePtr p);

/* Writes the harness pattern (seed) into device memory at p (on ordinal), from the host. */
void gpu_fill(int ordinal, GcuDevicePtr p, size_t len, uint64_t seed);

/* Copies device memory at p (on ordinal) to the host and checks every byte against the pattern. */
void gpu_verify_dev(int ordinal, GcuDevicePtr p, size_t len, uint64_t seed, const char *what);

/* Fills a buffer of ours with the pattern through gpuipc_buffer_write. */
void gpu_fill_buffer(gpuipc_buffer_t *b, uint64_t seed);

/* Checks every byte of b (any CUDA buffer, own or attached) two ways: gpuipc_buffer_read into
 * host memory, and a device-to-device copy on ordinal (-1: b's own device) into a local
 * cuMemAlloc buffer that is then copied to the host. */
void gpu_verify_buffer(const gpuipc_buffer_t *b, int ordinal, uint64_t seed);

/* The primary-context pointer of a buffer. */
GcuDevicePtr gpu_ptr(const gpuipc_buffer_t *b);


/* ---- PID namespaces ---- */

/* Whether this process may create PID and mount namespaces and mount /proc in them (root, or
 * CAP_SYS_ADMIN): tried in a throwaway child. false with the reason in why. */
bool gpu_pidns_possible(char *why, size_t cap);

/* Like h_spawn(), but fn runs as process 1 of a new PID namespace with a private mount namespace
 * and a fresh /proc: a container that shares no PID namespace with anyone. */
HChild *gpu_spawn_pidns(const char *name, HChildFn fn, void *arg);

/* Where gpu_spawn_ns() runs fn: as process `pid` of its new PID namespace (0 or 1: the first; more:
 * process 1 starts and reaps pid - 2 short-lived children first, as a container's init and its
 * helpers would, and then waits for fn), with a /dev/shm of its own (an empty tmpfs) when
 * private_shm is set. */
typedef struct GpuNs {
        unsigned pid;
        bool private_shm;
} GpuNs;

HChild *gpu_spawn_ns(const char *name, HChildFn fn, void *arg, GpuNs ns);

/* The inode of this process's PID namespace (as /proc/self/ns/pid says). */
uint64_t gpu_pidns(void);
