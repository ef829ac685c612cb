/* A bounded JSON reader: see jsonread.h. */
#include <string.h>

#include "jsonread.h"

void jsonread_init(JsonRead *r, const void *text, size_t len)
{
        r->start = r->p = text;
        r->end = r->start + len;
        r->err = NULL;
        r->err_at = 0;
}

/* Only the first error is kept: later calls fail because of it, and naming them would point the
 * user at a symptom instead of the byte where the text went wrong. */
bool jsonread_fail(JsonRead *r, const char *why)
{
        if (!r->err) {
                r->err = why;
                r->err_at = (size_t)(r->p - r->start);
        }
        return false;
}

/* JSON's four white-space characters, and no others (a form feed or NBSP is an error in JSON). */
static void skip_space(JsonRead *r)
{
        while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
                r->p++;
}

/* '\0' doubles as "at the end": callers that must tell it from a NUL byte look at r->p too. */
char jsonread_peek(JsonRead *r)
{
        if (r->err)
                return '\0';
        skip_space(r);
        return r->p < r->end ? *r->p : '\0';
}

/* The message names what was expected, so an error reads "byte N: expected ':'"; the end of the
 * text gets a message of its own, since "expected" would blame a character that is not there. */
bool jsonread_expect(JsonRead *r, char c)
{
        static const char *const msgs[128] = {
                ['{'] = "expected '{'", ['}'] = "expected '}'", ['['] = "expected '['",
                [']'] = "expected ']'", [':'] = "expected ':'", [','] = "expected ','",
                ['"'] = "expected a string",
        };

        if (jsonread_peek(r) != c || r->p >= r->end)
                return jsonread_fail(r, r->p >= r->end ? "the text ends too early"
                                                        : msgs[(unsigned char)c & 127] ? msgs[(unsigned char)c & 127]
                                                                                        : "unexpected character");
        r->p++;
        return true;
}

/* The caller keeps *first, so that a trailing comma ("[1,]") fails here: after a ',' a member must
 * follow, and the closing bracket is only taken where a member or the opening came just before. */
bool jsonread_more(JsonRead *r, char close, bool *first)
{
        char c = jsonread_peek(r);

        if (r->err)
                return false;
        if (c == close) {
                r->p++;
                return false;
        }
        if (!*first && !jsonread_expect(r, ','))
                return false;
        *first = false;
        if (jsonread_peek(r) == '\0' && r->p >= r->end)
                return jsonread_fail(r, "the text ends too early");
        return true;
}

/* A hex digit's value, either case; -1 for anything else. */
static int hex(char c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

/* Four hex digits after "\u" into *ret. */
static bool read_u4(JsonRead *r, unsigned *ret)
{
        unsigned v = 0;

        /* The room is checked first: a "\u" at the very end of the text never reads past it. */
        if (r->end - r->p < 4)
                return jsonread_fail(r, "a \\u escape is cut short");
        for (int i = 0; i < 4; i++) {
                int h = hex(r->p[i]);
                if (h < 0)
                        return jsonread_fail(r, "a \\u escape has a character that is not a hex digit");
                v = v << 4 | (unsigned)h;
        }
        r->p += 4;
        *ret = v;
        return true;
}

/* The length of the UTF-8 sequence at p (at most n bytes available), or 0 if it is not one:
 * overlong forms, surrogates and code points past U+10FFFF are refused. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
        unsigned c = p[0], cp;
        size_t len;

        if (c < 0x80)
                return 1;
        if (c >= 0xc2 && c <= 0xdf)
                len = 2, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
                len = 3, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
                len = 4, cp = c & 0x07;
        else
                return 0;
        if (len > n)
                return 0;
        for (size_t i = 1; i < len; i++) {
                if ((p[i] & 0xc0) != 0x80)
                        return 0;
                cp = cp << 6 | (p[i] & 0x3f);
        }
        if (len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)))
                return 0;
        if (len == 4 && (cp < 0x10000 || cp > 0x10ffff))
                return 0;
        return len;
}

/* Appends cp as UTF-8 to buf at *n (cap counts the NUL). */
static bool put_cp(JsonRead *r, char *buf, size_t cap, size_t *n, unsigned cp, const char *too_long)
{
        char tmp[4];
        size_t len;

        if (cp < 0x80) {
                tmp[0] = (char)cp, len = 1;
        } else if (cp < 0x800) {
                tmp[0] = (char)(0xc0 | cp >> 6), tmp[1] = (char)(0x80 | (cp & 0x3f)), len = 2;
        } else if (cp < 0x10000) {
                tmp[0] = (char)(0xe0 | cp >> 12), tmp[1] = (char)(0x80 | (cp >> 6 & 0x3f));
                tmp[2] = (char)(0x80 | (cp & 0x3f)), len = 3;
        } else {
                tmp[0] = (char)(0xf0 | cp >> 18), tmp[1] = (char)(0x80 | (cp >> 12 & 0x3f));
                tmp[2] = (char)(0x80 | (cp >> 6 & 0x3f)), tmp[3] = (char)(0x80 | (cp & 0x3f)), len = 4;
        }
        /* cap - 1: the NUL always fits. Without buf the string is only measured and checked. */
        if (buf) {
                if (cap - 1 - *n < len)
                        return jsonread_fail(r, too_long);
                memcpy(buf + *n, tmp, len);
        }
        *n += len;
        return true;
}

/* The string at the cursor into buf (NULL: only checked and skipped). */
/* A string that is only skipped is checked as fully as one that is kept: a document is refused
 * wherever it stops being JSON, not only in the fields this reader happens to use. */
static bool read_string(JsonRead *r, char *buf, size_t cap, size_t *ret_len, const char *too_long)
{
        size_t n = 0;

        if (!jsonread_expect(r, '"'))
                return false;
        for (;;) {
                unsigned char c;

                if (r->p >= r->end)
                        return jsonread_fail(r, "a string is not closed");
                c = (unsigned char)*r->p;
                if (c == '"') {
                        r->p++;
                        break;
                }
                /* JSON forbids raw control characters in strings; a name with one would also be
                 * unsafe to print. */
                if (c < 0x20)
                        return jsonread_fail(r, "a string holds a control character");
                if (c == '\\') {
                        unsigned cp;
                        if (r->end - r->p < 2)
                                return jsonread_fail(r, "a string is not closed");
                        r->p++;
                        switch (*r->p++) {
                        case '"': cp = '"'; break;
                        case '\\': cp = '\\'; break;
                        case '/': cp = '/'; break;
                        case 'b': cp = '\b'; break;
                        case 'f': cp = '\f'; break;
                        case 'n': cp = '\n'; break;
                        case 'r': cp = '\r'; break;
                        case 't': cp = '\t'; break;
                        case 'u':
                                if (!read_u4(r, &cp))
                                        return false;
                                /* A high surrogate must be followed by a low one; together they
                                 * are one code point past U+FFFF. A lone half is no character. */
                                if (cp >= 0xd800 && cp <= 0xdbff) {
                                        unsigned lo;
                                        if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u')
                                                return jsonread_fail(r, "a \\u escape holds half a surrogate pair");
                                        r->p += 2;
                                        if (!read_u4(r, &lo))
                                                return false;
                                        if (lo < 0xdc00 || lo > 0xdfff)
                                                return jsonread_fail(r, "a \\u escape holds half a surrogate pair");
                                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                                } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                                        return jsonread_fail(r, "a \\u escape holds half a surrogate pair");
                                }
                                /* Names become C strings: a NUL inside would cut them short. */
                                if (cp == 0)
                                        return jsonread_fail(r, "a string holds U+0000");
                                break;
                        default:
                                /* Back onto the escape's letter, so the error's offset names it. */
                                r->p--;
                                return jsonread_fail(r, "a string holds an unknown escape");
                        }
                        if (!put_cp(r, buf, cap, &n, cp, too_long))
                                return false;
                        continue;
                }
                /* Raw bytes are taken one UTF-8 sequence at a time, so bad UTF-8 is refused at its byte. */
                size_t len = utf8_len((const unsigned char *)r->p, (size_t)(r->end - r->p));
                if (!len)
                        return jsonread_fail(r, "a string is not valid UTF-8");
                if (buf) {
                        if (cap - 1 - n < len)
                                return jsonread_fail(r, too_long);
                        memcpy(buf + n, r->p, len);
                }
                n += len;
                r->p += len;
        }
        if (buf)
                buf[n] = '\0';
        if (ret_len)
                *ret_len = n;
        return true;
}

/* cap 0 has no room for the NUL: refused up front, since read_string's room checks count it. */
bool jsonread_string(JsonRead *r, char *buf, size_t cap, size_t *ret_len, const char *what)
{
        if (cap == 0)
                return jsonread_fail(r, what);
        return read_string(r, buf, cap, ret_len, what);
}

/* Digits only, checked for overflow before each step; a leading zero, a fraction or an exponent is
 * refused even where the value would be whole ("1e3"), as offsets and sizes are never written so. */
bool jsonread_u64(JsonRead *r, uint64_t *ret, const char *what)
{
        uint64_t v = 0;
        const char *digits;

        if (r->err)
                return false;
        skip_space(r);
        digits = r->p;
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
                unsigned d = (unsigned)(*r->p - '0');
                /* An offset or size past 2^64 would wrap to a small number and pass the caller's
                 * bounds checks; refused instead. */
                if (v > (UINT64_MAX - d) / 10)
                        return jsonread_fail(r, what);
                v = v * 10 + d;
                r->p++;
        }
        if (r->p == digits || (r->p - digits > 1 && *digits == '0'))
                return jsonread_fail(r, what);
        if (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E'))
                return jsonread_fail(r, what);
        *ret = v;
        return true;
}

/* A number of any kind, checked against JSON's grammar. */
/* Used only for values the caller skips (metadata, floats): their value is never needed, so the
 * number is checked but not converted. */
static bool skip_number(JsonRead *r)
{
        const char *q = r->p;
        bool ok = true;

        if (q < r->end && *q == '-')
                q++;
        if (q < r->end && *q == '0') {
                q++;
        } else if (q < r->end && *q >= '1' && *q <= '9') {
                while (q < r->end && *q >= '0' && *q <= '9')
                        q++;
        } else {
                ok = false;
        }
        if (ok && q < r->end && *q == '.') {
                q++;
                ok = q < r->end && *q >= '0' && *q <= '9';
                while (q < r->end && *q >= '0' && *q <= '9')
                        q++;
        }
        if (ok && q < r->end && (*q == 'e' || *q == 'E')) {
                q++;
                if (q < r->end && (*q == '+' || *q == '-'))
                        q++;
                ok = q < r->end && *q >= '0' && *q <= '9';
                while (q < r->end && *q >= '0' && *q <= '9')
                        q++;
        }
        if (!ok)
                return jsonread_fail(r, "not a JSON value");
        r->p = q;
        return true;
}

/* true, false or null, spelled exactly. */
static bool skip_word(JsonRead *r, const char *w)
{
        size_t n = strlen(w);

        if ((size_t)(r->end - r->p) < n || memcmp(r->p, w, n) != 0)
                return jsonread_fail(r, "not a JSON value");
        r->p += n;
        return true;
}

/* Containers are skipped without recursion: a stack of their closing brackets, bounded by
 * JSONREAD_MAX_DEPTH. */
bool jsonread_skip(JsonRead *r)
{
        /* The text comes from a file anyone may have written: recursing on its nesting could run
         * off the C stack, a fixed array cannot. */
        char stack[JSONREAD_MAX_DEPTH];
        bool first[JSONREAD_MAX_DEPTH];
        int depth = 0;

        for (;;) {
                char c = jsonread_peek(r);

                if (r->err)
                        return false;
                /* one value */
                if (c == '{' || c == '[') {
                        if (depth == JSONREAD_MAX_DEPTH)
                                return jsonread_fail(r, "nested too deep");
                        r->p++;
                        stack[depth] = c == '{' ? '}' : ']';
                        first[depth++] = true;
                } else if (c == '"') {
                        if (!read_string(r, NULL, 0, NULL, NULL))
                                return false;
                } else if (c == 't') {
                        if (!skip_word(r, "true"))
                                return false;
                } else if (c == 'f') {
                        if (!skip_word(r, "false"))
                                return false;
                } else if (c == 'n') {
                        if (!skip_word(r, "null"))
                                return false;
                } else if (c == '\0' && r->p >= r->end) {
                        return jsonread_fail(r, "the text ends too early");
                } else if (!skip_number(r)) {
                        return false;
                }
                /* then close what is complete, and open the next member or element */
                for (;;) {
                        if (depth == 0)
                                return true;
                        if (!jsonread_more(r, stack[depth - 1], &first[depth - 1])) {
                                if (r->err)
                                        return false;
                                depth--;
                                continue;
                        }
                        if (stack[depth - 1] == '}') {
                                if (!read_string(r, NULL, 0, NULL, NULL) || !jsonread_expect(r, ':'))
                                        return false;
                        }
                        break;
                }
        }
}

/* Checked after the top-level value: bytes after it would mean the text is not the one document
 * the caller read (two objects back to back, or a header padded with something else). */
bool jsonread_at_end(JsonRead *r)
{
        if (r->err)
                return false;
        skip_space(r);
        return r->p == r->end;
}
