/*
 * Counts records per key in tumbling event-time windows (config `window`, a
 * duration, default `1m`), and emits each window's count once, when the
 * watermark has passed its end (see README.md). The C twin of
 * examples/rust/windowed-count.
 */
#include <inttypes.h>

#include <sluice/sluice.h>

/* Set in init from the config; the layout is the Rust example's: window
 * `start` of key `k` is the map-state entry (`count`, start as an i64 map
 * key's 8 bytes, k), and each window end has one event-time timer `count`,
 * whatever the number of keys. */
static sluice_windows_t windows;

int sluice_transform_init(const sluice_config_t *config) {
    int64_t size, lateness;
    if (sluice_config_duration_ms(config, "window", 60000, &size)) return SLUICE_ERR;
    if (sluice_config_duration_ms(config, "allowed-lateness", 0, &lateness)) return SLUICE_ERR;
    windows = sluice_windows_allowed_lateness(sluice_windows_tumbling("count", size), lateness);
    if (size <= 0) return sluice_error("config key `window`: the window must be longer than 0 ms");
    return SLUICE_OK;
}

int sluice_transform_process(const sluice_record_t *record, sluice_emitter_t *out) {
    (void)out;
    /* A record for windows that have all closed is not counted; the host
     * counts it as late. */
    return sluice_windows_add_record(&windows, record, sluice_fold_count, NULL, NULL);
}

int sluice_transform_on_timer(const sluice_timer_t *timer, sluice_emitter_t *out) {
    /* A window end's timer closes its keys' windows, in key order (up to
     * SLUICE_WINDOWS_PER_FIRING a firing; the rest fire in the next round). */
    const sluice_window_t *closed;
    size_t n;
    if (sluice_windows_fire(&windows, timer, &closed, &n)) return SLUICE_ERR;
    sluice_buf_t value = {0};
    int rc = SLUICE_OK;
    for (size_t i = 0; i < n && rc == SLUICE_OK; i++) {
        const sluice_window_t *w = &closed[i];
        uint64_t count;
        if ((rc = sluice_json_u64(w->value, &count))) break;
        sluice_buf_clear(&value);
        sluice_buf_printf(&value, "{\"start\":%" PRId64 ",\"end\":%" PRId64 ",\"count\":%" PRIu64 "}", w->start, w->end,
                          count);
        rc = sluice_emit(out, w->key, sluice_buf_bytes(&value));
    }
    sluice_buf_free(&value);
    return rc;
}
