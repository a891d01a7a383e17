"""Counts records per key in tumbling event-time windows (config `window`, a
duration, default `1m`), and emits each window's count once, when the
watermark has passed its end (see README.md)."""

from sluice import Transform, Windows, export


class WindowedCount(Transform):
    def __init__(self, config):
        size = config.duration_ms("window", 60_000)
        lateness = config.duration_ms("allowed-lateness", 0)
        self.windows = Windows.tumbling("count", size).allowed_lateness(lateness)

    def process(self, record, out):
        # A record for windows that have all closed is not counted; the host
        # counts it as late.
        self.windows.add_record(record, lambda n: (n or 0) + 1)

    def on_timer(self, timer, out):
        # Every key's window that ends with this timer (in key order, up to
        # WINDOWS_PER_FIRING of them; a timer set by the SDK goes on after the last).
        for window in self.windows.fire(timer):
            out.emit_json(window.key, {"start": window.start, "end": window.end, "count": window.value})


WitWorld = export(WindowedCount)
