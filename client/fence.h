/* Internals shared by the two kinds of fence: a counter in cuda-vmm memory (fence.c) and a CUDA
 * IPC event (fence-event.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "cuda.h"
#include "internal.h"

struct gpuipc_fence {
        gpuipc_t *conn;
        gpuipc_buffer_t *buf;   /* created: our own; opened: attached */
        GcuDevicePtr counter;   /* counter fences: the mapped counter */
        GcuEvent event;         /* IPC-event fences: the event, created or opened */
        int ordinal;            /* the device the counter is mapped for, or the event lives on */
        GcuStream reader;       /* gpuipc_fence_value's private stream, created on first use */
};

/* Frees b keeping the message of the failure that made us give it up. Returns r. */
int fence_undo(gpuipc_t *c, gpuipc_buffer_t *b, int r);


/* fence-event.c: whether an attached buffer carries an IPC-event fence; opening it (takes b);
 * recording or waiting in a stream (in the fence's context); whether the last record completed. */
bool fence_event_is(const gpuipc_buffer_t *b);
int fence_event_open(gpuipc_t *c, gpuipc_buffer_t *b, gpuipc_fence_t **ret);
int fence_event_enqueue(gpuipc_fence_t *f, GcuStream s, bool wait);
int fence_event_done(gpuipc_fence_t *f, uint64_t *ret);
