/*
 * Emits, for each record, its key and the number of records seen so far
 * with that key (see README.md). The C twin of examples/rust/running-count.
 */
#include <sluice/sluice.h>

/* Host key `count 0x00 <key>`, value the JSON number: the same entries the
 * Rust example's `ValueState<u64>::new("count")` reads and writes. */
static const sluice_value_state_t COUNTS = {.name = "count"};

int sluice_transform_init(const sluice_config_t *config) {
    (void)config;
    return SLUICE_OK;
}

int sluice_transform_begin_batch(const sluice_batch_t *batch) {
    /* One state.get-many call for the whole batch. */
    return sluice_value_prefetch(&COUNTS, batch);
}

int sluice_transform_process(const sluice_record_t *record, sluice_emitter_t *out) {
    /* Records without a key count under the empty key. */
    sluice_bytes_t key = sluice_record_key_or_empty(record);
    uint64_t n;
    if (sluice_value_add_u64(&COUNTS, key, 1, &n) != SLUICE_OK) return SLUICE_ERR;
    char text[21];
    return sluice_emit(out, key, sluice_u64_text(n, text));
}
