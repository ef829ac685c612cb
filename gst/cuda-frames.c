/* The CUDA-memory variant's copies, on GStreamer 1.22's gstcuda (gst-plugins-bad).
 *
 * gstcuda 1.22 can neither wrap foreign device memory in a GstCudaMemory (gst_cuda_allocator_
 * alloc_wrapped came in 1.24) nor say which stream wrote a memory: a CUDA buffer is complete when it
 * is pushed. So each end copies device to device, on a stream of its own, and waits for the copy
 * before it lets go: gpuipcsink from upstream's buffer into the slot before it publishes (the ring's
 * publish synchronizes the slot's device too), gpuipcsrc from the slot into a buffer of its own pool
 * before it releases the frame and pushes the buffer. A 1080p RGBA frame is 8 MB: a few microseconds
 * of device bandwidth. The hand-over itself is the host ring's (backpressure or latest), not a
 * stream-ordered ring: waiting on a stream until a peer's stream wrote a counter could not be
 * interrupted when the peer dies, while the host ring's waits notice deaths and evictions. */
#include "cuda-frames.h"

#include <gst/cuda/cuda-gst.h>
#include <gst/cuda/gstcudabufferpool.h>
#include <gst/cuda/gstcudacontext.h>
#include <gst/cuda/gstcudaloader.h>
#include <gst/cuda/gstcudamemory.h>
#include <gst/cuda/gstcudautils.h>

#include "frame-meta.h"

GST_DEBUG_CATEGORY_STATIC(gst_gpuipc_cuda_debug);
#define GST_CAT_DEFAULT gst_gpuipc_cuda_debug

struct CudaFrames {
        GstElement *element;   /* its owner (not a reference: the owner frees this first) */
        GstCudaContext *ctx;
        CUstream stream;
        GstBufferPool *pool;   /* gpuipcsrc's output buffers, for pool_info */
        GstVideoInfo pool_info;
};

/* Made lazily (on the first context message or caps), since an element on system-memory caps
 * never needs CUDA and must work on hosts without it. */
static CudaFrames *frames_new(GstElement *element)
{
        static gsize debug_once;
        CudaFrames *cu = g_new0(CudaFrames, 1);

        if (g_once_init_enter(&debug_once)) {
                GST_DEBUG_CATEGORY_INIT(gst_gpuipc_cuda_debug, "gpuipccuda", 0, "gpuipc CUDA copies");
                g_once_init_leave(&debug_once, 1);
        }
        cu->element = element;
        return cu;
}

/* The device of a context, which may have come from the application or a neighbour element
 * (GstContext sharing), not from our device property: the ring's slots must live on it. */
static int context_device(GstCudaContext *ctx)
{
        guint id = 0;

        g_object_get(ctx, "cuda-device-id", &id, NULL);
        return (int)id;
}

/* Posts a CUDA failure of call on the element. */
static gboolean cuda_ok(CudaFrames *cu, CUresult r, const char *call)
{
        const char *name = "?", *text = "?";

        if (r == CUDA_SUCCESS)
                return TRUE;
        CuGetErrorName(r, &name);
        CuGetErrorString(r, &text);
        GST_ELEMENT_ERROR(cu->element, RESOURCE, FAILED, ("%s failed: %s (%s)", call, name, text), (NULL));
        return FALSE;
}

/* Made at the first CUDA caps, not at start: a pipeline of host memory never loads the CUDA driver.
 * A context shared by the pipeline is used when there is one, so that upstream's memory and the
 * slots are on one device and copies stay device to device. */
gboolean cuda_frames_ensure(GstElement *element, CudaFrames **cup, int device)
{
        CudaFrames *cu;
        gboolean ok;

        if (!*cup)
                *cup = frames_new(element);
        cu = *cup;
        if (!cu->ctx) {
                if (!gst_cuda_load_library()) {
                        GST_ELEMENT_ERROR(element, RESOURCE, FAILED,
                                          ("cannot load the CUDA driver (libcuda.so.1): is this a GPU host, "
                                           "with the device mounted into the container?"),
                                          (NULL));
                        return FALSE;
                }
                if (!gst_cuda_ensure_element_context(element, device, &cu->ctx)) {
                        GST_ELEMENT_ERROR(element, RESOURCE, FAILED,
                                          ("no CUDA context for device %d", device), (NULL));
                        return FALSE;
                }
        }
        /* A context shared by the pipeline (gst_cuda_ensure_element_context may find one) can be
         * on another device than the ring's slots: a device-to-device copy across them would need
         * peer access, so the mismatch is an error that names the fix. */
        if (device >= 0 && context_device(cu->ctx) != device) {
                GST_ELEMENT_ERROR(element, RESOURCE, FAILED,
                                  ("the ring's slots are on CUDA device %d, the pipeline's CUDA context on device %d",
                                   device, context_device(cu->ctx)),
                                  ("give the pipeline's CUDA elements cuda-device-id=%d", device));
                return FALSE;
        }
        if (cu->stream)
                return TRUE;
        if (!gst_cuda_context_push(cu->ctx)) {
                GST_ELEMENT_ERROR(element, RESOURCE, FAILED, ("cannot make the CUDA context current"), (NULL));
                return FALSE;
        }
        /* A stream of our own, so waiting for our copy does not wait for other elements' work on
         * the context's default stream. */
        ok = cuda_ok(cu, CuStreamCreate(&cu->stream, CU_STREAM_DEFAULT), "cuStreamCreate");
        gst_cuda_context_pop(NULL);
        return ok;
}

void cuda_frames_free(CudaFrames *cu)
{
        if (!cu)
                return;
        /* The pool and stream go before the context: both belong to it. */
        if (cu->pool) {
                gst_buffer_pool_set_active(cu->pool, FALSE);
                gst_object_unref(cu->pool);
        }
        if (cu->stream && gst_cuda_context_push(cu->ctx)) {
                CuStreamDestroy(cu->stream);
                gst_cuda_context_pop(NULL);
        }
        gst_clear_object(&cu->ctx);
        g_free(cu);
}

int cuda_frames_device(const CudaFrames *cu)
{
        return context_device(cu->ctx);
}

/* A context may be offered before caps: kept for when the first CUDA frame comes. */
void cuda_frames_set_context(GstElement *element, CudaFrames **cup, GstContext *context, int device)
{
        if (!*cup)
                *cup = frames_new(element);
        gst_cuda_handle_set_context(element, context, device, &(*cup)->ctx);
}

gboolean cuda_frames_context_query(CudaFrames *cu, GstQuery *query)
{
        return gst_cuda_handle_context_query(cu->element, query, cu->ctx);
}

/* A CUDA buffer pool on our context with video meta, so upstream writes frames in its own layout
 * and the copy into the slot (cuda_frames_to_slot) takes the layout from the meta. */
static GstBufferPool *new_pool(CudaFrames *cu, GstCaps *caps, guint size)
{
        GstBufferPool *pool = gst_cuda_buffer_pool_new(cu->ctx);
        GstStructure *config = gst_buffer_pool_get_config(pool);

        gst_buffer_pool_config_set_params(config, caps, size, 0, 0);
        gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
        if (!gst_buffer_pool_set_config(pool, config)) {
                gst_object_unref(pool);
                return NULL;
        }
        return pool;
}

gboolean cuda_frames_propose_allocation(CudaFrames *cu, GstQuery *query)
{
        GstBufferPool *pool;
        gboolean need_pool;
        GstVideoInfo info;
        GstCaps *caps;

        gst_query_parse_allocation(query, &caps, &need_pool);
        /* Not being able to propose a pool is not a failure: upstream then allocates its own
         * buffers and the copy into the slot works all the same. */
        if (!cu->ctx || !caps || !gst_video_info_from_caps(&info, caps))
                return TRUE;
        gst_query_add_allocation_meta(query, GST_VIDEO_META_API_TYPE, NULL);
        if (!need_pool)
                return TRUE;
        pool = new_pool(cu, caps, GST_VIDEO_INFO_SIZE(&info));
        if (pool) {
                gst_query_add_allocation_pool(query, pool, GST_VIDEO_INFO_SIZE(&info), 0, 0);
                gst_object_unref(pool);
        }
        return TRUE;
}

/* Copies every plane of a frame of info from src (layout src_info) to dst (layout dst_info), both
 * device pointers, on the stream, and waits for it. */
static gboolean copy_planes(CudaFrames *cu, const GstVideoInfo *info, CUdeviceptr src, const GstVideoInfo *src_info,
                            CUdeviceptr dst, const GstVideoInfo *dst_info)
{
        gboolean ok = TRUE;

        if (!gst_cuda_context_push(cu->ctx)) {
                GST_ELEMENT_ERROR(cu->element, RESOURCE, FAILED, ("cannot make the CUDA context current"), (NULL));
                return FALSE;
        }
        for (guint p = 0; ok && p < GST_VIDEO_INFO_N_PLANES(info); p++) {
                CUDA_MEMCPY2D c = {
                        .srcMemoryType = CU_MEMORYTYPE_DEVICE,
                        .srcDevice = src + GST_VIDEO_INFO_PLANE_OFFSET(src_info, p),
                        .srcPitch = GST_VIDEO_INFO_PLANE_STRIDE(src_info, p),
                        .dstMemoryType = CU_MEMORYTYPE_DEVICE,
                        .dstDevice = dst + GST_VIDEO_INFO_PLANE_OFFSET(dst_info, p),
                        .dstPitch = GST_VIDEO_INFO_PLANE_STRIDE(dst_info, p),
                        /* A row's bytes, and the padding the narrower layout has (copying it is harmless). */
                        .WidthInBytes = MIN(GST_VIDEO_INFO_PLANE_STRIDE(src_info, p),
                                            GST_VIDEO_INFO_PLANE_STRIDE(dst_info, p)),
                        .Height = frame_plane_rows(info, p),
                };

                ok = cuda_ok(cu, CuMemcpy2DAsync(&c, cu->stream), "cuMemcpy2DAsync");
        }
        /* Waited for before returning: gstcuda 1.22 cannot attach a stream to a memory, so the
         * only way to say "complete" to whoever reads dst next is to be done. */
        if (ok)
                ok = cuda_ok(cu, CuStreamSynchronize(cu->stream), "cuStreamSynchronize");
        gst_cuda_context_pop(NULL);
        return ok;
}

/* buf's one GstCudaMemory, mapped as device memory with flags. */
static GstCudaMemory *map_cuda(CudaFrames *cu, GstBuffer *buf, GstMapInfo *map, GstMapFlags flags)
{
        /* One memory only: a buffer of several would need a copy per memory at its own offsets,
         * which this element does not do; the error says so rather than copying part of it. */
        GstMemory *mem = gst_buffer_n_memory(buf) == 1 ? gst_buffer_peek_memory(buf, 0) : NULL;

        if (!mem || !gst_is_cuda_memory(mem)) {
                GST_ELEMENT_ERROR(cu->element, STREAM, FORMAT,
                                  ("a buffer of CUDA caps holds no (single) CUDA memory"), (NULL));
                return NULL;
        }
        if (!gst_memory_map(mem, map, flags | GST_MAP_CUDA)) {
                GST_ELEMENT_ERROR(cu->element, RESOURCE, FAILED, ("cannot map a CUDA memory"), (NULL));
                return NULL;
        }
        return GST_CUDA_MEMORY_CAST(mem);
}

GstFlowReturn cuda_frames_to_slot(CudaFrames *cu, GstBuffer *buf, const GstVideoInfo *info, guint8 *dst)
{
        GstCudaMemory *cmem;
        GstMapInfo map;
        gboolean ok;

        cmem = map_cuda(cu, buf, &map, GST_MAP_READ);
        if (!cmem)
                return GST_FLOW_ERROR;
        /* The slot has the default layout of the caps (info); the memory its own pitch. */
        ok = copy_planes(cu, info, (CUdeviceptr)(guintptr)map.data, &cmem->info, (CUdeviceptr)(guintptr)dst, info);
        gst_memory_unmap(GST_MEMORY_CAST(cmem), &map);
        return ok ? GST_FLOW_OK : GST_FLOW_ERROR;
}

GstFlowReturn cuda_frames_from_slot(CudaFrames *cu, const guint8 *src, const GstVideoInfo *info, GstBuffer **ret)
{
        GstBuffer *buf = NULL;
        GstCudaMemory *cmem;
        GstFlowReturn fr;
        GstMapInfo map;
        gboolean ok;

        if (!cu->pool || !gst_video_info_is_equal(&cu->pool_info, info)) {
                GstCaps *caps = gst_video_info_to_caps(info);

                gst_caps_set_features(caps, 0, gst_caps_features_new("memory:CUDAMemory", NULL));
                if (cu->pool) {
                        gst_buffer_pool_set_active(cu->pool, FALSE);
                        gst_clear_object(&cu->pool);
                }
                cu->pool = new_pool(cu, caps, GST_VIDEO_INFO_SIZE(info));
                gst_caps_unref(caps);
                if (!cu->pool || !gst_buffer_pool_set_active(cu->pool, TRUE)) {
                        GST_ELEMENT_ERROR(cu->element, RESOURCE, FAILED, ("cannot set up a CUDA buffer pool"), (NULL));
                        gst_clear_object(&cu->pool);
                        return GST_FLOW_ERROR;
                }
                cu->pool_info = *info;
        }
        fr = gst_buffer_pool_acquire_buffer(cu->pool, &buf, NULL);
        if (fr != GST_FLOW_OK)
                return fr;
        cmem = map_cuda(cu, buf, &map, GST_MAP_WRITE);
        if (!cmem) {
                gst_buffer_unref(buf);
                return GST_FLOW_ERROR;
        }
        ok = copy_planes(cu, info, (CUdeviceptr)(guintptr)src, info, (CUdeviceptr)(guintptr)map.data, &cmem->info);
        gst_memory_unmap(GST_MEMORY_CAST(cmem), &map);
        if (!ok) {
                gst_buffer_unref(buf);
                return GST_FLOW_ERROR;
        }
        *ret = buf;
        return GST_FLOW_OK;
}
