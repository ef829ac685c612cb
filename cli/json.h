/* Minimal JSON writing for --json output: objects and arrays of strings, numbers, booleans and null.
 * Whatever bytes a string holds, the output is valid JSON: control characters are escaped and
 * bytes that are not UTF-8 become U+FFFD (labels and names come from other peers). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct Json {
        FILE *f;
        bool first; /* no comma before the next member or element */
} Json;

void json_begin(Json *j, FILE *f, char open);   /* '{' or '[' */
void json_end(Json *j, char close);             /* '}' or ']' */
void json_key(Json *j, const char *key);        /* then a value */
void json_next(Json *j);                        /* separates array elements */
void json_str(Json *j, const char *s, size_t len);
void json_cstr(Json *j, const char *s);
void json_u64(Json *j, uint64_t v);
void json_double(Json *j, double v);            /* non-finite values become null */
void json_bool(Json *j, bool v);

/* Convenience: a key and its value. */
void json_kstr(Json *j, const char *key, const char *s);
void json_ku64(Json *j, const char *key, uint64_t v);
void json_kbool(Json *j, const char *key, bool v);
void json_kdouble(Json *j, const char *key, double v);
/* A number, or null when it is not known. */
void json_ku64_or_null(Json *j, const char *key, bool known, uint64_t v);
/* A string, or null for "" (what has none, such as a memfd buffer's device, is null, not ""). */
void json_kstr_or_null(Json *j, const char *key, const char *s);
