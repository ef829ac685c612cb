/* A bounded JSON reader for the few documents gpuipcctl reads (a safetensors header, a sharded
 * checkpoint's index): a cursor over bytes that are all in memory, read in the order the caller
 * expects them. It allocates nothing, copies strings into the caller's buffer (with their escapes
 * decoded to UTF-8), refuses what is not JSON (bad UTF-8, control characters, numbers that are not
 * unsigned integers where one is asked for) and nests at most JSONREAD_MAX_DEPTH deep, so that any
 * input costs time linear in its length. The first error sticks: every later call fails too, and
 * jsonread_error() says what and where (the byte offset from the start of the text). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSONREAD_MAX_DEPTH 64

typedef struct JsonRead {
        const char *start, *p, *end;
        const char *err;   /* NULL until something failed */
        size_t err_at;     /* where it failed, from start */
} JsonRead;

void jsonread_init(JsonRead *r, const void *text, size_t len);

/* The next character that is not white space ('\0' at the end), not consumed. */
char jsonread_peek(JsonRead *r);

/* Consumes c (after white space); false, with the error set, when something else comes. */
bool jsonread_expect(JsonRead *r, char c);

/* For objects and arrays: after the opening '{' or '[' call this before each member or element;
 * true while one follows (the ',' between them consumed), false at the closing bracket (consumed)
 * or on an error (check jsonread_failed). first: true for the first call after the opening. */
bool jsonread_more(JsonRead *r, char close, bool *first);

/* A string into buf (at most cap - 1 bytes and a NUL; longer is an error naming what); *ret_len
 * its length. A string holding U+0000 is refused (names are C strings). */
bool jsonread_string(JsonRead *r, char *buf, size_t cap, size_t *ret_len, const char *what);

/* An unsigned integer below 2^64 (no sign, fraction or exponent). */
bool jsonread_u64(JsonRead *r, uint64_t *ret, const char *what);

/* Skips one value of any type, checking it. */
bool jsonread_skip(JsonRead *r);

/* Whether only white space is left. */
bool jsonread_at_end(JsonRead *r);

/* Sets the error (the first one sticks) at the current position; returns false. */
bool jsonread_fail(JsonRead *r, const char *why);

static inline bool jsonread_failed(const JsonRead *r)
{
        return r->err != NULL;
}
