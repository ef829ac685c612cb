/* Text from other peers (labels, names, reasons) made safe for terminals and for JSON. */
#pragma once

#include <stddef.h>
#include <stdio.h>

/* The length of the valid UTF-8 sequence at s (at most len bytes, len > 0), or 0 if it is none. */
size_t utf8_sequence(const unsigned char *s, size_t len);

/* Writes s for a terminal: control characters and invalid UTF-8 become '?', so that what another
 * peer chose cannot forge table rows or send escape sequences. */
void text_safe(FILE *f, const char *s);

/* text_safe, then spaces up to width characters (a table cell, left-aligned, never cut). */
void text_cell(FILE *f, const char *s, int width);
