/* The CUDA driver API as libgpuipc uses it: loaded at run time (dlopen libcuda.so.1), so that the
 * library builds without CUDA headers and starts on machines without a driver. The few types,
 * constants and entry points it needs are declared here; tests/unit/test-cuda-abi.c checks every
 * value, layout and signature against the real <cuda.h>. Then the helpers the CUDA kinds share:
 * loading, error messages, devices and their primary contexts. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuipc.h"
#include "proto.h"

/* ---- types ---- */

typedef unsigned int GcuResult;            /* CUresult (an enum without negative values) */
typedef int GcuDevice;                     /* CUdevice */
typedef unsigned long long GcuDevicePtr;   /* CUdeviceptr */
typedef unsigned long long GcuMemHandle;   /* CUmemGenericAllocationHandle */
/* Opaque handles carry the driver's own struct tags (never defined anywhere), so that the ABI
 * test can compare our signatures with <cuda.h>'s type for type. */
typedef struct CUctx_st *GcuContext;       /* CUcontext */
typedef struct CUstream_st *GcuStream;     /* CUstream */
typedef struct CUevent_st *GcuEvent;       /* CUevent */

typedef struct GcuUuid {                   /* CUuuid */
        char bytes[16];
} GcuUuid;

typedef struct GcuIpcMemHandle {           /* CUipcMemHandle: passed by value */
        char reserved[64];
} GcuIpcMemHandle;

typedef struct GcuIpcEventHandle {         /* CUipcEventHandle: passed by value */
        char reserved[64];
} GcuIpcEventHandle;

typedef struct GcuMemLocation {            /* CUmemLocation */
        int type;                          /* GCU_MEM_LOCATION_TYPE_* */
        int id;                            /* device ordinal for GCU_MEM_LOCATION_TYPE_DEVICE */
} GcuMemLocation;

typedef struct GcuMemAllocationProp {      /* CUmemAllocationProp */
        int type;                          /* GCU_MEM_ALLOCATION_TYPE_* */
        int requested_handle_types;        /* GCU_MEM_HANDLE_TYPE_* */
        GcuMemLocation location;
        void *win32_handle_meta_data;      /* NULL on Linux */
        struct {
                unsigned char compression_type;
                unsigned char gpu_direct_rdma_capable;
                unsigned short usage;
                unsigned char reserved[4];
        } alloc_flags;
} GcuMemAllocationProp;

typedef struct GcuMemAccessDesc {          /* CUmemAccessDesc */
        GcuMemLocation location;
        int flags;                         /* GCU_MEM_ACCESS_FLAGS_* */
} GcuMemAccessDesc;

typedef struct GcuMemcpyAttributes {       /* CUmemcpyAttributes: one set for a whole batch of copies */
        int src_access_order;              /* GCU_MEMCPY_SRC_ACCESS_ORDER_* */
        GcuMemLocation src_loc_hint;       /* hints for managed memory only: zero */
        GcuMemLocation dst_loc_hint;
        unsigned int flags;
} GcuMemcpyAttributes;

/* ---- constants ---- */

enum {
        GCU_SUCCESS = 0,
        GCU_ERROR_INVALID_VALUE = 1,
        GCU_ERROR_OUT_OF_MEMORY = 2,
        GCU_ERROR_NOT_INITIALIZED = 3,
        GCU_ERROR_DEINITIALIZED = 4,
        GCU_ERROR_STUB_LIBRARY = 34,
        GCU_ERROR_CALL_REQUIRES_NEWER_DRIVER = 36,
        GCU_ERROR_DEVICE_UNAVAILABLE = 46,
        GCU_ERROR_NO_DEVICE = 100,
        GCU_ERROR_INVALID_DEVICE = 101,
        GCU_ERROR_INVALID_CONTEXT = 201,
        GCU_ERROR_MAP_FAILED = 205,
        GCU_ERROR_NOT_READY = 600,
        GCU_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
        GCU_ERROR_OPERATING_SYSTEM = 304,
        GCU_ERROR_INVALID_HANDLE = 400,
        GCU_ERROR_NOT_FOUND = 500,
        GCU_ERROR_ILLEGAL_ADDRESS = 700,
        GCU_ERROR_TOO_MANY_PEERS = 711,
        GCU_ERROR_NOT_PERMITTED = 800,
        GCU_ERROR_NOT_SUPPORTED = 801,
        GCU_ERROR_SYSTEM_NOT_READY = 802,
        GCU_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
        GCU_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
        GCU_ERROR_UNKNOWN = 999,
};

/* Not a CUDA code: what CU() returns when this driver does not have the entry point at all. */
#define GCU_ERROR_MISSING_ENTRY 0x7ffffffeu

enum {
        GCU_DEVICE_ATTRIBUTE_COMPUTE_MODE = 20,
        GCU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
        GCU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1 = 93, /* drivers before 12.0 */
        GCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
        GCU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
        GCU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 122,
};

enum {
        GCU_COMPUTEMODE_PROHIBITED = 2,
};

enum {
        GCU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
        GCU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
        GCU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
};

enum {
        GCU_MEMORYTYPE_DEVICE = 2,
};

enum {
        GCU_MEM_ALLOCATION_TYPE_PINNED = 1,
        GCU_MEM_LOCATION_TYPE_DEVICE = 1,
        GCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
        GCU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
        GCU_MEM_ACCESS_FLAGS_PROT_READ = 1,
        GCU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
};

enum {
        GCU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
        GCU_STREAM_NON_BLOCKING = 1,
        GCU_STREAM_WAIT_VALUE_GEQ = 0,
        GCU_EVENT_DISABLE_TIMING = 2,
        GCU_EVENT_INTERPROCESS = 4,
        GCU_STREAM_WRITE_VALUE_DEFAULT = 0,
        GCU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
        GCU_GET_PROC_ADDRESS_SUCCESS = 0,
};

enum {
        GCU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1,
};

/* The calling thread's default stream (CU_STREAM_PER_THREAD): an ordinary blocking stream, so work
 * in it is ordered with the legacy default stream's, which the batched copy may not be given. */
#define GCU_STREAM_PER_THREAD ((GcuStream)(uintptr_t)0x2)

/* ---- entry points ----
 *
 * X(member, symbol, version, exported name, parameters), where version is the CUDA version whose
 * ABI the parameters describe: cuGetProcAddress(symbol, version) returns exactly that variant, and
 * the exported name is its fallback for dlsym(). T(cuda type, our type) lets the ABI test expand
 * the same list with <cuda.h>'s struct types. The member names are what the code calls. */
#define GCU_FUNCTIONS(X, T)                                                                                     \
        X(cuInit, cuInit, 2000, "cuInit", (unsigned int flags))                                                 \
        X(cuDriverGetVersion, cuDriverGetVersion, 2020, "cuDriverGetVersion", (int *version))                   \
        X(cuGetErrorName, cuGetErrorName, 6000, "cuGetErrorName", (GcuResult error, const char **str))          \
        X(cuGetErrorString, cuGetErrorString, 6000, "cuGetErrorString", (GcuResult error, const char **str))    \
        X(cuDeviceGetCount, cuDeviceGetCount, 2000, "cuDeviceGetCount", (int *count))                           \
        X(cuDeviceGet, cuDeviceGet, 2000, "cuDeviceGet", (GcuDevice *device, int ordinal))                      \
        X(cuDeviceGetName, cuDeviceGetName, 2000, "cuDeviceGetName", (char *name, int len, GcuDevice dev))      \
        /* v1: the physical GPU's UUID even for a MIG instance */                                               \
        X(cuDeviceGetUuid_v1, cuDeviceGetUuid, 9020, "cuDeviceGetUuid",                                         \
          (T(CUuuid, GcuUuid) *uuid, GcuDevice dev))                                                            \
        /* v2: a MIG instance's own UUID */                                                                     \
        X(cuDeviceGetUuid, cuDeviceGetUuid, 11040, "cuDeviceGetUuid_v2",                                        \
          (T(CUuuid, GcuUuid) *uuid, GcuDevice dev))                                                            \
        X(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000, "cuDeviceGetAttribute",                             \
          (int *value, unsigned int attribute, GcuDevice dev))                                                  \
        X(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId, 4010, "cuDeviceGetPCIBusId",                                \
          (char *id, int len, GcuDevice dev))                                                                   \
        X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, "cuDevicePrimaryCtxRetain",                 \
          (GcuContext *ctx, GcuDevice dev))                                                                     \
        X(cuCtxPushCurrent, cuCtxPushCurrent, 4000, "cuCtxPushCurrent_v2", (GcuContext ctx))                    \
        X(cuCtxPopCurrent, cuCtxPopCurrent, 4000, "cuCtxPopCurrent_v2", (GcuContext *ctx))                      \
        /* the CUDA 13 variants of these two take a context: we want the classic ones */                       \
        X(cuCtxSynchronize, cuCtxSynchronize, 2000, "cuCtxSynchronize", (void))                                 \
        X(cuCtxGetDevice, cuCtxGetDevice, 2000, "cuCtxGetDevice", (GcuDevice *device))                          \
        X(cuPointerGetAttribute, cuPointerGetAttribute, 4000, "cuPointerGetAttribute",                          \
          (void *data, unsigned int attribute, GcuDevicePtr ptr))                                               \
        X(cuMemAlloc, cuMemAlloc, 3020, "cuMemAlloc_v2", (GcuDevicePtr *dptr, size_t size))                     \
        X(cuMemFree, cuMemFree, 3020, "cuMemFree_v2", (GcuDevicePtr dptr))                                      \
        X(cuMemGetAddressRange, cuMemGetAddressRange, 3020, "cuMemGetAddressRange_v2",                          \
          (GcuDevicePtr *base, size_t *size, GcuDevicePtr dptr))                                                \
        X(cuMemcpyDtoH, cuMemcpyDtoH, 3020, "cuMemcpyDtoH_v2", (void *dst, GcuDevicePtr src, size_t n))         \
        X(cuMemcpyHtoD, cuMemcpyHtoD, 3020, "cuMemcpyHtoD_v2", (GcuDevicePtr dst, const void *src, size_t n))   \
        X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync, 3020, "cuMemcpyDtoHAsync_v2",                                   \
          (void *dst, GcuDevicePtr src, size_t n, GcuStream stream))                                            \
        X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync, 3020, "cuMemcpyHtoDAsync_v2",                                   \
          (GcuDevicePtr dst, const void *src, size_t n, GcuStream stream))                                      \
        /* page-locked staging for gpuipc_buffer_load, and the device's free memory */                          \
        X(cuMemAllocHost, cuMemAllocHost, 3020, "cuMemAllocHost_v2", (void **ptr, size_t size))                 \
        X(cuMemFreeHost, cuMemFreeHost, 2000, "cuMemFreeHost", (void *ptr))                                     \
        X(cuMemGetInfo, cuMemGetInfo, 3020, "cuMemGetInfo_v2", (size_t *free, size_t *total))                   \
        X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync, 3020, "cuMemcpyDtoDAsync_v2",                                   \
          (GcuDevicePtr dst, GcuDevicePtr src, size_t n, GcuStream stream))                                     \
        /* CUDA 13's (12.8's had a failIdx parameter more): many copies for one call's host cost */          \
        X(cuMemcpyBatchAsync, cuMemcpyBatchAsync, 13000, "cuMemcpyBatchAsync_v2",                               \
          (GcuDevicePtr *dsts, GcuDevicePtr *srcs, size_t *sizes, size_t count,                                 \
           T(CUmemcpyAttributes, GcuMemcpyAttributes) *attrs, size_t *attrs_idxs, size_t num_attrs,             \
           GcuStream stream))                                                                                   \
        X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, 10020, "cuMemGetAllocationGranularity", \
          (size_t *granularity, const T(CUmemAllocationProp, GcuMemAllocationProp) *prop, unsigned int option)) \
        X(cuMemCreate, cuMemCreate, 10020, "cuMemCreate",                                                       \
          (GcuMemHandle *handle, size_t size, const T(CUmemAllocationProp, GcuMemAllocationProp) *prop,         \
           unsigned long long flags))                                                                           \
        X(cuMemRelease, cuMemRelease, 10020, "cuMemRelease", (GcuMemHandle handle))                             \
        X(cuMemAddressReserve, cuMemAddressReserve, 10020, "cuMemAddressReserve",                               \
          (GcuDevicePtr *ptr, size_t size, size_t alignment, GcuDevicePtr addr, unsigned long long flags))      \
        X(cuMemAddressFree, cuMemAddressFree, 10020, "cuMemAddressFree", (GcuDevicePtr ptr, size_t size))       \
        X(cuMemMap, cuMemMap, 10020, "cuMemMap",                                                                \
          (GcuDevicePtr ptr, size_t size, size_t offset, GcuMemHandle handle, unsigned long long flags))        \
        X(cuMemUnmap, cuMemUnmap, 10020, "cuMemUnmap", (GcuDevicePtr ptr, size_t size))                         \
        X(cuMemSetAccess, cuMemSetAccess, 10020, "cuMemSetAccess",                                              \
          (GcuDevicePtr ptr, size_t size, const T(CUmemAccessDesc, GcuMemAccessDesc) *desc, size_t count))      \
        X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, "cuMemExportToShareableHandle",    \
          (void *shareable, GcuMemHandle handle, unsigned int type, unsigned long long flags))                  \
        X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020,                                \
          "cuMemImportFromShareableHandle", (GcuMemHandle *handle, void *os_handle, unsigned int type))         \
        X(cuMemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle, 10020,                \
          "cuMemGetAllocationPropertiesFromHandle",                                                             \
          (T(CUmemAllocationProp, GcuMemAllocationProp) *prop, GcuMemHandle handle))                            \
        X(cuIpcGetMemHandle, cuIpcGetMemHandle, 4010, "cuIpcGetMemHandle",                                      \
          (T(CUipcMemHandle, GcuIpcMemHandle) *handle, GcuDevicePtr dptr))                                      \
        X(cuIpcOpenMemHandle, cuIpcOpenMemHandle, 11000, "cuIpcOpenMemHandle_v2",                               \
          (GcuDevicePtr *dptr, T(CUipcMemHandle, GcuIpcMemHandle) handle, unsigned int flags))                  \
        X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, 4010, "cuIpcCloseMemHandle", (GcuDevicePtr dptr))           \
        X(cuStreamCreate, cuStreamCreate, 2000, "cuStreamCreate", (GcuStream *stream, unsigned int flags))      \
        X(cuStreamDestroy, cuStreamDestroy, 4000, "cuStreamDestroy_v2", (GcuStream stream))                     \
        X(cuStreamSynchronize, cuStreamSynchronize, 2000, "cuStreamSynchronize", (GcuStream stream))            \
        X(cuStreamGetCtx, cuStreamGetCtx, 9020, "cuStreamGetCtx", (GcuStream stream, GcuContext *ctx))          \
        X(cuStreamWriteValue64, cuStreamWriteValue64, 11070, "cuStreamWriteValue64_v2",                         \
          (GcuStream stream, GcuDevicePtr addr, uint64_t value, unsigned int flags))                            \
        X(cuStreamWaitValue64, cuStreamWaitValue64, 11070, "cuStreamWaitValue64_v2",                            \
          (GcuStream stream, GcuDevicePtr addr, uint64_t value, unsigned int flags))                            \
        X(cuEventCreate, cuEventCreate, 2000, "cuEventCreate", (GcuEvent *event, unsigned int flags))           \
        X(cuEventDestroy, cuEventDestroy, 4000, "cuEventDestroy_v2", (GcuEvent event))                          \
        X(cuEventRecord, cuEventRecord, 2000, "cuEventRecord", (GcuEvent event, GcuStream stream))              \
        X(cuEventQuery, cuEventQuery, 2000, "cuEventQuery", (GcuEvent event))                                   \
        X(cuEventSynchronize, cuEventSynchronize, 2000, "cuEventSynchronize", (GcuEvent event))                 \
        X(cuStreamWaitEvent, cuStreamWaitEvent, 3020, "cuStreamWaitEvent",                                      \
          (GcuStream stream, GcuEvent event, unsigned int flags))                                               \
        X(cuIpcGetEventHandle, cuIpcGetEventHandle, 4010, "cuIpcGetEventHandle",                                \
          (T(CUipcEventHandle, GcuIpcEventHandle) *handle, GcuEvent event))                                     \
        X(cuIpcOpenEventHandle, cuIpcOpenEventHandle, 4010, "cuIpcOpenEventHandle",                             \
          (GcuEvent *event, T(CUipcEventHandle, GcuIpcEventHandle) handle))

#define GCU_OURS(cuda_type, our_type) our_type
#define GCU_MEMBER(member, symbol, version, exported, params) GcuResult (*member) params;

/* Every entry point is NULL until cuda_load() succeeded, and stays NULL where the driver lacks it. */
typedef struct CudaApi {
        GCU_FUNCTIONS(GCU_MEMBER, GCU_OURS)
} CudaApi;

extern CudaApi gcu;

/* Calls an entry point: its CUDA result, or GCU_ERROR_MISSING_ENTRY when the driver lacks it. */
#define CU(fn, ...) (gcu.fn ? gcu.fn(__VA_ARGS__) : (GcuResult)GCU_ERROR_MISSING_ENTRY)

/* The resolvers themselves, found with dlsym(). */
typedef GcuResult (*GcuGetProcAddress)(const char *symbol, void **pfn, int version, uint64_t flags);
typedef GcuResult (*GcuGetProcAddressV2)(const char *symbol, void **pfn, int version, uint64_t flags,
                                         unsigned int *status);

/* ---- loading ---- */

#define CUDA_MAX_DEVICES PROTO_MAX_GPUS

/* Loads libcuda.so.1 ($GPUIPC_LIBCUDA if set), resolves the entry points, runs cuInit and lists
 * the devices, once per process (thread-safe). 0, or GPUIPC_E_NO_CUDA: cuda_load_error() says
 * why in plain words. Later calls return the first outcome. */
int cuda_load(void);
const char *cuda_load_error(void);

/* cuda_load(); on failure also puts its reason into c's errmsg (c may be NULL). */
int cuda_require(gpuipc_t *c);

/* ---- errors ---- */

/* Puts "<call> failed: <CUDA_ERROR_NAME> (<CUDA's words>): <why>" into c's errmsg and returns
 * GPUIPC_E_CUDA. why NULL: a hint chosen by the error code. c may be NULL (only the code then). */
int cuda_error(gpuipc_t *c, const char *call, GcuResult r);
int cuda_error_why(gpuipc_t *c, const char *call, GcuResult r, const char *why);

/* ---- devices ---- */

/* Devices this process sees (0 before a successful cuda_load()). */
int cuda_device_count(void);

/* GPUIPC_E_DEVICE with a message unless 0 <= ordinal < cuda_device_count(). */
int cuda_check_device(gpuipc_t *c, int ordinal);

/* The CUdevice of a checked ordinal. */
GcuDevice cuda_device(int ordinal);

/* "GPU-<uuid>" or, for a MIG instance, "MIG-<uuid>"; "" when unknown. */
const char *cuda_device_uuid(int ordinal);

/* The ordinal whose UUID is uuid (case does not matter), or -1. */
int cuda_device_by_uuid(const char *uuid);

/* The device attribute's value into *ret; the CUDA result. */
GcuResult cuda_attribute(int ordinal, unsigned int attribute, int *ret);

/* Whether the device can run cuStreamWriteValue64/cuStreamWaitValue64: 0 with *ret set, or the
 * CUDA result of the query. */
GcuResult cuda_can_mem_ops_64(int ordinal, bool *ret);

/* Visible GPU UUIDs for hello: never fails, 0 when CUDA is unusable. */
uint32_t cuda_visible_gpus(char out[][PROTO_MAX_UUID + 1], uint32_t max);

/* The device an import maps onto: gpuipc_set_device()'s choice; else the buffer's own GPU
 * (uuid) when this process sees it; else device 0, with *ret_guessed set, since peer access
 * may still reach a GPU this process does not list. 0 or GPUIPC_E_DEVICE / GPUIPC_E_NO_CUDA. */
int cuda_import_device(gpuipc_t *c, const char *uuid, int *ret_ordinal, bool *ret_guessed);

/* Turns the CUDA failure now in c's errmsg into GPUIPC_E_DEVICE naming both GPUs: the buffer
 * lives on uuid, which this process does not see, and mapping it onto ordinal failed. */
int cuda_device_unreachable(gpuipc_t *c, const char *uuid, int ordinal);

/* ---- contexts ---- */

/* Makes the primary context of ordinal current on this thread, retaining it the first time it
 * is needed (it then stays retained for the life of the process; it is the context the runtime
 * API uses too). Every successful push must be paired with cuda_ctx_pop(), so that the caller's
 * own current context is back when we return. */
int cuda_ctx_push(gpuipc_t *c, int ordinal);

/* Work in a stream must run on the device whose memory it touches: for memory no other device was
 * given access, and a fault there would break the caller's context for good. NULL means the legacy
 * default stream of the context we push, which is right by construction. what completes "the
 * stream belongs to another device than the one ..." (e.g. "the fence is mapped on"). */
int cuda_check_stream(gpuipc_t *c, int ordinal, GcuStream s, const char *what);

/* Pops what cuda_ctx_push() pushed. Returns r, or the pop's error if r was 0 (a pop fails only
 * when code in between popped our context itself). Usage: return cuda_ctx_pop(c, work(c)); */
int cuda_ctx_pop(gpuipc_t *c, int r);

/* The primary context of ordinal if it was retained, else NULL. */
GcuContext cuda_primary_ctx(int ordinal);

/* cuCtxSynchronize in ordinal's primary context: prior GPU work is complete and visible. */
int cuda_sync(gpuipc_t *c, int ordinal);

/* Copies len bytes between device memory at ptr (on ordinal) and host memory, in ordinal's
 * primary context. Host-to-device copies are complete on return. c may be NULL. */
int cuda_copy(gpuipc_t *c, void *ptr, int ordinal, void *host, size_t len, bool to_host);

/* Queues n device-to-device copies into the memory at base (on ordinal) in stream s (NULL: the
 * legacy default stream of ordinal's primary context): items[i].len bytes from items[i].src to base
 * + items[i].offset. The caller checked the ranges. */
int cuda_copy_batch(gpuipc_t *c, void *base, int ordinal, const gpuipc_copy_t *items, size_t n, GcuStream s);

/* cuda_copy with the KindOps.copy signature, for both CUDA kinds. */
int cuda_kind_copy(void *ptr, int ordinal, void *host, size_t len, bool to_host);

/* ---- gpuipcctl doctor ---- */

/* The facts gpuipc_cuda_describe() reports are the public structs (gpuipc.h). */
typedef gpuipc_cuda_fact_t CudaFact;
typedef gpuipc_cuda_device_t CudaDeviceInfo;
typedef gpuipc_cuda_info_t CudaInfo;

_Static_assert(CUDA_MAX_DEVICES == GPUIPC_MAX_GPUS, "gpuipc_cuda_info_t describes every device");

/* gpuipc_cuda_describe() (gpuipc.h) is defined in cuda.c; the library's tests call it too. */

