/* The broker's event loop (libuv). Built in two steps so that main can load the seccomp filter
 * after everything is set up and before the loop runs: server_new() creates the loop and every
 * handle, server_run() runs it until SIGTERM or SIGINT. */
#pragma once

#include <stdint.h>

#include "broker-limits.h"
#include "policy.h"
#include "policywatch.h"

typedef struct Server Server;

typedef struct ServerConfig {
        int listen_fd;         /* a bound, listening SOCK_SEQPACKET socket; the server owns it */
        Limits limits;
        uint64_t epoch;        /* this broker instance, random */
        uint64_t id_seed;      /* random: seeds the buffer ids the broker picks */
        uint64_t first_generation;
        uint32_t restart_grace_ms;
        uint32_t cpu_limit_milli; /* the CPU the broker keeps its use under (sched.h); 0: no limit */
        Policy *policy;        /* the server owns it; NULL = the built-in default */
        /* Called on SIGHUP: loads the policy again. 0 with *ret set (NULL = default), or <0 to keep the old one. */
        int (*reload_policy)(void *userdata, Policy **ret);
        void *reload_userdata;
        /* Reloads the policy when its file changes, as SIGHUP does; owned by the server once
         * server_new() succeeds; NULL: SIGHUP only. */
        PolicyWatch *policy_watch;
} ServerConfig;

int server_new(Server **ret, const ServerConfig *cfg);
int server_run(Server *s);
Server *server_free(Server *s);
