// Emits, for each record, its key and the number of records seen so far
// with that key (see README.md).

import { Transform, ValueState, exportTransform } from "sluice-guest";

const COUNTS = new ValueState("count");

class RunningCount extends Transform {
  beginBatch(batch) {
    // One state.get-many call for the whole batch.
    COUNTS.prefetch(batch.keys());
  }

  process(record, out) {
    // Records without a key count under the empty key.
    const key = record.keyOrEmpty();
    const n = COUNTS.update(key, (n) => (n ?? 0) + 1);
    out.emit(key, String(n));
  }
}

export const { init, process, migrate, onTimers } = exportTransform(RunningCount);
