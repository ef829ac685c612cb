/* The broker's log: one line per event on stderr, as text or as JSON lines. Callers pass a short
 * message and logfmt-style fields ("peer=3 uid=1000 name=\"a b\""); JSON mode turns the fields
 * into members, so both forms carry the same facts: an unquoted integer becomes a JSON number, anything
 * else (and every quoted value) a string. */
#pragma once

#include <stdbool.h>

#include "macro.h"

typedef enum LogLevel { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR } LogLevel;

void log_setup(bool json, LogLevel min_level);
bool log_json(void);
int log_level_from_name(const char *s, LogLevel *ret);

_printf_(3, 4) void log_msg(LogLevel level, const char *msg, const char *fields_fmt, ...);

/* An audit record (broker/audit.h): msg "audit" at level info, written whatever --log-level says
 * (--audit turns the trail off; audit.c rate-limits it). */
_printf_(1, 2) void log_audit(const char *fields_fmt, ...);

#define log_debug(msg, ...) log_msg(LOG_DEBUG, msg, __VA_ARGS__)
#define log_info(msg, ...) log_msg(LOG_INFO, msg, __VA_ARGS__)
#define log_warn(msg, ...) log_msg(LOG_WARN, msg, __VA_ARGS__)
#define log_error(msg, ...) log_msg(LOG_ERROR, msg, __VA_ARGS__)
