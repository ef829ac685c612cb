/* client/cuda.h against the real <cuda.h>: every constant, struct layout and entry-point
 * signature libgpuipc declares for itself, checked at compile time (building this file is the
 * test). Built only where the CUDA headers are installed. */

/* Ours first: <cuda.h> renames entry points by macro (cuMemAlloc -> cuMemAlloc_v2). Included
 * by its path because the directory of client/ would otherwise shadow <cuda.h>. */
#include "../../client/cuda.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stddef.h>
#include <stdio.h>

#define SAME_VALUE(ours, theirs) \
        _Static_assert((long long)(ours) == (long long)(theirs), #ours " differs from " #theirs);

#define SAME_TYPE(ours, theirs) \
        _Static_assert(__builtin_types_compatible_p(ours, theirs), #ours " differs from " #theirs);

#define SAME_LAYOUT(ours, theirs)                                                                 \
        _Static_assert(sizeof(ours) == sizeof(theirs), "size of " #ours " differs from " #theirs); \
        _Static_assert(_Alignof(ours) == _Alignof(theirs), "alignment of " #ours " differs from " #theirs);

#define SAME_FIELD(ours, our_field, theirs, their_field)                                            \
        _Static_assert(offsetof(ours, our_field) == offsetof(theirs, their_field),                 \
                       "offset of " #ours "." #our_field " differs from " #theirs "." #their_field); \
        _Static_assert(sizeof(((ours *)0)->our_field) == sizeof(((theirs *)0)->their_field),      \
                       "size of " #ours "." #our_field " differs from " #theirs "." #their_field);

/* ---- scalar and handle types ---- */

SAME_TYPE(GcuResult, CUresult)
SAME_TYPE(GcuDevice, CUdevice)
SAME_TYPE(GcuDevicePtr, CUdeviceptr)
SAME_TYPE(GcuMemHandle, CUmemGenericAllocationHandle)
SAME_TYPE(GcuContext, CUcontext)
SAME_TYPE(GcuStream, CUstream)
SAME_TYPE(GcuEvent, CUevent)
SAME_TYPE(uint64_t, cuuint64_t)

/* ---- structs ---- */

SAME_LAYOUT(GcuUuid, CUuuid)
SAME_FIELD(GcuUuid, bytes, CUuuid, bytes)

SAME_LAYOUT(GcuIpcMemHandle, CUipcMemHandle)
SAME_FIELD(GcuIpcMemHandle, reserved, CUipcMemHandle, reserved)
SAME_VALUE(sizeof(GcuIpcMemHandle), CU_IPC_HANDLE_SIZE)
SAME_VALUE(sizeof(GcuIpcMemHandle), PROTO_LEGACY_HANDLE_SIZE)

SAME_LAYOUT(GcuIpcEventHandle, CUipcEventHandle)
SAME_FIELD(GcuIpcEventHandle, reserved, CUipcEventHandle, reserved)

SAME_LAYOUT(GcuMemLocation, CUmemLocation)
SAME_FIELD(GcuMemLocation, type, CUmemLocation, type)
SAME_FIELD(GcuMemLocation, id, CUmemLocation, id)

SAME_LAYOUT(GcuMemAllocationProp, CUmemAllocationProp)
SAME_FIELD(GcuMemAllocationProp, type, CUmemAllocationProp, type)
SAME_FIELD(GcuMemAllocationProp, requested_handle_types, CUmemAllocationProp, requestedHandleTypes)
SAME_FIELD(GcuMemAllocationProp, location, CUmemAllocationProp, location)
SAME_FIELD(GcuMemAllocationProp, win32_handle_meta_data, CUmemAllocationProp, win32HandleMetaData)
SAME_FIELD(GcuMemAllocationProp, alloc_flags, CUmemAllocationProp, allocFlags)
SAME_FIELD(GcuMemAllocationProp, alloc_flags.compression_type, CUmemAllocationProp, allocFlags.compressionType)
SAME_FIELD(GcuMemAllocationProp, alloc_flags.gpu_direct_rdma_capable, CUmemAllocationProp,
           allocFlags.gpuDirectRDMACapable)
SAME_FIELD(GcuMemAllocationProp, alloc_flags.usage, CUmemAllocationProp, allocFlags.usage)
SAME_FIELD(GcuMemAllocationProp, alloc_flags.reserved, CUmemAllocationProp, allocFlags.reserved)

SAME_LAYOUT(GcuMemAccessDesc, CUmemAccessDesc)
SAME_FIELD(GcuMemAccessDesc, location, CUmemAccessDesc, location)
SAME_FIELD(GcuMemAccessDesc, flags, CUmemAccessDesc, flags)

SAME_LAYOUT(GcuMemcpyAttributes, CUmemcpyAttributes)
SAME_FIELD(GcuMemcpyAttributes, src_access_order, CUmemcpyAttributes, srcAccessOrder)
SAME_FIELD(GcuMemcpyAttributes, src_loc_hint, CUmemcpyAttributes, srcLocHint)
SAME_FIELD(GcuMemcpyAttributes, dst_loc_hint, CUmemcpyAttributes, dstLocHint)
SAME_FIELD(GcuMemcpyAttributes, flags, CUmemcpyAttributes, flags)

/* ---- constants ---- */

SAME_VALUE(GCU_SUCCESS, CUDA_SUCCESS)
SAME_VALUE(GCU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE)
SAME_VALUE(GCU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY)
SAME_VALUE(GCU_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED)
SAME_VALUE(GCU_ERROR_DEINITIALIZED, CUDA_ERROR_DEINITIALIZED)
SAME_VALUE(GCU_ERROR_STUB_LIBRARY, CUDA_ERROR_STUB_LIBRARY)
SAME_VALUE(GCU_ERROR_CALL_REQUIRES_NEWER_DRIVER, CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER)
SAME_VALUE(GCU_ERROR_DEVICE_UNAVAILABLE, CUDA_ERROR_DEVICE_UNAVAILABLE)
SAME_VALUE(GCU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE)
SAME_VALUE(GCU_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE)
SAME_VALUE(GCU_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT)
SAME_VALUE(GCU_ERROR_MAP_FAILED, CUDA_ERROR_MAP_FAILED)
SAME_VALUE(GCU_ERROR_PEER_ACCESS_UNSUPPORTED, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
SAME_VALUE(GCU_ERROR_OPERATING_SYSTEM, CUDA_ERROR_OPERATING_SYSTEM)
SAME_VALUE(GCU_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE)
SAME_VALUE(GCU_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND)
SAME_VALUE(GCU_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_ADDRESS)
SAME_VALUE(GCU_ERROR_TOO_MANY_PEERS, CUDA_ERROR_TOO_MANY_PEERS)
SAME_VALUE(GCU_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED)
SAME_VALUE(GCU_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED)
SAME_VALUE(GCU_ERROR_SYSTEM_NOT_READY, CUDA_ERROR_SYSTEM_NOT_READY)
SAME_VALUE(GCU_ERROR_SYSTEM_DRIVER_MISMATCH, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)
SAME_VALUE(GCU_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)
SAME_VALUE(GCU_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN)
/* Our own marker must never be mistaken for a CUDA code. */
_Static_assert(GCU_ERROR_MISSING_ENTRY > CUDA_ERROR_UNKNOWN, "GCU_ERROR_MISSING_ENTRY collides with CUDA codes");

SAME_VALUE(GCU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)
SAME_VALUE(GCU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
SAME_VALUE(GCU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1)
SAME_VALUE(GCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
SAME_VALUE(GCU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
SAME_VALUE(GCU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)
SAME_VALUE(GCU_COMPUTEMODE_PROHIBITED, CU_COMPUTEMODE_PROHIBITED)

SAME_VALUE(GCU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
SAME_VALUE(GCU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
SAME_VALUE(GCU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)
SAME_VALUE(GCU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE)

SAME_VALUE(GCU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED)
SAME_VALUE(GCU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE)
SAME_VALUE(GCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
SAME_VALUE(GCU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
SAME_VALUE(GCU_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READ)
SAME_VALUE(GCU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)

SAME_VALUE(GCU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
SAME_VALUE(GCU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING)
SAME_VALUE(GCU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_GEQ)
SAME_VALUE(GCU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING)
SAME_VALUE(GCU_EVENT_INTERPROCESS, CU_EVENT_INTERPROCESS)
SAME_VALUE(GCU_ERROR_NOT_READY, CUDA_ERROR_NOT_READY)
SAME_VALUE(GCU_STREAM_WRITE_VALUE_DEFAULT, CU_STREAM_WRITE_VALUE_DEFAULT)
SAME_VALUE(GCU_GET_PROC_ADDRESS_LEGACY_STREAM, CU_GET_PROC_ADDRESS_LEGACY_STREAM)
SAME_VALUE(GCU_GET_PROC_ADDRESS_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS)
SAME_VALUE(GCU_MEMCPY_SRC_ACCESS_ORDER_STREAM, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM)
_Static_assert(GCU_STREAM_PER_THREAD == (GcuStream)CU_STREAM_PER_THREAD, "GCU_STREAM_PER_THREAD differs");

/* ---- entry points ----
 * Each signature must be the one <cudaTypedefs.h> gives the symbol at the version we ask
 * cuGetProcAddress for: a wrong version number fails here as surely as a wrong parameter. */

#define CUDA_TYPE(cuda_type, our_type) cuda_type
#define SAME_SIGNATURE(member, symbol, version, exported, params)                    \
        _Static_assert(__builtin_types_compatible_p(CUresult (*) params,             \
                                                    PFN_##symbol##_v##version),      \
                       #member ": not the signature of " #symbol " at CUDA " #version);
GCU_FUNCTIONS(SAME_SIGNATURE, CUDA_TYPE)

SAME_TYPE(GcuGetProcAddress, PFN_cuGetProcAddress_v11030)
SAME_TYPE(GcuGetProcAddressV2, PFN_cuGetProcAddress_v12000)

/* The member table holds exactly one pointer per entry point. */
#define COUNT_ONE(member, symbol, version, exported, params) +1
_Static_assert(sizeof(CudaApi) == (0 GCU_FUNCTIONS(COUNT_ONE, CUDA_TYPE)) * sizeof(void (*)(void)),
               "CudaApi has a member per entry point");

int main(void)
{
        /* Everything above is checked by the compiler; reaching here means it all agreed. */
        printf("client/cuda.h matches <cuda.h> %d.%d\n", CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
        return 0;
}
