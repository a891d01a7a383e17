// Counts records per key in tumbling event-time windows (config `window`, a
// duration, default `1m`), and emits each window's count once, when the
// watermark has passed its end (see README.md).

import { Transform, Windows, exportTransform } from "sluice-guest";

class WindowedCount extends Transform {
  constructor(config) {
    super(config);
    const size = config.durationMs("window", 60_000);
    const lateness = config.durationMs("allowed-lateness", 0);
    this.windows = Windows.tumbling("count", size).allowedLateness(lateness);
  }

  process(record) {
    // A record for windows that have all closed is not counted; the host
    // counts it as late.
    this.windows.addRecord(record, (n) => (n ?? 0) + 1);
  }

  onTimer(timer, out) {
    for (const window of this.windows.fire(timer)) {
      out.emitJson(window.key, { start: window.start, end: window.end, count: window.value });
    }
  }
}

export const { init, process, migrate, onTimers } = exportTransform(WindowedCount);
