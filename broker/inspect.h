/* Read-only views for operators: list, stat, peers, stats, rings and ring-stat replies. */
#pragma once

#include "request.h"

void inspect_list(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m);
void inspect_stat(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m);
void inspect_peers(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m);
void inspect_stats(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m);
void inspect_rings(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m);
void inspect_ring_stat(RequestCtx *ctx, RegPeer *p, const ProtoMsg *m);
