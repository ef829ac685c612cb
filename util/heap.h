/* Intrusive binary min-heap of deadlines: O(log n) insert, remove-anywhere and pop. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct HeapNode {
        uint64_t key;
        size_t idx; /* position in the heap; SIZE_MAX when not queued */
} HeapNode;

typedef struct Heap {
        HeapNode **v;
        size_t n, cap;
} Heap;

#define HEAP_INIT { NULL, 0, 0 }
#define HEAP_NODE_INIT { 0, SIZE_MAX }

void heap_deinit(Heap *h);

/* Queues n with key; 0 or -ENOMEM. n must not be queued already. */
int heap_push(Heap *h, HeapNode *n, uint64_t key);

/* Removes n if it is queued. */
void heap_remove(Heap *h, HeapNode *n);

static inline HeapNode *heap_top(const Heap *h)
{
        return h->n ? h->v[0] : NULL;
}

static inline int heap_queued(const HeapNode *n)
{
        return n->idx != SIZE_MAX;
}
