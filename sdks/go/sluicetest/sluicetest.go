// Package sluicetest is a simulated sluice host for native unit tests (the
// counterpart of the Rust SDK's time::testing and the Python SDK's
// sluice.testing): drive a transform as the host would, set the watermark
// and the clock, take the timers that are due as the host would fire them,
// and look at the in-memory state store.
//
//	func TestWindows(t *testing.T) {
//		sluicetest.Reset()
//		if err := sluicetest.Init(newMyTransform, [2]string{"window", "1m"}); err != nil {
//			t.Fatal(err)
//		}
//		out, err := sluicetest.Process(sluicetest.At("k", "v", 1_000))
//		...
//		sluicetest.SetWatermark(60_000)
//		out, err = sluicetest.FireDue()
//	}
//
// It works only natively (not GOOS=wasip1: inside a component the host
// keeps time), and keeps one global host: do not run such tests in
// parallel.
package sluicetest

import (
	sluice "sluice.dev/sdk/go"
	"sluice.dev/sdk/go/internal/hostapi"
	"sluice.dev/sdk/go/internal/simhost"
)

func sim() *simhost.Host {
	h, ok := hostapi.Current.(*simhost.Host)
	if !ok {
		panic("sluicetest: the host is not simulated (sluicetest is for native tests, not components)")
	}
	return h
}

// Reset forgets everything: state, timers, call counts and logs; the
// watermark is none and the clock 0.
func Reset() {
	sim()
	hostapi.Current = simhost.New()
	hostapi.Guest.NewCall()
}

// SetWatermark sets the watermark (tests may move it back; the host never
// does) and starts a new call (the cached watermark and clock are
// forgotten).
func SetWatermark(at int64) {
	h := sim()
	h.WatermarkAt, h.HasWatermark = at, true
	hostapi.Guest.NewCall()
}

// ClearWatermark sets the watermark to none (no partition has sent a
// record yet) and starts a new call.
func ClearWatermark() {
	h := sim()
	h.WatermarkAt, h.HasWatermark = 0, false
	hostapi.Guest.NewCall()
}

// SetProcessingTime sets the host's clock and starts a new call.
func SetProcessingTime(at int64) {
	sim().Now = at
	hostapi.Guest.NewCall()
}

// NewCall starts a new call: the cached watermark and clock and the state
// cache (with unwritten changes) are forgotten. For testing state or
// windows directly, outside Process and OnTimers.
func NewCall() { hostapi.Guest.NewCall() }

// Finish ends a call as the SDK does after a batch: writes the cached
// state changes back to the store and empties the cache.
func Finish() { hostapi.Guest.Finish() }

func timers(ts []hostapi.Timer) []sluice.Timer {
	out := make([]sluice.Timer, len(ts))
	for i, t := range ts {
		out[i] = sluice.Timer{Clock: sluice.Clock(t.Clock), Key: t.Key, At: t.At}
	}
	return out
}

// TakeDue removes and returns the due timers, in the order the host fires
// them: event-time timers at or below the watermark, then processing-time
// timers at or below the clock, each by time, then key.
func TakeDue() []sluice.Timer { return timers(sim().TakeDue()) }

// Pending returns the timers set, in firing order.
func Pending() []sluice.Timer { return timers(sim().Pending()) }

// State returns a copy of the store as the host holds it (written-back
// state only: after a call, or [Finish]).
func State() map[string][]byte {
	out := map[string][]byte{}
	for k, v := range sim().State {
		out[k] = v
	}
	return out
}

// Calls returns how many calls the host has seen, by WIT function (get,
// get-many, write, scan-prefix, log, watermark, processing-time,
// set-timer, delete-timer).
func Calls() map[string]int {
	out := map[string]int{}
	for k, v := range sim().Calls {
		out[k] = v
	}
	return out
}

// Logs returns the log lines so far, as "level: message".
func Logs() []string { return append([]string(nil), sim().Logs...) }

// Init registers newTransform (as [sluice.Export] does) and calls the
// world's init with config.
func Init(newTransform func(*sluice.Config) (sluice.Transform, error), config ...[2]string) error {
	sim()
	sluice.Export(newTransform)
	return hostapi.Guest.Init(config)
}

// Input is an input record; the zero value has no key, no value (a
// tombstone) and no timestamp, from topic "in", partition 0, offset 0.
type Input struct {
	Key          []byte
	HasKey       bool
	Value        []byte
	HasValue     bool
	Headers      []sluice.Header
	Timestamp    int64
	HasTimestamp bool
	Topic        string
	Partition    int32
	Offset       int64
}

// Rec is a record with key and value and no timestamp.
func Rec(key, value string) Input {
	return Input{Key: []byte(key), HasKey: true, Value: []byte(value), HasValue: true}
}

// At is a record with key and value at timestamp ts.
func At(key, value string, ts int64) Input {
	r := Rec(key, value)
	r.Timestamp, r.HasTimestamp = ts, true
	return r
}

// Output is an output record.
type Output struct {
	Key      []byte
	HasKey   bool
	Value    []byte
	HasValue bool
	Headers  []sluice.Header
	Topic    string
	HasTopic bool
}

func outputs(rs []hostapi.OutputRecord) []Output {
	out := make([]Output, len(rs))
	for i, r := range rs {
		out[i] = Output(r)
	}
	return out
}

// Process calls the world's process with records (offsets, where zero,
// are numbered in order; topics, where empty, are "in").
func Process(records ...Input) ([]Output, error) {
	sim()
	in := make([]hostapi.InputRecord, len(records))
	for i, r := range records {
		if r.Topic == "" {
			r.Topic = "in"
		}
		if r.Offset == 0 {
			r.Offset = int64(i)
		}
		in[i] = hostapi.InputRecord(r)
	}
	out, err := hostapi.Guest.Process(in)
	return outputs(out), err
}

// OnTimers calls the world's on-timers with fired.
func OnTimers(fired []sluice.Timer) ([]Output, error) {
	sim()
	ts := make([]hostapi.Timer, len(fired))
	for i, t := range fired {
		ts[i] = hostapi.Timer{Clock: uint8(t.Clock), Key: t.Key, At: t.At}
	}
	out, err := hostapi.Guest.OnTimers(ts)
	return outputs(out), err
}

// FireDue takes the due timers and, if there are any, calls on-timers with
// them, as the host does after each call (nil, nil if none are due). It is
// one round: timers that the call sets and that are due already (as
// [sluice.Windows.Fire] does, `name 0x01 last-key` at the same time, for a
// window end with more than [sluice.WindowsPerFiring] keys) fire in the
// next FireDue, so call it until it returns nothing to close every window.
func FireDue() ([]Output, error) {
	due := TakeDue()
	if len(due) == 0 {
		return nil, nil
	}
	return OnTimers(due)
}

// Migrate calls the world's migrate.
func Migrate(fromModule string) error {
	sim()
	return hostapi.Guest.Migrate(fromModule)
}
