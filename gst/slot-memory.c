/* A GstAllocator whose memories point into a slot a member holds. A member holds one frame at a time
 * and must release it before it takes the next (gpuipc.h, gpuipc_ring_release), while downstream may
 * keep buffers as long as it likes (a queue, a sink's last sample, an encoder's lookahead). So when
 * the member wants its next frame and downstream still has this one, the frame moves: it is copied
 * into memory of its own and the memory's data pointer switches to the copy, at a moment when no
 * element has it mapped (maps are counted here, and a pointer is only valid while mapped). Frames
 * that come back in time cost no copy. */
#include "slot-memory.h"

#include <stdlib.h>
#include <string.h>

struct SlotHold {
        gint refs;
        GMutex lock;
        GCond cond;
        const guint8 *data; /* the slot's payload, or the copy */
        gsize size;
        guint maps;         /* of the memory and its shares */
        gboolean returned;  /* the memory's last reference went */
        guint8 *copy;
        gpointer owner;     /* until the slot is not needed any more */
        GDestroyNotify owner_unref;
};

typedef struct SlotMemory {
        GstMemory mem;
        SlotHold *hold; /* the root's reference; shares borrow it (they keep their root alive) */
} SlotMemory;

typedef struct {
        GstAllocator parent;
} GstGpuipcSlotAllocator;
typedef struct {
        GstAllocatorClass parent_class;
} GstGpuipcSlotAllocatorClass;

GType gst_gpuipc_slot_allocator_get_type(void);
G_DEFINE_TYPE(GstGpuipcSlotAllocator, gst_gpuipc_slot_allocator, GST_TYPE_ALLOCATOR)

#define SLOT_MEMORY_TYPE "GpuipcSlot"

/* Copies of held frames are made again and again at the same size, often one per frame (a sink that
 * keeps its last sample). Fresh memory for each would cost a page fault per page every time (tens of
 * ms for a 1080p RGBA frame on a VM); so a few freed copies are kept for the next ones. */
#define COPY_CACHE 4

static struct {
        GMutex lock;
        void *buf[COPY_CACHE];
        gsize size[COPY_CACHE];
} copies;

/* A cached copy of exactly this size, else a fresh page-aligned one. */
static void *copy_get(gsize size)
{
        void *p = NULL;

        g_mutex_lock(&copies.lock);
        for (guint i = 0; i < COPY_CACHE && !p; i++)
                if (copies.buf[i] && copies.size[i] == size) {
                        p = copies.buf[i];
                        copies.buf[i] = NULL;
                }
        g_mutex_unlock(&copies.lock);
        /* As aligned as the slot was, for elements that want their data aligned. */
        if (!p && posix_memalign(&p, 4096, MAX(size, 1)) != 0)
                g_error("gpuipcsrc: out of memory copying a held frame of %zu bytes", size);
        return p;
}

/* Keeps a freed copy for the next frame while the cache has room; freed otherwise. */
static void copy_put(void *p, gsize size)
{
        g_mutex_lock(&copies.lock);
        for (guint i = 0; i < COPY_CACHE && p; i++)
                if (!copies.buf[i]) {
                        copies.buf[i] = p;
                        copies.size[i] = size;
                        p = NULL;
                }
        g_mutex_unlock(&copies.lock);
        free(p);
}

SlotHold *slot_hold_new(const guint8 *data, gsize size, gpointer owner, GDestroyNotify owner_unref)
{
        SlotHold *h = g_new0(SlotHold, 1);

        h->refs = 1;
        g_mutex_init(&h->lock);
        g_cond_init(&h->cond);
        h->data = data;
        h->size = size;
        h->owner = owner;
        h->owner_unref = owner_unref;
        return h;
}

void slot_hold_unref(SlotHold *h)
{
        if (!h || !g_atomic_int_dec_and_test(&h->refs))
                return;
        if (h->owner)
                h->owner_unref(h->owner);
        if (h->copy)
                copy_put(h->copy, h->size);
        g_mutex_clear(&h->lock);
        g_cond_clear(&h->cond);
        g_free(h);
}

/* With h->lock held: the slot is not needed any more. */
static void drop_owner(SlotHold *h)
{
        gpointer owner = h->owner;

        h->owner = NULL;
        if (owner)
                h->owner_unref(owner);
}

/* The frame must go back to the ring, but downstream may still hold its memory: while it is mapped
 * we wait (a copy now would race a reader); once it is unmapped but still referenced, the data is
 * copied out and the memory points at the copy, so the slot can go back at once. */
gboolean slot_hold_let_go(SlotHold *h, gint *cancel, gboolean *ret_copied)
{
        *ret_copied = FALSE;
        g_mutex_lock(&h->lock);
        while (!h->returned && h->maps > 0) {
                if (g_atomic_int_get(cancel)) {
                        g_mutex_unlock(&h->lock);
                        return FALSE;
                }
                /* Woken by the last unmap; the 20 ms bound is only so that cancel is looked at
                 * while downstream keeps the memory mapped. */
                g_cond_wait_until(&h->cond, &h->lock, g_get_monotonic_time() + 20 * G_TIME_SPAN_MILLISECOND);
        }
        /* No maps now, and h->lock keeps new ones out until data points at the copy: every map
         * from here on sees the copy, none the slot that is about to be released. */
        if (!h->returned && !h->copy) {
                void *copy = copy_get(h->size);

                memcpy(copy, h->data, h->size);
                h->copy = copy;
                h->data = copy;
                *ret_copied = TRUE;
        }
        drop_owner(h);
        g_mutex_unlock(&h->lock);
        return TRUE;
}

/* One allocator for every slot memory of the process, made on first use and never freed (hence
 * MAY_BE_LEAKED, for GStreamer's leak tracer). */
static GstAllocator *slot_allocator(void)
{
        static GstAllocator *allocator;

        if (g_once_init_enter(&allocator)) {
                GstAllocator *a = g_object_new(gst_gpuipc_slot_allocator_get_type(), NULL);

                gst_object_ref_sink(a);
                GST_OBJECT_FLAG_SET(a, GST_OBJECT_FLAG_MAY_BE_LEAKED);
                g_once_init_leave(&allocator, a);
        }
        return allocator;
}

static SlotMemory *memory_new(SlotHold *h, GstMemory *parent, gsize offset, gsize size)
{
        SlotMemory *m = g_new0(SlotMemory, 1);

        /* READONLY: the slot is the producer's frame, shared with other members; 4095: the page
         * alignment the slot has, announced for elements that want aligned data. */
        gst_memory_init(GST_MEMORY_CAST(m), GST_MEMORY_FLAG_READONLY, slot_allocator(),
                        parent, h->size, 4095, offset, size);
        m->hold = h;
        return m;
}

GstMemory *slot_hold_memory(SlotHold *h)
{
        g_atomic_int_inc(&h->refs);
        return GST_MEMORY_CAST(memory_new(h, NULL, 0, h->size));
}

/* Maps are counted: let_go waits for the count to reach 0 before it moves the frame's data. */
static gpointer slot_mem_map(GstMemory *mem, gsize maxsize, GstMapFlags flags)
{
        SlotHold *h = ((SlotMemory *)mem)->hold;
        gpointer data;

        if (flags & GST_MAP_WRITE)
                return NULL; /* the slot is the producer's; GStreamer copies for writers */
        g_mutex_lock(&h->lock);
        h->maps++;
        data = (gpointer)h->data;
        g_mutex_unlock(&h->lock);
        return data;
}

static void slot_mem_unmap(GstMemory *mem)
{
        SlotHold *h = ((SlotMemory *)mem)->hold;

        g_mutex_lock(&h->lock);
        if (--h->maps == 0)
                g_cond_broadcast(&h->cond);
        g_mutex_unlock(&h->lock);
}

/* A share maps through the same hold, so its maps count too: moving the frame waits for them as
 * for the root's. */
static GstMemory *slot_mem_share(GstMemory *mem, gssize offset, gssize size)
{
        GstMemory *root = mem->parent ? mem->parent : mem;

        if (size == -1)
                size = mem->size - offset;
        return GST_MEMORY_CAST(memory_new(((SlotMemory *)mem)->hold, root, mem->offset + offset, size));
}

/* A copy into ordinary system memory: what an element that wants to write (or keep) the frame
 * gets, independent of the slot from then on. */
static GstMemory *slot_mem_copy(GstMemory *mem, gssize offset, gssize size)
{
        GstMapInfo src, dst;
        GstMemory *copy;

        if (size == -1)
                size = mem->size > (gsize)offset ? mem->size - offset : 0;
        copy = gst_allocator_alloc(NULL, size, NULL);
        if (!gst_memory_map(mem, &src, GST_MAP_READ))
                goto fail;
        if (!gst_memory_map(copy, &dst, GST_MAP_WRITE)) {
                gst_memory_unmap(mem, &src);
                goto fail;
        }
        memcpy(dst.data, src.data + offset, size);
        gst_memory_unmap(copy, &dst);
        gst_memory_unmap(mem, &src);
        return copy;
fail:
        gst_memory_unref(copy);
        return NULL;
}

static gboolean slot_mem_is_span(GstMemory *mem1, GstMemory *mem2, gsize *offset)
{
        /* GStreamer asks only for shares of one root. */
        if (offset)
                *offset = mem1->offset - mem1->parent->offset;
        return mem1->offset + mem1->size == mem2->offset;
}

/* Freeing the root memory is downstream's last reference to the frame: the hold is told it came
 * back, which ends a let_go waiting for it. Shares only drop their reference on the root. */
static void slot_allocator_free(GstAllocator *allocator, GstMemory *mem)
{
        SlotMemory *m = (SlotMemory *)mem;

        if (!mem->parent) {
                SlotHold *h = m->hold;

                g_mutex_lock(&h->lock);
                h->returned = TRUE;
                g_cond_broadcast(&h->cond);
                drop_owner(h);
                g_mutex_unlock(&h->lock);
                slot_hold_unref(h);
        }
        g_free(m);
}

static GstMemory *slot_allocator_alloc(GstAllocator *allocator, gsize size, GstAllocationParams *params)
{
        return NULL; /* its memories come only from held slots */
}

static void gst_gpuipc_slot_allocator_class_init(GstGpuipcSlotAllocatorClass *klass)
{
        GST_ALLOCATOR_CLASS(klass)->alloc = slot_allocator_alloc;
        GST_ALLOCATOR_CLASS(klass)->free = slot_allocator_free;
}

static void gst_gpuipc_slot_allocator_init(GstGpuipcSlotAllocator *self)
{
        GstAllocator *a = GST_ALLOCATOR(self);

        a->mem_type = SLOT_MEMORY_TYPE;
        a->mem_map = slot_mem_map;
        a->mem_unmap = slot_mem_unmap;
        a->mem_share = slot_mem_share;
        a->mem_copy = slot_mem_copy;
        a->mem_is_span = slot_mem_is_span;
        GST_OBJECT_FLAG_SET(self, GST_ALLOCATOR_FLAG_CUSTOM_ALLOC);
}
