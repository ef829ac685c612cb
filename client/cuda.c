/* The CUDA driver, loaded at run time: entry points, error messages that name cause and fix, the
 * devices this process sees (by ordinal and by UUID) and their primary contexts. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cuda.h"
#include "internal.h"
#include "macro.h"

#define LIBCUDA "libcuda.so.1"

typedef struct CudaDevice {
        GcuDevice dev;
        GcuContext ctx;                     /* retained primary context, NULL until first needed */
        char uuid[PROTO_MAX_UUID + 1];      /* GPU-... or MIG-...; "" if the driver would not say */
} CudaDevice;

CudaApi gcu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static int load_result = GPUIPC_E_NO_CUDA;
static char load_reason[512];
static int driver_version;
static int n_devices;
static CudaDevice devices[CUDA_MAX_DEVICES];

/* ---- errors ---- */

static const char *error_name(GcuResult r)
{
        const char *s = NULL;

        if (r == GCU_ERROR_MISSING_ENTRY)
                return "missing entry point";
        if (CU(cuGetErrorName, r, &s) != GCU_SUCCESS || !s)
                return "unknown CUDA error";
        return s;
}

static const char *error_string(GcuResult r)
{
        const char *s = NULL;

        if (r == GCU_ERROR_MISSING_ENTRY)
                return "this NVIDIA driver does not have the call";
        if (CU(cuGetErrorString, r, &s) != GCU_SUCCESS || !s)
                return "no description";
        return s;
}

/* What usually causes r and what fixes it, for errors whose own words do not say. */
static const char *error_hint(GcuResult r)
{
        switch (r) {
        case GCU_ERROR_OUT_OF_MEMORY:
                return "the GPU has too little free memory: free some, or share a smaller buffer";
        case GCU_ERROR_NOT_INITIALIZED:
        case GCU_ERROR_DEINITIALIZED:
                return "CUDA is shutting down in this process (or was used across fork()): use libgpuipc "
                       "before exit and in the process that connected";
        case GCU_ERROR_NO_DEVICE:
        case GCU_ERROR_INVALID_DEVICE:
                return "this process does not see that GPU: check CUDA_VISIBLE_DEVICES and the container's GPU "
                       "claim";
        case GCU_ERROR_DEVICE_UNAVAILABLE:
                return "the GPU is in exclusive-process or prohibited compute mode and in use elsewhere: "
                       "set its compute mode to Default";
        case GCU_ERROR_PEER_ACCESS_UNSUPPORTED:
        case GCU_ERROR_TOO_MANY_PEERS:
                return "these GPUs cannot reach each other's memory: map the buffer on its own GPU "
                       "(gpuipc_set_device(c, -1)) or give this container that GPU";
        case GCU_ERROR_ILLEGAL_ADDRESS:
        case GCU_ERROR_UNKNOWN:
                return "an earlier GPU fault broke this process's CUDA context: restart the process";
        case GCU_ERROR_OPERATING_SYSTEM:
                return "a system call inside the driver failed: check the open-files limit and that the "
                       "container's seccomp profile allows the driver's calls";
        case GCU_ERROR_NOT_PERMITTED:
        case GCU_ERROR_NOT_SUPPORTED:
                return "this driver, GPU or sandbox does not offer the operation: use another buffer kind "
                       "(gpuipcctl doctor shows what this machine supports)";
        case GCU_ERROR_SYSTEM_DRIVER_MISMATCH:
        case GCU_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
                return "the container's libcuda.so.1 does not match the host's NVIDIA kernel module: mount "
                       "the host's driver libraries instead of shipping them in the image";
        case GCU_ERROR_CALL_REQUIRES_NEWER_DRIVER:
        case GCU_ERROR_MISSING_ENTRY:
                return "the NVIDIA driver is too old for this call: update it";
        }
        return NULL;
}

int cuda_error_why(gpuipc_t *c, const char *call, GcuResult r, const char *why)
{
        if (!why)
                why = error_hint(r);
        if (c)
                client_errmsg(c, "%s failed: %s (%s)%s%s", call, error_name(r), error_string(r), why ? ": " : "",
                              why ? why : "");
        return GPUIPC_E_CUDA;
}

int cuda_error(gpuipc_t *c, const char *call, GcuResult r)
{
        return cuda_error_why(c, call, r, NULL);
}

/* ---- loading ---- */

static void fail(const char *fmt, ...) _printf_(1, 2);

static void fail(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(load_reason, sizeof(load_reason), fmt, ap);
        va_end(ap);
}

/* Where a resolver's answer lands: one conversion from an object pointer, which POSIX allows
 * for dlsym() results and cuGetProcAddress hands out the same way. */
typedef void (*AnyFn)(void);

static AnyFn to_fn(void *p)
{
        AnyFn fn;

        memcpy(&fn, &p, sizeof(fn));
        return fn;
}

/* What finds entry points: cuGetProcAddress where the driver has it (it knows versioned variants
 * and forward-compatibility layers), else dlsym() of the exported names. */
typedef struct Resolver {
        void *dl;
        GcuGetProcAddressV2 get_v2; /* drivers since 12.0 */
        GcuGetProcAddress get_v1;   /* 11.3 to 11.8 */
} Resolver;

/* The entry point symbol in the ABI of the given CUDA version, or NULL. The legacy default stream
 * is asked for: a NULL stream means what it means in the driver API. */
static AnyFn resolve(const Resolver *res, const char *symbol, int version, const char *exported)
{
        void *p = NULL;

        if (res->get_v2) {
                unsigned int status = 0;
                if (res->get_v2(symbol, &p, version, GCU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != GCU_SUCCESS ||
                    status != GCU_GET_PROC_ADDRESS_SUCCESS)
                        p = NULL;
        } else if (res->get_v1) {
                if (res->get_v1(symbol, &p, version, GCU_GET_PROC_ADDRESS_LEGACY_STREAM) != GCU_SUCCESS)
                        p = NULL;
        }
        if (!p)
                p = dlsym(res->dl, exported);
        return to_fn(p);
}

static void resolve_all(void *dl)
{
        Resolver res = { .dl = dl };

        res.get_v2 = (GcuGetProcAddressV2)to_fn(dlsym(dl, "cuGetProcAddress_v2"));
        if (!res.get_v2)
                res.get_v1 = (GcuGetProcAddress)to_fn(dlsym(dl, "cuGetProcAddress"));
#define GCU_RESOLVE(member, symbol, version, exported, params) \
        gcu.member = (__typeof__(gcu.member))resolve(&res, #symbol, version, exported);
        GCU_FUNCTIONS(GCU_RESOLVE, GCU_OURS)
#undef GCU_RESOLVE
}

static void format_uuid(char *out, size_t cap, const char *prefix, const GcuUuid *u)
{
        const unsigned char *b = (const unsigned char *)u->bytes;

        snprintf(out, cap, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* The UUID hello declares and the broker compares: a MIG instance reports its own UUID through
 * cuDeviceGetUuid v2 and its parent GPU's through v1, so differing answers mean MIG. The
 * result's CUDA code; *ret_mig is -1 when v1 is missing and MIG-ness cannot be told. */
static GcuResult device_uuid(GcuDevice dev, char *out, size_t cap, char *gpu_out, size_t gpu_cap, int *ret_mig)
{
        GcuUuid v2 = { 0 }, v1 = { 0 };
        GcuResult r1, r2;
        bool mig;

        r2 = CU(cuDeviceGetUuid, &v2, dev);
        r1 = CU(cuDeviceGetUuid_v1, &v1, dev);
        if (r2 != GCU_SUCCESS && r1 != GCU_SUCCESS)
                return r2;
        mig = r1 == GCU_SUCCESS && r2 == GCU_SUCCESS && memcmp(&v1, &v2, sizeof(v1)) != 0;
        format_uuid(out, cap, mig ? "MIG" : "GPU", r2 == GCU_SUCCESS ? &v2 : &v1);
        if (gpu_out)
                format_uuid(gpu_out, gpu_cap, "GPU", r1 == GCU_SUCCESS ? &v1 : &v2);
        if (ret_mig)
                *ret_mig = r1 == GCU_SUCCESS && r2 == GCU_SUCCESS ? mig : -1;
        return GCU_SUCCESS;
}

static void load_failed_dlopen(const char *path)
{
        const char *err = dlerror();

        fail("%s could not be loaded (%s): this container has no NVIDIA driver libraries mounted. Give it a GPU "
             "(its ResourceClaim, or the NVIDIA container runtime), or share memfd buffers",
             path, err ? err : "unknown reason");
}

static void load_failed_init(GcuResult r)
{
        switch (r) {
        case GCU_ERROR_NO_DEVICE:
                fail("cuInit: the NVIDIA driver sees no GPU (CUDA_ERROR_NO_DEVICE): the container has no "
                     "/dev/nvidia* devices, or CUDA_VISIBLE_DEVICES hides them all");
                break;
        case GCU_ERROR_STUB_LIBRARY:
                fail("cuInit: the libcuda.so.1 found is the CUDA toolkit's stub, not the driver "
                     "(CUDA_ERROR_STUB_LIBRARY): remove the toolkit's stubs directory from LD_LIBRARY_PATH");
                break;
        default:
                fail("cuInit failed: %s (%s)%s%s", error_name(r), error_string(r), error_hint(r) ? ": " : "",
                     error_hint(r) ? error_hint(r) : "");
        }
}

static void list_devices(void)
{
        for (int i = 0; i < n_devices; i++) {
                CudaDevice *d = &devices[i];

                d->dev = i;
                if (CU(cuDeviceGet, &d->dev, i) != GCU_SUCCESS)
                        continue; /* keep the ordinal; its calls will report what is wrong */
                if (device_uuid(d->dev, d->uuid, sizeof(d->uuid), NULL, 0, NULL) != GCU_SUCCESS)
                        d->uuid[0] = 0;
        }
}

static void load(void)
{
        const char *path = secure_getenv("GPUIPC_LIBCUDA");
        void *dl;
        GcuResult r;
        int count = 0;

        if (!path || !*path)
                path = LIBCUDA;
        /* RTLD_LOCAL: the application may load its own CUDA later; our symbols must not clash. */
        dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!dl) {
                load_failed_dlopen(path);
                return;
        }
        resolve_all(dl); /* dl stays open for the life of the process: the table points into it */
        if (!gcu.cuInit || !gcu.cuDeviceGetCount || !gcu.cuDeviceGet || !gcu.cuGetErrorName ||
            !gcu.cuGetErrorString || !gcu.cuDriverGetVersion) {
                fail("%s lacks the basic CUDA driver entry points (cuInit, cuDeviceGet, ...): it is not an "
                     "NVIDIA driver library, or a very old one; mount the host's driver libraries", path);
                return;
        }
        r = gcu.cuInit(0);
        if (r != GCU_SUCCESS) {
                load_failed_init(r);
                return;
        }
        if (gcu.cuDriverGetVersion(&driver_version) != GCU_SUCCESS)
                driver_version = 0;
        r = gcu.cuDeviceGetCount(&count);
        if (r != GCU_SUCCESS || count <= 0) {
                fail("the NVIDIA driver works but sees no GPU: check CUDA_VISIBLE_DEVICES and that the container "
                     "was given a GPU");
                return;
        }
        n_devices = MIN(count, CUDA_MAX_DEVICES);
        list_devices();
        load_result = 0;
}

int cuda_load(void)
{
        pthread_once(&load_once, load);
        return load_result;
}

const char *cuda_load_error(void)
{
        return cuda_load() == 0 ? "" : load_reason;
}

int cuda_require(gpuipc_t *c)
{
        int r = cuda_load();

        if (r < 0 && c)
                client_errmsg(c, "%s", load_reason);
        return r;
}

/* ---- devices ---- */

int cuda_device_count(void)
{
        return cuda_load() == 0 ? n_devices : 0;
}

int cuda_check_device(gpuipc_t *c, int ordinal)
{
        int n = cuda_device_count();

        if (ordinal >= 0 && ordinal < n)
                return 0;
        if (c)
                client_errmsg(c, "there is no CUDA device %d: this process sees %d GPU%s (ordinals count from 0 "
                              "within CUDA_VISIBLE_DEVICES)", ordinal, n, n == 1 ? "" : "s");
        return GPUIPC_E_DEVICE;
}

GcuDevice cuda_device(int ordinal)
{
        return devices[ordinal].dev;
}

const char *cuda_device_uuid(int ordinal)
{
        if (ordinal < 0 || ordinal >= cuda_device_count())
                return "";
        return devices[ordinal].uuid;
}

int cuda_device_by_uuid(const char *uuid)
{
        int n = cuda_device_count();

        if (!uuid || !*uuid)
                return -1;
        for (int i = 0; i < n; i++)
                if (devices[i].uuid[0] && strcasecmp(devices[i].uuid, uuid) == 0)
                        return i;
        return -1;
}

GcuResult cuda_attribute(int ordinal, unsigned int attribute, int *ret)
{
        if (ordinal < 0 || ordinal >= cuda_device_count())
                return GCU_ERROR_INVALID_DEVICE;
        return CU(cuDeviceGetAttribute, ret, attribute, devices[ordinal].dev);
}

GcuResult cuda_can_mem_ops_64(int ordinal, bool *ret)
{
        int v = 0;
        GcuResult r = cuda_attribute(ordinal, GCU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, &v);

        /* Drivers before 12.0 do not know attribute 122; they answered the question under 93. */
        if (r == GCU_ERROR_INVALID_VALUE)
                r = cuda_attribute(ordinal, GCU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1, &v);
        if (r == GCU_SUCCESS)
                *ret = v != 0;
        return r;
}

uint32_t cuda_visible_gpus(char out[][PROTO_MAX_UUID + 1], uint32_t max)
{
        int count = cuda_device_count();
        uint32_t n = 0;

        /* The broker only uses these to explain refusals: no CUDA means no GPUs, not an error. */
        for (int i = 0; i < count && n < max; i++)
                if (devices[i].uuid[0])
                        snprintf(out[n++], PROTO_MAX_UUID + 1, "%s", devices[i].uuid);
        return n;
}

int cuda_import_device(gpuipc_t *c, const char *uuid, int *ret_ordinal, bool *ret_guessed)
{
        int r = cuda_require(c), ordinal;

        if (r < 0)
                return r;
        if (c->device_pref >= 0) {
                r = cuda_check_device(c, c->device_pref);
                if (r < 0)
                        return r;
                *ret_ordinal = c->device_pref;
                *ret_guessed = false;
                return 0;
        }
        ordinal = cuda_device_by_uuid(uuid);
        *ret_guessed = ordinal < 0;
        *ret_ordinal = ordinal < 0 ? 0 : ordinal;
        return 0;
}

int cuda_device_unreachable(gpuipc_t *c, const char *uuid, int ordinal)
{
        char cause[sizeof(c->errmsg)];

        memcpy(cause, client_errbuf(c), sizeof(cause));
        client_errmsg(c, "the buffer lives on %s, which this process does not see; mapping it onto device %d (%s) "
                      "instead failed (%s). Give this container the buffer's GPU (the same ResourceClaim as the "
                      "producer), or pick a device that can reach it with gpuipc_set_device()",
                      uuid && *uuid ? uuid : "an unnamed GPU", ordinal, cuda_device_uuid(ordinal), cause);
        return GPUIPC_E_DEVICE;
}

/* ---- contexts ---- */

/* The primary context of ordinal, retained on first use. Retaining creates it (hundreds of MB
 * of device memory), so it waits until a buffer on that device needs it. */
static int primary_ctx(gpuipc_t *c, int ordinal, GcuContext *ret)
{
        CudaDevice *d = &devices[ordinal];
        GcuResult r = GCU_SUCCESS;

        pthread_mutex_lock(&ctx_lock);
        if (!d->ctx)
                r = CU(cuDevicePrimaryCtxRetain, &d->ctx, d->dev);
        *ret = d->ctx;
        pthread_mutex_unlock(&ctx_lock);
        if (r != GCU_SUCCESS)
                return cuda_error_why(c, "cuDevicePrimaryCtxRetain", r,
                                      r == GCU_ERROR_UNKNOWN ? "the GPU may be in prohibited compute mode, or the "
                                                                "driver failed to create a context on it" : NULL);
        return 0;
}

GcuContext cuda_primary_ctx(int ordinal)
{
        GcuContext ctx;

        if (ordinal < 0 || ordinal >= cuda_device_count())
                return NULL;
        pthread_mutex_lock(&ctx_lock);
        ctx = devices[ordinal].ctx;
        pthread_mutex_unlock(&ctx_lock);
        return ctx;
}

int cuda_check_stream(gpuipc_t *c, int ordinal, GcuStream s, const char *what)
{
        GcuContext ctx = NULL;
        GcuDevice dev = -1;
        GcuResult cr;
        int r;

        if (!s)
                return 0;
        cr = CU(cuStreamGetCtx, s, &ctx);
        if (cr != GCU_SUCCESS)
                return cuda_error_why(c, "cuStreamGetCtx", cr, "is the stream valid and not yet destroyed?");
        if (ctx == cuda_primary_ctx(ordinal))
                return 0;
        cr = CU(cuCtxPushCurrent, ctx);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuCtxPushCurrent", cr);
        cr = CU(cuCtxGetDevice, &dev);
        r = cuda_ctx_pop(c, cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuCtxGetDevice", cr));
        if (r < 0)
                return r;
        if (dev != cuda_device(ordinal)) {
                client_errmsg(c, "the stream belongs to another device than the one %s (device %d, %s): use a "
                              "stream of that device, or map it after gpuipc_set_device() named the stream's device",
                              what, ordinal, cuda_device_uuid(ordinal));
                return GPUIPC_E_DEVICE;
        }
        return 0;
}

int cuda_ctx_push(gpuipc_t *c, int ordinal)
{
        GcuContext ctx;
        GcuResult cr;
        int r;

        r = cuda_require(c);
        if (r < 0)
                return r;
        r = cuda_check_device(c, ordinal);
        if (r < 0)
                return r;
        r = primary_ctx(c, ordinal, &ctx);
        if (r < 0)
                return r;
        cr = CU(cuCtxPushCurrent, ctx);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuCtxPushCurrent", cr);
        return 0;
}

int cuda_ctx_pop(gpuipc_t *c, int r)
{
        GcuContext ctx;
        GcuResult cr = CU(cuCtxPopCurrent, &ctx);

        if (cr != GCU_SUCCESS && r == 0)
                return cuda_error(c, "cuCtxPopCurrent", cr);
        return r;
}

int cuda_sync(gpuipc_t *c, int ordinal)
{
        GcuResult cr;
        int r;

        r = cuda_ctx_push(c, ordinal);
        if (r < 0)
                return r;
        cr = CU(cuCtxSynchronize);
        return cuda_ctx_pop(c, cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuCtxSynchronize", cr));
}

static int copy_in_ctx(gpuipc_t *c, GcuDevicePtr dptr, void *host, size_t len, bool to_host)
{
        GcuResult cr;

        if (to_host) {
                cr = CU(cuMemcpyDtoH, host, dptr, len);
                return cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuMemcpyDtoH", cr);
        }
        cr = CU(cuMemcpyHtoD, dptr, host, len);
        if (cr != GCU_SUCCESS)
                return cuda_error(c, "cuMemcpyHtoD", cr);
        /* From pageable memory the copy may still be in flight when cuMemcpyHtoD returns; another
         * process reading the buffer next is not ordered after it. */
        cr = CU(cuCtxSynchronize);
        return cr == GCU_SUCCESS ? 0 : cuda_error(c, "cuCtxSynchronize", cr);
}

int cuda_copy(gpuipc_t *c, void *ptr, int ordinal, void *host, size_t len, bool to_host)
{
        int r;

        r = cuda_ctx_push(c, ordinal);
        if (r < 0)
                return r;
        r = copy_in_ctx(c, (GcuDevicePtr)(uintptr_t)ptr, host, len, to_host);
        return cuda_ctx_pop(c, r);
}

/* Copies per cuMemcpyBatchAsync call: its arrays live on the stack. */
#define COPY_BATCH_MAX 256

/* copy_batched()'s answer when the driver refused the first batch as unsupported: nothing queued. */
#define COPY_BATCH_UNSUPPORTED 1

/* The copies in as few driver calls as cuMemcpyBatchAsync allows. Measured on an H200 for a state
 * dict's 201 copies (2 GB): 1.0 ms of host time one call each, 0.73 ms batched (the driver still
 * works per copy), 1.64 ms on the GPU either way. 0, COPY_BATCH_UNSUPPORTED (the caller copies one
 * by one), or an error. */
static int copy_batched(gpuipc_t *c, void *base, const gpuipc_copy_t *items, size_t n, GcuStream s)
{
        GcuDevicePtr dsts[COPY_BATCH_MAX], srcs[COPY_BATCH_MAX];
        size_t sizes[COPY_BATCH_MAX], first_attr = 0;
        GcuMemcpyAttributes attrs = { .src_access_order = GCU_MEMCPY_SRC_ACCESS_ORDER_STREAM };
        /* The batch refuses the legacy default stream; this thread's default stream is a blocking
         * stream, so its work is ordered after the legacy stream's queued work and before its later work. */
        GcuStream stream = s ? s : GCU_STREAM_PER_THREAD;
        size_t i = 0;
        bool queued = false;

        while (i < n) {
                size_t k = 0;
                GcuResult cr;

                for (; i < n && k < COPY_BATCH_MAX; i++) {
                        if (!items[i].len)
                                continue; /* the batch takes no empty copies */
                        dsts[k] = (GcuDevicePtr)(uintptr_t)base + items[i].offset;
                        srcs[k] = (GcuDevicePtr)items[i].src;
                        sizes[k++] = items[i].len;
                }
                if (!k)
                        break;
                cr = CU(cuMemcpyBatchAsync, dsts, srcs, sizes, k, &attrs, &first_attr, 1, stream);
                if (cr == GCU_ERROR_NOT_SUPPORTED && !queued)
                        return COPY_BATCH_UNSUPPORTED;
                if (cr != GCU_SUCCESS)
                        return cuda_error(c, "cuMemcpyBatchAsync", cr);
                queued = true;
        }
        return 0;
}

static int copy_batch_in_ctx(gpuipc_t *c, void *base, int ordinal, const gpuipc_copy_t *items, size_t n,
                             GcuStream s)
{
        int r = cuda_check_stream(c, ordinal, s, "the buffer lives on");

        if (r == 0 && gcu.cuMemcpyBatchAsync && n > 1) {
                r = copy_batched(c, base, items, n, s);
                if (r != COPY_BATCH_UNSUPPORTED)
                        return r;
                r = 0;
        }
        for (size_t i = 0; r == 0 && i < n; i++) {
                GcuResult cr = CU(cuMemcpyDtoDAsync, (GcuDevicePtr)(uintptr_t)base + items[i].offset,
                                  (GcuDevicePtr)items[i].src, items[i].len, s);
                if (cr != GCU_SUCCESS)
                        r = cuda_error(c, "cuMemcpyDtoDAsync", cr);
        }
        return r;
}

int cuda_copy_batch(gpuipc_t *c, void *base, int ordinal, const gpuipc_copy_t *items, size_t n, GcuStream s)
{
        int r = cuda_ctx_push(c, ordinal);

        if (r < 0)
                return r;
        return cuda_ctx_pop(c, copy_batch_in_ctx(c, base, ordinal, items, n, s));
}

/* ---- gpuipcctl doctor ---- */

static void fact_failed(CudaFact *f, const char *call, GcuResult r)
{
        f->ok = false;
        snprintf(f->why, sizeof(f->why), "%s failed: %s (%s)", call, error_name(r), error_string(r));
}

static void fact_attribute(CudaFact *f, int ordinal, unsigned int attribute)
{
        GcuResult r = cuda_attribute(ordinal, attribute, &f->value);

        if (r != GCU_SUCCESS) {
                fact_failed(f, "cuDeviceGetAttribute", r);
                return;
        }
        f->ok = true;
        f->value = f->value != 0;
}

static void describe_device(CudaDeviceInfo *d, int ordinal)
{
        GcuDevice dev = devices[ordinal].dev;
        GcuResult r;
        bool memops = false;
        int mig = -1;

        d->ordinal = ordinal;
        r = CU(cuDeviceGetName, d->name.text, (int)sizeof(d->name.text), dev);
        if (r != GCU_SUCCESS)
                fact_failed(&d->name, "cuDeviceGetName", r);
        else
                d->name.ok = true;

        r = device_uuid(dev, d->uuid.text, sizeof(d->uuid.text), d->gpu_uuid.text, sizeof(d->gpu_uuid.text), &mig);
        if (r != GCU_SUCCESS) {
                fact_failed(&d->uuid, "cuDeviceGetUuid", r);
                fact_failed(&d->gpu_uuid, "cuDeviceGetUuid", r);
        } else {
                d->uuid.ok = d->gpu_uuid.ok = true;
        }
        d->mig.ok = mig >= 0;
        d->mig.value = mig > 0;
        if (mig < 0)
                snprintf(d->mig.why, sizeof(d->mig.why), "needs both cuDeviceGetUuid and cuDeviceGetUuid_v2 "
                         "(driver 11.4 or later)");

        fact_attribute(&d->vmm, ordinal, GCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
        fact_attribute(&d->posix_fd, ordinal, GCU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
        r = cuda_can_mem_ops_64(ordinal, &memops);
        if (r != GCU_SUCCESS)
                fact_failed(&d->mem_ops_64, "cuDeviceGetAttribute", r);
        else
                d->mem_ops_64 = (CudaFact){ .ok = true, .value = memops };

        r = CU(cuDeviceGetPCIBusId, d->pci_bus_id.text, (int)sizeof(d->pci_bus_id.text), dev);
        if (r != GCU_SUCCESS)
                fact_failed(&d->pci_bus_id, "cuDeviceGetPCIBusId", r);
        else
                d->pci_bus_id.ok = true;
}

_public_ int gpuipc_cuda_describe(gpuipc_cuda_info_t *ret)
{
        memset(ret, 0, sizeof(*ret));
        if (cuda_load() < 0) {
                snprintf(ret->reason, sizeof(ret->reason), "%s", load_reason);
                return GPUIPC_E_NO_CUDA;
        }
        ret->loaded = true;
        ret->driver_version = driver_version;
        ret->n_devices = n_devices;
        for (int i = 0; i < n_devices; i++)
                describe_device(&ret->devices[i], i);
        return 0;
}

int cuda_kind_copy(void *ptr, int ordinal, void *host, size_t len, bool to_host)
{
        return cuda_copy(NULL, ptr, ordinal, host, len, to_host);
}
