/* The paged listing loop of ls, peers and rings, written once: pages are fetched until the cursor
 * comes back 0, and the records go out as one JSON array or one table whose columns fit them. */
#include <errno.h>
#include <stdlib.h>

#include "ctl.h"

/* JSON goes out page by page (a listing may be long); only the opening waits for the first page. */
static int list_json(Ctl *ctl, const CtlListing *l, const char *prefix, void *page)
{
        uint64_t cursor = 0;
        bool started = false;
        Json j;
        int r = 0;

        do {
                int n = l->fetch(ctl, prefix, &cursor, page, l->page);

                if (n < 0) {
                        r = n;
                        break;
                }
                /* Opened after the first page even when it is empty: no records is "[]", the
                 * same shape a script parses otherwise. */
                if (!started) {
                        json_begin(&j, stdout, '[');
                        started = ctl->printed = true;
                }
                for (int i = 0; i < n; i++) {
                        Json o;
                        json_next(&j);
                        json_begin(&o, stdout, '{');
                        l->json(&o, (const char *)page + (size_t)i * l->record_size);
                        json_end(&o, '}');
                }
        } while (cursor);
        if (started) {
                /* Closed even after a failed page: stdout stays one parseable array of the records
                 * that did come, and ctl->printed tells the caller's error path not to write a
                 * second document. */
                json_end(&j, ']');
                putchar('\n');
        }
        return r;
}

/* A table is printed once every page is in: its columns are as wide as their widest cell. */
static int list_table(Ctl *ctl, const CtlListing *l, const char *prefix, void *page, bool after_table)
{
        Table *t = table_new(l->headers, l->align);
        uint64_t cursor = 0;
        int r = 0;

        if (!t)
                return -ENOMEM;
        do {
                int n = l->fetch(ctl, prefix, &cursor, page, l->page);

                if (n < 0) {
                        r = n;
                        break;
                }
                for (int i = 0; i < n; i++)
                        l->row(t, (const char *)page + (size_t)i * l->record_size);
        } while (cursor);
        /* A failed page prints no table at all: a partial one would read as the whole listing.
         * The error goes to stderr through the caller. */
        if (r == 0 && !(after_table && table_rows(t) == 0)) {
                if (after_table)
                        putchar('\n');
                r = table_print(t, stdout);
                ctl->printed = true;
        }
        table_free(t);
        return r;
}

/* One page buffer for the whole listing, reused for every fetch: memory stays at one page of
 * records however long the listing is (the table keeps only the cells' text). */
int ctl_list(Ctl *ctl, const CtlListing *l, const char *prefix, bool after_table)
{
        void *page = calloc((size_t)l->page, l->record_size);
        int r;

        if (!page)
                return -ENOMEM;
        r = ctl->json ? list_json(ctl, l, prefix, page) : list_table(ctl, l, prefix, page, after_table);
        free(page);
        return r;
}
