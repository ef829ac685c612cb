/* Binary min-heap; each node remembers its index so it can be removed from anywhere. */
#include "heap.h"

#include <errno.h>
#include <stdlib.h>

static void place(Heap *h, size_t i, HeapNode *n)
{
        h->v[i] = n;
        n->idx = i;
}

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

        if (i == SIZE_MAX || i >= h->n || h->v[i] != n)
                return;
        n->idx = SIZE_MAX;
        last = h->v[--h->n];
        if (i == h->n)
                return;
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
