/* Intrusive circular doubly linked list (the kernel's and c-list's shape): O(1) unlink from anywhere. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "macro.h"

typedef struct List {
        struct List *prev, *next;
} List;

#define LIST_INIT(name) { &(name), &(name) }

static inline void list_init(List *l)
{
        l->prev = l->next = l;
}

static inline bool list_empty(const List *l)
{
        return l->next == l;
}

/* A node that was never linked or was unlinked with list_unlink() reports false. */
static inline bool list_linked(const List *n)
{
        return n->next && n->next != n;
}

/* Links n just before at: with at the head, that is the tail, which keeps lists in insertion
 * order: a connection's queued frames leave in the order they were queued (broker/conn.c). */
static inline void list_link_before(List *at, List *n)
{
        n->prev = at->prev;
        n->next = at;
        at->prev->next = n;
        at->prev = n;
}

static inline void list_append(List *head, List *n)
{
        list_link_before(head, n);
}

/* Unlinks n and leaves it self-linked, so unlinking twice is harmless. */
static inline void list_unlink(List *n)
{
        if (!n->next)
                return;
        n->prev->next = n->next;
        n->next->prev = n->prev;
        n->prev = n->next = n;
}

#define list_entry(ptr, type, member) container_of(ptr, type, member)
#define list_first_entry(head, type, member) \
        (list_empty(head) ? NULL : list_entry((head)->next, type, member))

#define list_for_each(pos, head) for (List *pos = (head)->next; pos != (head); pos = pos->next)

/* Safe against unlinking (and freeing) the current node. */
#define list_for_each_safe(pos, head) \
        for (List *pos = (head)->next, *pos##_next = pos->next; pos != (head); \
             pos = pos##_next, pos##_next = pos->next)
