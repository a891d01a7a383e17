// Package sluice writes sluice transforms in Go (module sluice.dev/sdk/go).
//
// A sluice transform is a WebAssembly component (world
// `sluice:transform/packed-out`, wit/sluice.wit) that the host feeds batches of
// Kafka records; it returns the records to write and keeps keyed state
// that the host checkpoints together with the input offsets, exactly once.
// This package is the Go counterpart of the Rust crate sluice-guest and of
// the Python and JavaScript SDKs, with the same state layout:
//
//   - [Transform] (plus the optional [BatchBeginner], [BatchEnder],
//     [TimerHandler] and [Migrator]) is what you implement, and [Export]
//     registers it;
//   - [Record] and [Batch] to read input, [Emitter] and [Output] to write;
//   - [Config] for the job's settings ([Config.Duration] reads "10s");
//   - [ValueState], [MapState] and [ListState]: typed keyed state behind a
//     per-call cache, with an optional time-to-live ([ValueState.WithTTL]);
//   - [Watermark], [ProcessingTime], [Timer] and [Record.IsLate]: event
//     time and timers;
//   - [Windows] (tumbling, hopping) and [SessionWindows]: event-time windows
//     built on state and timers;
//   - [Logf]: lines in the host's log.
//
// A running count per key:
//
//	var counts = sluice.NewValueState[uint64]("count")
//
//	type runningCount struct{}
//
//	func (runningCount) BeginBatch(b *sluice.Batch) error {
//		return counts.Prefetch(b.Keys()) // one state.get-many per batch
//	}
//
//	func (runningCount) Process(r *sluice.Record, out *sluice.Emitter) error {
//		n, err := counts.Update(r.KeyOrEmpty(), func(n uint64, _ bool) uint64 { return n + 1 })
//		if err != nil {
//			return err
//		}
//		out.Emit(r.KeyOrEmpty(), []byte(strconv.FormatUint(n, 10)))
//		return nil
//	}
//
//	func init() {
//		sluice.Export(func(*sluice.Config) (sluice.Transform, error) { return runningCount{}, nil })
//	}
//
//	func main() {}
//
// # The call lifecycle
//
// The host calls init once per instance with the job's configuration: the
// function given to [Export] builds the transform (an error fails the job).
// Then, for every batch: BeginBatch, Process for each record in input order,
// EndBatch; then the SDK writes the batch's state changes back in one
// `state.write` call and returns the emitted records. When timers are due
// the host calls on-timers: the SDK first handles its own time-to-live
// timers, then calls OnTimer for each other timer in order, then writes the
// state back. After an upgrade, Migrate runs once per shard before the
// first batch. An error (or a panic) in any hook fails the whole call: the
// SDK drops its outputs and unflushed state writes and returns the message
// (for Process prefixed with `record <topic>-<partition>@<offset>: `, for
// OnTimer with `timer <Clock> "<key>"@<at>: `); the host discards the
// call's effects and replays from the last checkpoint.
//
// # State
//
// Every call into the host crosses the component boundary, which costs far
// more than a map lookup in the guest, so state goes through a write-back
// cache that lives for one call, as in the Rust SDK: reads are served from
// it (a miss costs one `state.get`; Prefetch loads many keys with one
// `state.get-many`), writes only mark entries dirty, and all dirty entries
// go to the host in one `state.write` when the call succeeds. Nothing is
// cached across calls.
//
// Keys and values use the Rust SDK's layout, so Rust, Python, JavaScript,
// Go and C transforms can read each other's state: [ValueState] and
// [ListState] `name` with record key `k` is host key `name 0x00 k`,
// [MapState] `name 0x00 u32_be(len(k)) k mapkey`; values are compact JSON
// (encoding/json without HTML escaping), with a time-to-live
// `[expires_at_ms,value]`.
//
// # Native tests
//
// Built natively (not GOOS=wasip1), the package runs against a simulated
// host: an in-memory state store, a settable watermark and clock, and the
// timers set. Package [sluice.dev/sdk/go/sluicetest] drives a transform as
// the host would.
package sluice

import (
	"fmt"
	"runtime"
	"runtime/metrics"

	"sluice.dev/sdk/go/internal/hostapi"
)

// Transform is what a transform implements: Process is called for each
// record of a batch, in input order.
type Transform interface {
	Process(record *Record, out *Emitter) error
}

// BatchBeginner is implemented by transforms that want a hook before a
// batch's first record, e.g. to prefetch the batch's state.
type BatchBeginner interface {
	BeginBatch(batch *Batch) error
}

// BatchEnder is implemented by transforms that want a hook after a batch's
// last record, e.g. to emit aggregates.
type BatchEnder interface {
	EndBatch(out *Emitter) error
}

// TimerHandler is implemented by transforms that set timers (or use
// [Windows] or [SessionWindows]). OnTimer is called for each due timer of
// the shard, in time order: an event-time timer once the watermark reaches
// its time, a processing-time one once the host's clock does. The timer is
// already removed; set it again to fire again. State is written back after
// the call's last timer, as for a batch; an error fails the call (the host
// restarts the task from its last checkpoint and the timers fire again).
// Time-to-live timers never get here. A transform without OnTimer ignores
// its timers.
type TimerHandler interface {
	OnTimer(timer *Timer, out *Emitter) error
}

// Migrator is implemented by transforms that take over the state of the
// module a job ran before an upgrade. Migrate is called once per shard
// after the upgrade, after the constructor and before the first batch,
// with the sha256 (hex) of the module that wrote the state: rewrite old
// state in this module's layout there ([ScanPrefix] pages through it). Its
// writes are part of the next checkpoint; if the task restarts before that
// commits, it runs again over the old state. Without it, state is kept as
// it is.
type Migrator interface {
	Migrate(fromModule string) error
}

var (
	factory  func(*Config) (Transform, error)
	instance Transform
)

// Export registers the function that builds the transform from the job's
// configuration. Call it once, from an init function of package main.
func Export(newTransform func(config *Config) (Transform, error)) {
	factory = newTransform
}

func init() {
	hostapi.Guest.Init = initExport
	hostapi.Guest.Process = processExport
	hostapi.Guest.OnTimers = onTimersExport
	hostapi.Guest.Migrate = migrateExport
	hostapi.Guest.NewCall = func() { dropCaches(); newCall() }
	hostapi.Guest.Finish = func() { cache.finish() }
}

// host returns the host of the running call.
func host() hostapi.Host { return hostapi.Current }

// The Go collector reads the wall clock (and may poll timers) while it
// works, and with the usual pacing any allocation may start it. That is fine
// while a hook runs, but not inside cabi_realloc, which the host calls to
// copy a batch into guest memory and to return state values: calls out of
// the component are forbidden there, so the preview1 adapter's
// clock_time_get would trap the instance ("cannot leave component
// instance"; the adapter's adapter_monotonic_clock_set_paused, which the
// generated runtime uses, covers only the monotonic clock). So inside a
// component (host_wasm.go) the SDK turns the pacer off (GOGC=off) and
// collects itself, at points where calls out are allowed (in an export,
// outside the generated glue): every gcCheckEvery records or calls it
// checks whether the heap has doubled since the last collection (GOGC=100's
// rule), and if so collects. (Toggling GOGC around every host call instead
// cost ~40 µs per call; reading the heap size on every call ~10% of a
// one-record call.) Natively the Go pacer runs as usual.
const (
	gcCheckEvery = 64
	gcMinHeap    = 4 << 20 // bytes of heap objects below which it never collects
)

var (
	manualGC bool // set by host_wasm.go
	gcSample = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	gcNext   = uint64(gcMinHeap)
	gcBudget = gcCheckEvery
)

// gcAccount counts units of work (records, calls, timers) towards the next
// heap check.
func gcAccount(units int) {
	if !manualGC {
		return
	}
	gcBudget -= units
	if gcBudget > 0 {
		return
	}
	gcBudget = gcCheckEvery
	maybeGC()
}

// maybeGC collects if the heap has doubled since the last collection.
func maybeGC() {
	metrics.Read(gcSample)
	if gcSample[0].Value.Uint64() < gcNext {
		return
	}
	runtime.GC()
	metrics.Read(gcSample)
	gcNext = max(2*gcSample[0].Value.Uint64(), gcMinHeap)
}

// begin starts an export call (of shard's batch, if has: its state may be
// held): its cache (see beginCache), and the watermark and clock asked
// afresh.
func begin(shard uint32, has bool) {
	beginCache(shard, has)
	newCall()
}

func initExport(config [][2]string) error {
	gcAccount(gcCheckEvery)
	if factory == nil {
		return fmt.Errorf("no transform: call sluice.Export from an init function of package main")
	}
	hold.max = 0 // until `hold-state`, which follows `init`
	dropCaches()
	newCall()
	var t Transform
	err := guard(func() (err error) {
		t, err = factory(newConfig(config))
		return err
	})
	if err != nil {
		dropCaches()
		return err
	}
	if t == nil {
		return fmt.Errorf("the function given to sluice.Export returned no transform")
	}
	cache.finish() // state touched in init is written back now, and the host refuses it: state belongs to an input partition
	instance = t
	return nil
}

// processExport is `process` (and `process-packed`): the outputs as records.
func processExport(records []hostapi.InputRecord) ([]hostapi.OutputRecord, error) {
	packed, err := processPacked(records, nil, false)
	if err != nil {
		return nil, err
	}
	return hostapi.UnpackOutputs(packed)
}

// processPacked runs a batch; its outputs are packed (`packed-outputs`)
// into buf's storage (nil: new storage). With mayHold (a packed call), the
// state of the batch's shard (its partition) may stay cached after it.
func processPacked(records []hostapi.InputRecord, buf []byte, mayHold bool) ([]byte, error) {
	gcAccount(1)
	if instance == nil {
		return nil, fmt.Errorf("process called before init")
	}
	batch := newBatch(records)
	out := &Emitter{}
	out.out.Reset(buf)
	hasShard := mayHold && len(records) > 0 && records[0].Partition >= 0
	var shard uint32
	if hasShard {
		shard = uint32(records[0].Partition)
	}
	begin(shard, hasShard)
	if err := runBatch(instance, batch, out); err != nil {
		dropCaches()
		return nil, err
	}
	endCache()
	return out.out.Bytes(), nil
}

func runBatch(t Transform, batch *Batch, out *Emitter) error {
	if b, ok := t.(BatchBeginner); ok {
		if err := guard(func() error { return b.BeginBatch(batch) }); err != nil {
			return fmt.Errorf("begin_batch: %w", err)
		}
	}
	if err := processRecords(t, batch, out); err != nil {
		return err
	}
	if e, ok := t.(BatchEnder); ok {
		if err := guard(func() error { return e.EndBatch(out) }); err != nil {
			return fmt.Errorf("end_batch: %w", err)
		}
	}
	return nil
}

// processRecords hands each record of batch to t.Process; an error or a
// panic fails the batch, naming the record. One deferred recover for the
// whole batch, not a guard per record: a defer per record cost ~3% of a
// running count's time in the component.
func processRecords(t Transform, batch *Batch, out *Emitter) (err error) {
	i := 0
	defer func() {
		if p := recover(); p != nil {
			r := &batch.records[i]
			err = fmt.Errorf("record %s-%d@%d: panic: %v", r.Topic(), r.Partition(), r.Offset(), p)
		}
	}()
	for ; i < len(batch.records); i++ {
		gcAccount(1)
		r := &batch.records[i]
		if err := t.Process(r, out); err != nil {
			return fmt.Errorf("record %s-%d@%d: %w", r.Topic(), r.Partition(), r.Offset(), err)
		}
	}
	return nil
}

func onTimersExport(fired []hostapi.Timer) ([]hostapi.OutputRecord, error) {
	gcAccount(1)
	if instance == nil {
		return nil, fmt.Errorf("on-timers called before init")
	}
	out := &Emitter{}
	out.out.Reset(nil)
	begin(0, false)
	handler, _ := instance.(TimerHandler)
	for i := range fired {
		gcAccount(1)
		timer := timerFromHost(fired[i])
		expired, err := expire(&timer)
		if err != nil {
			dropCaches()
			return nil, err
		}
		if expired || handler == nil {
			continue
		}
		if err := guard(func() error { return handler.OnTimer(&timer, out) }); err != nil {
			dropCaches()
			return nil, fmt.Errorf("timer %s %s@%d: %w", timer.Clock, debugString(timer.Key), timer.At, err)
		}
	}
	cache.finish()
	return hostapi.UnpackOutputs(out.out.Bytes())
}

func migrateExport(fromModule string) error {
	gcAccount(1)
	if instance == nil {
		return fmt.Errorf("migrate called before init")
	}
	begin(0, false)
	if m, ok := instance.(Migrator); ok {
		if err := guard(func() error { return m.Migrate(fromModule) }); err != nil {
			dropCaches()
			return err
		}
	}
	cache.finish()
	return nil
}

// guard runs f, turning a panic into an error so that it fails the call
// with a message instead of trapping the instance.
func guard(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return f()
}
