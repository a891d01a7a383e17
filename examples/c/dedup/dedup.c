/*
 * Passes each record whose value has not been seen for its key within a
 * time-to-live (config `ttl`, a duration, default `1h`), and drops the
 * repeats. The memory of a (key, value) expires, so the state holds only
 * what the last `ttl` brought (see README.md). The C twin of
 * examples/rust/dedup.
 */
#include <sluice/sluice.h>

/* Per record key, a map from the value's bytes to `true`, each entry with
 * a time-to-live (set in init): host key `seen 0x00 u32_be(len(key)) key
 * value`, value `[expires_at_ms,true]`. */
static sluice_map_state_t seen = {.name = "seen"};

int sluice_transform_init(const sluice_config_t *config) {
    return sluice_config_duration_ms(config, "ttl", 3600000, &seen.ttl_ms);
}

int sluice_transform_process(const sluice_record_t *record, sluice_emitter_t *out) {
    sluice_bytes_t key = sluice_record_key_or_empty(record), value = sluice_record_value_or_empty(record), json;
    bool found;
    if (sluice_map_get_json(&seen, key, value, &json, &found)) return SLUICE_ERR;
    if (found) return SLUICE_OK;
    if (sluice_map_set_json(&seen, key, value, sluice_str("true"))) return SLUICE_ERR;
    return sluice_forward(out, record);
}
