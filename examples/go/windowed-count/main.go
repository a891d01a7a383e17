// Command windowed-count counts records per key in tumbling event-time
// windows (config `window`, a duration, default `1m`) and emits each
// window's count once, when the watermark has passed its end (see
// README.md). The Go twin of examples/rust/windowed-count.
package main

import (
	"strconv"
	"time"

	sluice "sluice.dev/sdk/go"
)

type windowedCount struct {
	windows sluice.Windows[uint64]
}

func newWindowedCount(config *sluice.Config) (sluice.Transform, error) {
	size, err := config.Duration("window", time.Minute)
	if err != nil {
		return nil, err
	}
	lateness, err := config.Duration("allowed-lateness", 0)
	if err != nil {
		return nil, err
	}
	windows := sluice.TumblingWindows[uint64]("count", size).AllowedLateness(lateness)
	if err := windows.Check(); err != nil {
		return nil, err
	}
	return &windowedCount{windows: windows}, nil
}

func (t *windowedCount) Process(record *sluice.Record, _ *sluice.Emitter) error {
	// A record for windows that have all closed is not counted; the host
	// counts it as late.
	_, err := t.windows.AddRecord(record, func(n uint64, _ bool) uint64 { return n + 1 })
	return err
}

func (t *windowedCount) OnTimer(timer *sluice.Timer, out *sluice.Emitter) error {
	// One timer per window end: it closes every key's window of that end
	// (in key order, sluice.WindowsPerFiring at a time).
	windows, err := t.windows.Fire(timer)
	if err != nil {
		return err
	}
	for _, window := range windows {
		value := []byte(`{"start":`)
		value = strconv.AppendInt(value, window.Start, 10)
		value = append(value, `,"end":`...)
		value = strconv.AppendInt(value, window.End, 10)
		value = append(value, `,"count":`...)
		value = strconv.AppendUint(value, window.Value, 10)
		value = append(value, '}')
		out.Emit(window.Key, value)
	}
	return nil
}

func init() { sluice.Export(newWindowedCount) }

// main is not called: the component is a reactor, driven by its exports.
func main() {}
