/* Pools: memory born shareable. A pool hands out ranges of a few large segments (cuda-vmm
 * allocations or memfds), each exported once when it is made, so that publishing a range is a view
 * (gpuipc_buffer_view): no copy, no export, and the segment's fd travels once per broker and per
 * consumer. Frameworks allocate through it (PyTorch's pluggable allocator calls gpuipc_torch_alloc).
 *
 * A range freed while a view covers it is not handed out again until every such view is freed
 * (which the caller does once the view drained): holders keep valid, unchanged memory. Segments with
 * nothing in them stay for the next allocations (their export too) until gpuipc_pool_trim().
 *
 * Threads: allocations and frees may come from any thread (a framework's allocator runs where it
 * allocates); they never talk to the broker and use no connection state, under the pool's lock.
 * Views, trim and close belong to the connection's thread. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "internal.h"
#include "macro.h"

#define POOL_ALIGN 512                  /* what frameworks' allocators hand out (and CUDA kernels like) */
#define POOL_GRANULE (2u << 20)         /* segments are whole multiples of this (cuda-vmm's granularity) */
#define POOL_FIRST_SEGMENT (64u << 20)
#define POOL_MAX_SEGMENT ((size_t)1 << 30)

typedef enum BlockState { BLOCK_FREE, BLOCK_USED, BLOCK_DEFERRED } BlockState;

/* A range of a segment: free, handed out, or freed while a view covered it. */
typedef struct PoolBlock {
        List link;          /* PoolSegment.blocks, in address order, covering the segment */
        size_t offset, size;
        BlockState state;
} PoolBlock;

/* A view made of a segment's memory, as long as it is not freed. Active from when it is made (or
 * published again) until it drained: only then may holders have it, so only then does it keep a
 * freed range from being handed out. */
typedef struct PoolView {
        List link;          /* PoolSegment.views */
        size_t offset, size;
        const gpuipc_buffer_t *buf;
        bool active;
} PoolView;

typedef struct PoolSegment {
        List link;          /* gpuipc_pool.segments */
        gpuipc_pool_t *pool;
        gpuipc_buffer_t *mem; /* its memory: an own buffer of the pool's connection, on none of its lists */
        uintptr_t base;
        size_t size;
        List blocks, views;
        size_t used;        /* bytes in used and deferred blocks */
} PoolSegment;

struct gpuipc_pool {
        List link;          /* gpuipc.pools */
        List all_link;      /* open_pools: where gpuipc_torch_alloc and gpuipc_torch_free look */
        gpuipc_t *conn;
        gpuipc_kind_t kind;
        int device;
        bool writable, broker_held;
        size_t next_segment, max_segment;
        pthread_mutex_t lock;
        List segments;      /* PoolSegment.link, oldest first */
        gpuipc_pool_stats_t stats;
};

/* Every open pool of the process: gpuipc_torch_free is given only a pointer. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static List open_pools = LIST_INIT(open_pools);
static __thread gpuipc_pool_t *current_pool;

static size_t round_up(size_t n, size_t to)
{
        return n > SIZE_MAX - (to - 1) ? 0 : (n + to - 1) / to * to;
}

/* ---- blocks ---- */

static PoolBlock *block_new(size_t offset, size_t size, BlockState state)
{
        PoolBlock *k = calloc(1, sizeof(*k));

        if (k)
                *k = (PoolBlock){ .offset = offset, .size = size, .state = state };
        return k;
}

static PoolBlock *block_next(PoolSegment *s, PoolBlock *k)
{
        return k->link.next == &s->blocks ? NULL : list_entry(k->link.next, PoolBlock, link);
}

static PoolBlock *block_prev(PoolSegment *s, PoolBlock *k)
{
        return k->link.prev == &s->blocks ? NULL : list_entry(k->link.prev, PoolBlock, link);
}

/* k becomes free and merges with free neighbours. */
static void block_release(PoolSegment *s, PoolBlock *k)
{
        PoolBlock *n = block_next(s, k), *p = block_prev(s, k);

        k->state = BLOCK_FREE;
        if (n && n->state == BLOCK_FREE) {
                k->size += n->size;
                list_unlink(&n->link);
                free(n);
        }
        if (p && p->state == BLOCK_FREE) {
                p->size += k->size;
                list_unlink(&k->link);
                free(k);
        }
}

static bool covered_by_view(const PoolSegment *s, size_t offset, size_t size)
{
        list_for_each(pos, &s->views) {
                const PoolView *v = list_entry(pos, PoolView, link);
                if (v->active && v->offset < offset + size && offset < v->offset + v->size)
                        return true;
        }
        return false;
}

static PoolView *view_record(PoolSegment *s, const gpuipc_buffer_t *view)
{
        list_for_each(pos, &s->views) {
                PoolView *v = list_entry(pos, PoolView, link);
                if (v->buf == view)
                        return v;
        }
        return NULL;
}

/* Ranges freed while views covered them, and no active view covers now, are free again. */
static void release_deferred(gpuipc_pool_t *p, PoolSegment *s)
{
        list_for_each_safe(pos, &s->blocks) {
                PoolBlock *k = list_entry(pos, PoolBlock, link);
                if (k->state == BLOCK_DEFERRED && !covered_by_view(s, k->offset, k->size)) {
                        p->stats.deferred -= k->size;
                        s->used -= k->size;
                        block_release(s, k);
                }
        }
}

/* The block holding byte offset of s. */
static PoolBlock *block_at(PoolSegment *s, size_t offset)
{
        list_for_each(pos, &s->blocks) {
                PoolBlock *k = list_entry(pos, PoolBlock, link);
                if (offset >= k->offset && offset - k->offset < k->size)
                        return k;
        }
        return NULL;
}

/* Hands out size bytes from a free block of s (splitting it); its offset, or SIZE_MAX. */
static size_t block_take(PoolSegment *s, PoolBlock *k, size_t size)
{
        if (k->size > size) {
                PoolBlock *rest = block_new(k->offset + size, k->size - size, BLOCK_FREE);
                if (!rest)
                        return SIZE_MAX;
                list_link_before(k->link.next, &rest->link);
                k->size = size;
        }
        k->state = BLOCK_USED;
        s->used += size;
        return k->offset;
}

/* ---- segments ---- */

static PoolSegment *segment_of(gpuipc_pool_t *p, uintptr_t addr)
{
        list_for_each(pos, &p->segments) {
                PoolSegment *s = list_entry(pos, PoolSegment, link);
                if (addr >= s->base && addr - s->base < s->size)
                        return s;
        }
        return NULL;
}

static void segment_destroy(gpuipc_t *c, PoolSegment *s)
{
        while (!list_empty(&s->blocks)) {
                PoolBlock *k = list_entry(s->blocks.next, PoolBlock, link);
                list_unlink(&k->link);
                free(k);
        }
        s->pool->stats.segments--;
        s->pool->stats.reserved -= s->size;
        list_unlink(&s->link);
        if (s->mem)
                buffer_free_local(c, s->mem);
        free(s);
}

/* Makes a segment of at least size bytes, exported at once: publishing its ranges later costs no
 * export. c is NULL off the connection's thread (no message then, only the code). */
static int segment_new(gpuipc_pool_t *p, gpuipc_t *c, size_t size, PoolSegment **ret)
{
        const KindOps *ops = kind_ops(p->kind);
        PoolSegment *s = calloc(1, sizeof(*s));
        PoolBlock *all;
        int fd = -1, r;

        size = round_up(size, POOL_GRANULE);
        if (!s || size == 0) {
                free(s);
                return -ENOMEM;
        }
        list_init(&s->blocks);
        list_init(&s->views);
        s->pool = p;
        s->mem = buffer_new_own(p->conn, p->kind);
        all = block_new(0, size, BLOCK_FREE);
        if (!s->mem || !all) {
                free(all);
                r = -ENOMEM;
                goto fail;
        }
        list_append(&s->blocks, &all->link);
        r = size_limit_check(c, p->kind, size);
        if (r == 0)
                r = ops->alloc(c, s->mem, size, p->device);
        if (r < 0)
                goto fail;
        s->mem->writable = p->writable;
        s->mem->broker_held = p->broker_held;
        s->mem->attrs_fixed = true;
        s->mem->pool_seg = s;
        r = ops->export(c, s->mem, p->writable, &fd);
        if (r < 0)
                goto fail;
        s->base = (uintptr_t)s->mem->ptr;
        s->size = size;
        list_append(&p->segments, &s->link);
        p->stats.segments++;
        p->stats.exports++;
        p->stats.reserved += size;
        *ret = s;
        return 0;

fail:
        if (s->mem)
                buffer_free_local(c, s->mem); /* frees whatever alloc made */
        while (!list_empty(&s->blocks)) {
                PoolBlock *k = list_entry(s->blocks.next, PoolBlock, link);
                list_unlink(&k->link);
                free(k);
        }
        free(s);
        return r;
}

/* Empty segments the broker never heard of are given back to the driver (any thread may do
 * that); true if there was one. */
static bool release_unshared(gpuipc_pool_t *p)
{
        bool any = false;

        list_for_each_safe(pos, &p->segments) {
                PoolSegment *s = list_entry(pos, PoolSegment, link);
                if (s->used == 0 && list_empty(&s->views) && !s->mem->registered) {
                        segment_destroy(NULL, s);
                        any = true;
                }
        }
        return any;
}

/* ---- the public calls ---- */

/* The calls that touch the connection (its list of pools, requests to the broker) hold its lock
 * before the pool's own (the order publish takes them in); allocating and freeing take only the
 * pool's, so PyTorch's allocator never waits for a request in flight. */
_public_ int gpuipc_pool_new(gpuipc_t *c, const gpuipc_pool_options_t *opts, gpuipc_pool_t **ret)
{
        CLIENT_LOCKED(c);
        gpuipc_pool_options_t o;
        gpuipc_pool_t *p;
        PoolSegment *s;
        int r;

        if (!c || !ret)
                return GPUIPC_E_INVALID;
        if (client_copy_options(&o, sizeof(o), opts) < 0) {
                client_errmsg(c, "gpuipc_pool_options_t.struct_size is 0: set it to sizeof(gpuipc_pool_options_t)");
                return GPUIPC_E_INVALID;
        }
        if (o.kind == 0)
                o.kind = GPUIPC_KIND_CUDA_VMM;
        if (o.kind != GPUIPC_KIND_CUDA_VMM && o.kind != GPUIPC_KIND_MEMFD) {
                client_errmsg(c,
                              "a pool is of cuda-vmm or memfd memory (cuda-legacy memory cannot be shared as views)");
                return GPUIPC_E_INVALID;
        }
        if (o.kind == GPUIPC_KIND_CUDA_VMM) {
                /* Said now, in words, rather than as CUDA's "not supported" at the first allocation. */
                r = cuda_vmm_check(c, o.device);
                if (r < 0)
                        return r;
        }
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->conn = c;
        p->kind = o.kind;
        p->device = o.kind == GPUIPC_KIND_MEMFD ? -1 : o.device;
        p->writable = o.writable;
        p->broker_held = o.broker_held;
        p->next_segment = o.segment_size ? round_up(o.segment_size, POOL_GRANULE) : POOL_FIRST_SEGMENT;
        p->max_segment = MAX(o.max_segment_size ? o.max_segment_size : POOL_MAX_SEGMENT, p->next_segment);
        pthread_mutex_init(&p->lock, NULL);
        list_init(&p->segments);
        if (o.reserve) {
                r = segment_new(p, c, o.reserve, &s);
                if (r < 0) {
                        pthread_mutex_destroy(&p->lock);
                        free(p);
                        return r;
                }
        }
        list_append(&c->pools, &p->link);
        pthread_mutex_lock(&open_lock);
        list_append(&open_pools, &p->all_link);
        pthread_mutex_unlock(&open_lock);
        *ret = p;
        return 0;
}

/* Best fit among the free blocks of every segment; else a new segment (each new one as large as
 * the pool so far, up to the maximum, so that a pool needs few). Under the lock. */
static int pool_alloc_locked(gpuipc_pool_t *p, size_t size, void **ret)
{
        PoolSegment *best_seg = NULL, *s;
        PoolBlock *best = NULL;
        size_t off;
        int r;

        list_for_each(sp, &p->segments) {
                PoolSegment *x = list_entry(sp, PoolSegment, link);
                list_for_each(bp, &x->blocks) {
                        PoolBlock *k = list_entry(bp, PoolBlock, link);
                        if (k->state == BLOCK_FREE && k->size >= size && (!best || k->size < best->size)) {
                                best = k;
                                best_seg = x;
                        }
                }
        }
        if (!best) {
                r = segment_new(p, NULL, MAX(size, p->next_segment), &s);
                if (r == GPUIPC_E_CUDA && release_unshared(p))
                        r = segment_new(p, NULL, MAX(size, p->next_segment), &s); /* out of memory? retry */
                if (r < 0)
                        return r;
                p->next_segment = MIN(MAX(p->next_segment, p->stats.reserved), p->max_segment);
                best_seg = s;
                best = list_entry(s->blocks.next, PoolBlock, link);
        }
        off = block_take(best_seg, best, size);
        if (off == SIZE_MAX)
                return -ENOMEM;
        p->stats.allocated += size;
        *ret = (void *)(best_seg->base + off);
        return 0;
}

_public_ int gpuipc_pool_alloc(gpuipc_pool_t *p, size_t size, void **ret)
{
        int r;

        if (!p || !ret || size == 0)
                return GPUIPC_E_INVALID;
        size = round_up(size, POOL_ALIGN);
        if (size == 0)
                return -ENOMEM;
        pthread_mutex_lock(&p->lock);
        r = pool_alloc_locked(p, size, ret);
        pthread_mutex_unlock(&p->lock);
        return r;
}

static int pool_free_locked(gpuipc_pool_t *p, void *ptr)
{
        PoolSegment *s = segment_of(p, (uintptr_t)ptr);
        PoolBlock *k = s ? block_at(s, (uintptr_t)ptr - s->base) : NULL;

        if (!k || k->offset != (uintptr_t)ptr - s->base || k->state != BLOCK_USED)
                return GPUIPC_E_INVALID;
        p->stats.allocated -= k->size;
        if (covered_by_view(s, k->offset, k->size)) {
                /* Holders still read it: it waits for its views. */
                k->state = BLOCK_DEFERRED;
                p->stats.deferred += k->size;
                return 0;
        }
        s->used -= k->size;
        block_release(s, k);
        return 0;
}

_public_ int gpuipc_pool_free(gpuipc_pool_t *p, void *ptr)
{
        int r;

        if (!p || !ptr)
                return GPUIPC_E_INVALID;
        pthread_mutex_lock(&p->lock);
        r = pool_free_locked(p, ptr);
        pthread_mutex_unlock(&p->lock);
        return r;
}

_public_ int gpuipc_pool_segment(gpuipc_pool_t *p, const void *ptr, void **ret_base, size_t *ret_size)
{
        PoolSegment *s;

        if (!p)
                return GPUIPC_E_INVALID;
        pthread_mutex_lock(&p->lock);
        s = segment_of(p, (uintptr_t)ptr);
        if (s) {
                if (ret_base)
                        *ret_base = (void *)s->base;
                if (ret_size)
                        *ret_size = s->size;
        }
        pthread_mutex_unlock(&p->lock);
        return s ? 0 : GPUIPC_E_NOT_FOUND;
}

_public_ int gpuipc_pool_segments(gpuipc_pool_t *p, void **bases, size_t *sizes, size_t cap)
{
        size_t n = 0;

        if (!p || (cap && (!bases || !sizes)))
                return GPUIPC_E_INVALID;
        pthread_mutex_lock(&p->lock);
        list_for_each(pos, &p->segments) {
                PoolSegment *s = list_entry(pos, PoolSegment, link);
                if (n < cap) {
                        bases[n] = (void *)s->base;
                        sizes[n] = s->size;
                }
                n++;
        }
        pthread_mutex_unlock(&p->lock);
        return (int)MIN(n, (size_t)INT32_MAX);
}

_public_ int gpuipc_pool_view(gpuipc_pool_t *p, const void *ptr, size_t size, gpuipc_buffer_t **ret)
{
        uintptr_t a = (uintptr_t)ptr;
        gpuipc_t *c = p ? p->conn : NULL;
        CLIENT_LOCKED(c);
        PoolSegment *s;
        PoolBlock *k;
        PoolView *v;
        int r;

        if (!p || !ret || size == 0)
                return GPUIPC_E_INVALID;
        pthread_mutex_lock(&p->lock);
        s = segment_of(p, a);
        k = s ? block_at(s, a - s->base) : NULL;
        if (!s) {
                client_errmsg(c, "the memory at %#lx does not lie in this pool", (unsigned long)a);
                r = GPUIPC_E_NOT_FOUND;
        } else if (size > s->size - (a - s->base)) {
                client_errmsg(c, "[%#lx, +%zu) spans two segments of the pool: a view lies in one", (unsigned long)a,
                              size);
                r = GPUIPC_E_INVALID;
        } else if (!k || k->state != BLOCK_USED) {
                /* A view may cover several allocations (a live state dict's part), but it starts in one. */
                client_errmsg(c, "[%#lx, +%zu) does not start in memory the pool handed out (it was freed, or never "
                              "allocated)", (unsigned long)a, size);
                r = GPUIPC_E_INVALID;
        } else if (!(v = calloc(1, sizeof(*v)))) {
                r = -ENOMEM;
        } else {
                /* Under the lock, so that no free between the check and the record can miss the view. */
                r = gpuipc_buffer_view(c, s->mem, a - s->base, size, ret);
                if (r == 0) {
                        *v = (PoolView){ .offset = a - s->base, .size = size, .buf = *ret, .active = true };
                        list_append(&s->views, &v->link);
                        p->stats.views++;
                } else {
                        free(v);
                }
        }
        pthread_mutex_unlock(&p->lock);
        return r;
}

void pool_view_gone(gpuipc_buffer_t *view)
{
        PoolSegment *s = view->segment->pool_seg;
        gpuipc_pool_t *p = s->pool;
        PoolView *v;

        pthread_mutex_lock(&p->lock);
        v = view_record(s, view);
        if (v) {
                list_unlink(&v->link);
                free(v);
                p->stats.views--;
        }
        release_deferred(p, s);
        pthread_mutex_unlock(&p->lock);
}

void pool_view_drained(gpuipc_buffer_t *view)
{
        PoolSegment *s = view->segment->pool_seg;
        gpuipc_pool_t *p = s->pool;
        PoolView *v;

        pthread_mutex_lock(&p->lock);
        v = view_record(s, view);
        if (v)
                v->active = false;
        release_deferred(p, s);
        pthread_mutex_unlock(&p->lock);
}

int pool_view_publishing(gpuipc_buffer_t *view)
{
        PoolSegment *s = view->segment->pool_seg;
        gpuipc_pool_t *p = s->pool;
        PoolView *v;
        PoolBlock *k;
        int r = 0;

        pthread_mutex_lock(&p->lock);
        v = view_record(s, view);
        if (v && !v->active) {
                /* Drained, so its range may have been freed (and handed out) since: only memory that is
                 * still allocated is published again. */
                k = block_at(s, v->offset);
                if (k && k->state == BLOCK_USED)
                        v->active = true;
                else
                        r = GPUIPC_E_INVALID;
        }
        pthread_mutex_unlock(&p->lock);
        if (r < 0)
                client_errmsg(view->conn, "the memory of this view was freed after it drained: make a new view of "
                              "memory that is allocated");
        return r;
}

_public_ int gpuipc_pool_trim(gpuipc_pool_t *p)
{
        CLIENT_LOCKED(p ? p->conn : NULL);
        int r = 0, e;

        if (!p)
                return GPUIPC_E_INVALID;
        pthread_mutex_lock(&p->lock);
        list_for_each_safe(pos, &p->segments) {
                PoolSegment *s = list_entry(pos, PoolSegment, link);

                if (s->used || !list_empty(&s->views))
                        continue;
                /* The broker forgets it and tells its consumers (their mappings kept the memory). */
                e = buffer_unregister(p->conn, s->mem);
                if (e < 0 && r == 0)
                        r = e;
                segment_destroy(p->conn, s);
        }
        pthread_mutex_unlock(&p->lock);
        return r;
}

_public_ int gpuipc_pool_stats(gpuipc_pool_t *p, gpuipc_pool_stats_t *ret)
{
        if (!p || !ret)
                return GPUIPC_E_INVALID;
        pthread_mutex_lock(&p->lock);
        *ret = p->stats;
        pthread_mutex_unlock(&p->lock);
        return 0;
}

/* Takes p out of every list and frees it; tell_broker: unregister the segments it shared. */
static void pool_destroy(gpuipc_pool_t *p, bool tell_broker)
{
        pthread_mutex_lock(&open_lock);
        list_unlink(&p->all_link);
        if (current_pool == p)
                current_pool = NULL;
        pthread_mutex_unlock(&open_lock);
        list_unlink(&p->link);
        while (!list_empty(&p->segments)) {
                PoolSegment *s = list_entry(p->segments.next, PoolSegment, link);
                if (tell_broker)
                        (void)buffer_unregister(p->conn, s->mem);
                segment_destroy(p->conn, s);
        }
        pthread_mutex_destroy(&p->lock);
        free(p);
}

_public_ int gpuipc_pool_close(gpuipc_pool_t *p)
{
        CLIENT_LOCKED(p ? p->conn : NULL);
        if (!p)
                return 0;
        if (p->stats.views) {
                client_errmsg(p->conn, "%zu views of the pool's memory are not freed yet: free them first",
                              p->stats.views);
                return GPUIPC_E_BUSY;
        }
        pool_destroy(p, true);
        return 0;
}

void pool_after_reconnect(gpuipc_t *c)
{
        list_for_each(pos, &c->pools) {
                gpuipc_pool_t *p = list_entry(pos, gpuipc_pool_t, link);

                pthread_mutex_lock(&p->lock);
                list_for_each(sp, &p->segments)
                        list_entry(sp, PoolSegment, link)->mem->registered = false;
                pthread_mutex_unlock(&p->lock);
        }
}

void pool_close_all(gpuipc_t *c)
{
        while (!list_empty(&c->pools))
                pool_destroy(list_entry(c->pools.next, gpuipc_pool_t, link), false);
}

/* Frees a segment's records; its memory stays mapped (buffer_abandon). */
static void segment_abandon(PoolSegment *s)
{
        while (!list_empty(&s->blocks)) {
                PoolBlock *k = list_entry(s->blocks.next, PoolBlock, link);
                list_unlink(&k->link);
                free(k);
        }
        while (!list_empty(&s->views)) {
                PoolView *v = list_entry(s->views.next, PoolView, link);
                list_unlink(&v->link);
                free(v);
        }
        list_unlink(&s->link);
        buffer_abandon(s->mem);
        free(s);
}

void pool_abandon_all(gpuipc_t *c)
{
        while (!list_empty(&c->pools)) {
                gpuipc_pool_t *p = list_entry(c->pools.next, gpuipc_pool_t, link);

                /* First: from now on a framework's free of this memory finds no pool and is ignored. */
                pthread_mutex_lock(&open_lock);
                list_unlink(&p->all_link);
                if (current_pool == p)
                        current_pool = NULL;
                pthread_mutex_unlock(&open_lock);
                list_unlink(&p->link);
                while (!list_empty(&p->segments))
                        segment_abandon(list_entry(p->segments.next, PoolSegment, link));
                pthread_mutex_destroy(&p->lock);
                free(p);
        }
}

/* ---- frameworks' allocator hooks ---- */

_public_ gpuipc_pool_t *gpuipc_pool_use(gpuipc_pool_t *p)
{
        gpuipc_pool_t *old = current_pool;

        current_pool = p;
        return old;
}

/* The pool an allocation of the calling thread goes to: its current one, else the newest open
 * cuda-vmm pool of that device. Under open_lock. */
static gpuipc_pool_t *torch_pool(int device)
{
        gpuipc_pool_t *found = NULL;

        list_for_each(pos, &open_pools) {
                gpuipc_pool_t *p = list_entry(pos, gpuipc_pool_t, all_link);
                if (p->kind != GPUIPC_KIND_CUDA_VMM || p->device != device)
                        continue;
                if (p == current_pool)
                        return p;
                found = p;
        }
        return found;
}

_public_ void *gpuipc_torch_alloc(ssize_t size, int device, void *stream)
{
        gpuipc_pool_t *p;
        void *ptr = NULL;

        (void)stream; /* memory is valid for every stream; the framework orders reuse itself */
        if (size <= 0)
                return NULL;
        pthread_mutex_lock(&open_lock);
        p = torch_pool(device);
        if (p && gpuipc_pool_alloc(p, (size_t)size, &ptr) < 0)
                ptr = NULL;
        pthread_mutex_unlock(&open_lock);
        return ptr;
}

_public_ void gpuipc_torch_free(void *ptr, size_t size, int device, void *stream)
{
        (void)size;
        (void)stream;
        pthread_mutex_lock(&open_lock);
        list_for_each(pos, &open_pools) {
                gpuipc_pool_t *p = list_entry(pos, gpuipc_pool_t, all_link);
                if (p->device == device && gpuipc_pool_free(p, ptr) == 0)
                        break;
        }
        /* Not found: its pool was closed, and its memory with it. */
        pthread_mutex_unlock(&open_lock);
}
