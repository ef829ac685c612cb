/* JSON writer (RFC 8259); see json.h. */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "text.h"

/* Straight to f: a document is streamed as it is made (list.c writes a page at a time), never
 * built in memory first. */
void json_begin(Json *j, FILE *f, char open)
{
        j->f = f;
        j->first = true;
        fputc(open, f);
}

/* The container just closed is itself a value of the enclosing one: a value written next to it
 * on the same Json needs a comma, hence first = false. */
void json_end(Json *j, char close)
{
        fputc(close, j->f);
        j->first = false;
}

/* The comma before every value or key but a container's first: the one place that tracks it, so
 * callers never write separators themselves. */
void json_next(Json *j)
{
        if (!j->first)
                fputc(',', j->f);
        j->first = false;
}

/* Keys go through the same escaping as values: some are record names from the broker (stats). */
void json_key(Json *j, const char *key)
{
        json_next(j);
        json_cstr(j, key);
        fputc(':', j->f);
}

void json_str(Json *j, const char *s, size_t len)
{
        const unsigned char *p = (const unsigned char *)s;

        /* One UTF-8 sequence at a time: a multi-byte character is copied whole, so only bytes that
         * are no character at all are replaced, each by one U+FFFD. */
        fputc('"', j->f);
        for (size_t i = 0; i < len;) {
                size_t n = utf8_sequence(p + i, len - i);

                if (n == 0) {
                        fputs("\\ufffd", j->f);
                        i++;
                } else if (p[i] == '"' || p[i] == '\\') {
                        fprintf(j->f, "\\%c", p[i++]);
                } else if (p[i] < 0x20 || p[i] == 0x7f) {
                        /* RFC 8259 requires escaping below 0x20; DEL too, so a terminal paging
                         * the JSON cannot be sent control sequences by a peer's label. */
                        fprintf(j->f, "\\u%04x", p[i++]);
                } else {
                        fwrite(p + i, 1, n, j->f);
                        i += n;
                }
        }
        fputc('"', j->f);
}

void json_cstr(Json *j, const char *s)
{
        json_str(j, s, strlen(s));
}

/* Exact decimal: byte counts and ids past 2^53 lose digits in readers that parse numbers as
 * doubles, but the text itself is exact for those that read 64-bit integers. */
void json_u64(Json *j, uint64_t v)
{
        fprintf(j->f, "%" PRIu64, v);
}

void json_double(Json *j, double v)
{
        /* 17 significant digits read back as the same double; JSON has no NaN or Infinity. */
        if (isfinite(v))
                fprintf(j->f, "%.17g", v);
        else
                fputs("null", j->f);
}

void json_bool(Json *j, bool v)
{
        fputs(v ? "true" : "false", j->f);
}

void json_kstr(Json *j, const char *key, const char *s)
{
        json_key(j, key);
        json_cstr(j, s);
}

void json_ku64(Json *j, const char *key, uint64_t v)
{
        json_key(j, key);
        json_u64(j, v);
}

/* The key is written either way: a script finds the same fields in every record and tests for
 * null, rather than for a missing key. */
void json_ku64_or_null(Json *j, const char *key, bool known, uint64_t v)
{
        json_key(j, key);
        if (known)
                json_u64(j, v);
        else
                fputs("null", j->f);
}

/* null rather than "" for an absent string (a memfd's device), so that JSON readers can tell "none"
 * from an empty value without knowing which fields may be empty. */
void json_kstr_or_null(Json *j, const char *key, const char *s)
{
        if (s && s[0]) {
                json_kstr(j, key, s);
                return;
        }
        json_key(j, key);
        fputs("null", j->f);
}

void json_kbool(Json *j, const char *key, bool v)
{
        json_key(j, key);
        json_bool(j, v);
}

void json_kdouble(Json *j, const char *key, double v)
{
        json_key(j, key);
        json_double(j, v);
}
