/*
 * A simulated sluice host for native unit tests of the C SDK: it implements
 * the functions the generated bindings (packed_out.h) import (state, log, time)
 * in memory, the way the host behaves, so sluice.c can be compiled with gcc
 * and driven through its exports.
 */
#ifndef FAKE_HOST_H
#define FAKE_HOST_H

#include "sluice.h"

typedef struct host_calls {
    int get, get_many, write, scan_prefix, watermark, processing_time, set_timer, delete_timer, log;
} host_calls_t;

extern host_calls_t host_calls;

/* Forgets all state (of every shard), timers and counters; no watermark,
 * clock 0, shard 0 served. */
void host_reset(void);
/* Serves `shard` (below 4) from now on: state calls and host_state_* reach
 * its store only, as the host scopes a call's state to its shard. */
void host_use_shard(uint32_t shard);
/* From now on (until host_reset), `get-many-packed` answers with one value
 * count too many: a host bug the SDK must report. */
void host_break_get_many(bool broken);
void host_set_watermark(bool some, int64_t at);
void host_set_now(int64_t at);

/* The stored value of `key` (a view, valid until the next write). */
bool host_state_get(const void *key, size_t len, sluice_bytes_t *value);
void host_state_put(const void *key, size_t len, const void *value, size_t vlen);
/* How many stored keys begin with `prefix`. */
size_t host_state_count(const void *prefix, size_t len);
size_t host_state_total(void);
/* The `i`th stored entry of the shard served, in key order (views, valid
 * until the next write); false past the last. */
bool host_state_entry(size_t i, sluice_bytes_t *key, sluice_bytes_t *value);

bool host_has_timer(sluice_clock_t clock, const void *key, size_t len, int64_t at);
size_t host_timers_pending(void);
/* How many of them are due (by the watermark and the clock). */
size_t host_timers_due(void);
/* Removes the due timers and returns them as the host hands them to
 * `on-timers` (malloc'd; the export frees them). */
packed_out_list_timer_t host_take_due(void);

/* The last log line (NUL-terminated). */
const char *host_last_log(void);

#endif
