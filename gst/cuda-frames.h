/* The CUDA-memory variant: frames between GstCudaMemory and cuda-vmm slots (built with gstcuda only). */
#pragma once

#include <gst/gst.h>
#include <gst/video/video.h>

G_BEGIN_DECLS

/* An element's CUDA context (shared with its neighbours through GstContext), a stream of it for the
 * copies, and (gpuipcsrc) the pool its output buffers come from. */
typedef struct CudaFrames CudaFrames;

/* Makes *cu ready to copy on the CUDA device `device` (-1: a context's device, from the pipeline or
 * new), creating it if NULL. FALSE after posting an error. */
gboolean cuda_frames_ensure(GstElement *element, CudaFrames **cu, int device);
void cuda_frames_free(CudaFrames *cu);
/* The device ordinal of the context. */
int cuda_frames_device(const CudaFrames *cu);

/* GstElement.set_context and the context query: the pipeline's CUDA context is shared. *cu is created
 * if NULL. */
void cuda_frames_set_context(GstElement *element, CudaFrames **cu, GstContext *context, int device);
gboolean cuda_frames_context_query(CudaFrames *cu, GstQuery *query);

/* gpuipcsink: a GstCudaBufferPool for upstream in the allocation query. */
gboolean cuda_frames_propose_allocation(CudaFrames *cu, GstQuery *query);

/* gpuipcsink: the frame in buf (CUDA memory, any pitch) into slot memory at dst (a device pointer),
 * planes in the default layout of info; done when this returns. */
GstFlowReturn cuda_frames_to_slot(CudaFrames *cu, GstBuffer *buf, const GstVideoInfo *info, guint8 *dst);

/* gpuipcsrc: a new buffer of CUDA memory (from its pool, made for info) holding the frame at src in
 * slot memory (a device pointer, default layout); done when this returns, so the slot may be
 * released at once. */
GstFlowReturn cuda_frames_from_slot(CudaFrames *cu, const guint8 *src, const GstVideoInfo *info, GstBuffer **ret);

G_END_DECLS
