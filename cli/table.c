/* Tables whose columns fit their widest cell; see table.h. */
#include "table.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

struct Table {
        size_t n_columns;
        const char *align;
        char **cells; /* row-major; the first row is the header */
        size_t n_cells, cap;
        size_t *width; /* per column, in characters */
        bool failed;   /* a cell could not be kept */
};

/* Characters (not bytes) of a string text_safe made: each invalid byte became one '?'. */
static size_t text_width(const char *s)
{
        size_t n = 0, len = strlen(s);

        for (size_t i = 0; i < len; n++) {
                size_t k = utf8_sequence((const unsigned char *)s + i, len - i);
                i += k ? k : 1;
        }
        return n;
}

/* Takes ownership of cell (NULL: an allocation failed upstream). A failure is remembered rather
 * than returned, so callers add cells without checks and table_print reports it once; cells are
 * counted row-major, so a lost cell would shift every later one into the wrong column. */
static void add(Table *t, char *cell)
{
        size_t col;

        if (!cell) {
                t->failed = true;
                return;
        }
        if (t->n_cells == t->cap) {
                size_t cap = t->cap ? 2 * t->cap : 16 * t->n_columns;
                char **cells = realloc(t->cells, cap * sizeof(*cells));
                if (!cells) {
                        free(cell);
                        t->failed = true;
                        return;
                }
                t->cells = cells;
                t->cap = cap;
        }
        col = t->n_cells % t->n_columns;
        t->cells[t->n_cells++] = cell;
        if (text_width(cell) > t->width[col])
                t->width[col] = text_width(cell);
}

Table *table_new(const char *const *headers, const char *align)
{
        Table *t = calloc(1, sizeof(*t));

        if (!t)
                return NULL;
        t->n_columns = strlen(align);
        t->align = align;
        t->width = calloc(t->n_columns, sizeof(*t->width));
        if (!t->width)
                return table_free(t);
        /* The header is the first row, so a column is never narrower than its title. */
        for (size_t i = 0; i < t->n_columns; i++)
                add(t, strdup(headers[i]));
        if (t->failed)
                return table_free(t);
        return t;
}

Table *table_free(Table *t)
{
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n_cells; i++)
                free(t->cells[i]);
        free(t->cells);
        free(t->width);
        free(t);
        return NULL;
}

/* Cells are made safe (text_safe) when added, not when printed: widths are measured on exactly the
 * text that will be printed, so peer-chosen bytes cannot misalign the columns. */
void table_cell(Table *t, const char *fmt, ...)
{
        char *raw = NULL, *safe = NULL;
        size_t len = 0;
        va_list ap;
        FILE *f;
        int n;

        va_start(ap, fmt);
        n = vasprintf(&raw, fmt, ap);
        va_end(ap);
        if (n < 0) {
                t->failed = true;
                return;
        }
        f = open_memstream(&safe, &len);
        if (f) {
                text_safe(f, raw);
                if (fclose(f) != 0) {
                        free(safe);
                        safe = NULL;
                }
        }
        free(raw);
        add(t, safe);
}

/* Rows below the header (cells are stored row by row, the header's first). */
size_t table_rows(const Table *t)
{
        return t->n_cells / t->n_columns - 1;
}

int table_print(Table *t, FILE *f)
{
        size_t rows = t->n_cells / t->n_columns;

        /* Nothing at all when a cell was lost (see add): a table with a gap would put values
         * under the wrong headers. */
        if (t->failed)
                return -ENOMEM;
        for (size_t r = 0; r < rows; r++) {
                char **row = t->cells + r * t->n_columns;
                size_t last = t->n_columns;

                /* Trailing empty cells print nothing, not blanks. */
                while (last > 0 && !row[last - 1][0])
                        last--;
                for (size_t c = 0; c < last; c++) {
                        int pad = (int)(t->width[c] - text_width(row[c]));

                        if (c)
                                fputc(' ', f);
                        /* The last cell of a left-aligned row is not padded: no trailing blanks for
                         * scripts that split on whitespace or compare lines. */
                        /* 'r' is for ids and counts: right-aligned, digits line up by place. */
                        if (t->align[c] == 'r')
                                fprintf(f, "%*s%s", pad, "", row[c]);
                        else
                                fprintf(f, "%s%*s", row[c], c + 1 < last ? pad : 0, "");
                }
                fputc('\n', f);
        }
        return 0;
}
