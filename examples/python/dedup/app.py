"""Passes each record whose value has not been seen for its key within a
time-to-live (config `ttl`, a duration, default `1h`), and drops the
repeats. The memory of a (key, value) expires, so the state holds only what
the last `ttl` brought (see README.md)."""

from sluice import MapState, Transform, export


class Dedup(Transform):
    def __init__(self, config):
        ttl = config.duration_ms("ttl", 3_600_000)
        # Per record key, a map from the value's bytes to `true`.
        self.seen = MapState("seen", key_type=bytes, ttl_ms=ttl)

    def process(self, record, out):
        key, value = record.key_or_empty(), record.value or b""
        if self.seen.get(key, value) is None:
            self.seen.set(key, value, True)
            out.forward(record)


WitWorld = export(Dedup)
