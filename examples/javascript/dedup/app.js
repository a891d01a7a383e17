// Passes each record whose value has not been seen for its key within a
// time-to-live (config `ttl`, a duration, default `1h`), and drops the
// repeats. The memory of a (key, value) expires, so the state holds only
// what the last `ttl` brought (see README.md).

import { MapState, Transform, exportTransform } from "sluice-guest";

const EMPTY = new Uint8Array(0);

class Dedup extends Transform {
  constructor(config) {
    super(config);
    const ttl = config.durationMs("ttl", 3_600_000);
    // Per record key, a map from the value's bytes to `true`.
    this.seen = new MapState("seen", { keyType: "bytes", ttlMs: ttl });
  }

  process(record, out) {
    const key = record.keyOrEmpty();
    const value = record.value ?? EMPTY;
    if (this.seen.get(key, value) === undefined) {
      this.seen.set(key, value, true);
      out.forward(record);
    }
  }
}

export const { init, process, migrate, onTimers } = exportTransform(Dedup);
