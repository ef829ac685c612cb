/* Binary min-heap; each node remembers its index so it can be removed from anywhere. */
#include "heap.h"

#include <errno.h>
#include <stdlib.h>

/* Every move goes through here so that n->idx always names n's slot: heap_remove finds a node
 * by it in O(1), and a stale idx would remove another node's deadline. */
static void place(Heap *h, size_t i, HeapNode *n)
{
        h->v[i] = n;
        n->idx = i;
}

/* Moves the node at i up while its parent's key is larger. Equal keys stop it, so deadlines that
 * tie keep no particular order: callers must not rely on one. */
static void sift_up(Heap *h, size_t i)
{
        HeapNode *n = h->v[i];

        while (i > 0) {
                size_t parent = (i - 1) / 2;
                if (h->v[parent]->key <= n->key)
                        break;
                place(h, i, h->v[parent]);
                i = parent;
        }
        place(h, i, n);
}

/* Moves the node at i down, swapping with the smaller child, until neither child is smaller. */
static void sift_down(Heap *h, size_t i)
{
        HeapNode *n = h->v[i];

        for (;;) {
                size_t c = 2 * i + 1;
                if (c >= h->n)
                        break;
                if (c + 1 < h->n && h->v[c + 1]->key < h->v[c]->key)
                        c++;
                if (n->key <= h->v[c]->key)
                        break;
                place(h, i, h->v[c]);
                i = c;
        }
        place(h, i, n);
}

int heap_push(Heap *h, HeapNode *n, uint64_t key)
{
        /* Doubling keeps pushes amortized O(1); the array is never shrunk (the broker's timer
         * count stays bounded by its wait quotas). */
        if (h->n == h->cap) {
                size_t cap = h->cap ? h->cap * 2 : 16;
                HeapNode **v = realloc(h->v, cap * sizeof(*v));
                if (!v)
                        return -ENOMEM;
                h->v = v;
                h->cap = cap;
        }
        n->key = key;
        place(h, h->n++, n);
        sift_up(h, n->idx);
        return 0;
}

void heap_remove(Heap *h, HeapNode *n)
{
        size_t i = n->idx;
        HeapNode *last;

        /* Not queued (or queued in another heap): nothing to do, so a timer can be cancelled
         * whether or not it already fired. */
        if (i == SIZE_MAX || i >= h->n || h->v[i] != n)
                return;
        n->idx = SIZE_MAX;
        last = h->v[--h->n];
        if (i == h->n)
                return;
        /* The last node fills the hole; it may belong above or below it, never both. */
        place(h, i, last);
        if (i > 0 && h->v[(i - 1) / 2]->key > last->key)
                sift_up(h, i);
        else
                sift_down(h, i);
}

void heap_deinit(Heap *h)
{
        free(h->v);
        *h = (Heap)HEAP_INIT;
}
