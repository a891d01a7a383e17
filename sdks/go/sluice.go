// Package sluice writes sluice transforms in Go.
//
// A sluice transform is a WebAssembly component that the host feeds batches
// of Kafka records; it returns the records to write and keeps keyed state
// that the host checkpoints together with the input offsets, exactly once.
// This package is a thin layer over the bindings that `wit-bindgen go`
// generates from wit/sluice.wit at build time (sdks/go/build.sh):
//
//   - [Transform] (plus the optional [BatchBeginner] and [BatchEnder]) is
//     what you implement, and [Export] registers it;
//   - [Record] and [Batch] to read input, [Emitter] and [Output] to write;
//   - [Config] for the job's settings;
//   - [ValueState]: typed keyed state behind a per-batch cache;
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
// # The batch lifecycle
//
// The host calls init once per instance with the job's configuration: the
// function given to [Export] builds the transform (an error fails the job).
// Then, for every batch: BeginBatch, Process for each record in input order,
// EndBatch; then the SDK writes the batch's state changes back in one
// `state.write` call and returns the emitted records. An error (or a panic)
// in any hook fails the whole batch: the SDK drops the batch's outputs and
// unflushed state writes and returns the message (for Process prefixed with
// `record <topic>-<partition>@<offset>: `); the host discards the batch's
// effects and replays it from the last checkpoint.
//
// # State
//
// Every call into the host crosses the component boundary, which costs far
// more than a map lookup in the guest, so state goes through a write-back
// cache that lives for one batch, as in the Rust SDK: reads are served from
// it (a miss costs one `state.get`; [ValueState.Prefetch] loads many keys
// with one `state.get-many`), writes only mark entries dirty, and all dirty
// entries go to the host in one `state.write` when the batch succeeds.
// Nothing is cached across batches.
//
// Keys and values use the Rust SDK's layout, so Rust, Go and C transforms
// can read each other's state: [ValueState] `name` with record key `k` is
// host key `name 0x00 k`, and its value is the JSON text of the value
// (encoding/json, without HTML escaping).
package sluice

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"

	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"sluice/internal/wit/exports/export_wit_world"
	_ "sluice/internal/wit/exports/wit_exports" // the component's exports
	"sluice/internal/wit/imports/sluice_transform_types"
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
	export_wit_world.InitHook = initExport
	export_wit_world.ProcessHook = processExport
	debug.SetGCPercent(-1) // see maybeGC
}

// The Go collector reads the wall clock (and may poll timers) while it
// works, and with the usual pacing any allocation may start it. That is fine
// while a hook runs, but not inside cabi_realloc, which the host calls to
// copy a batch into guest memory and to return state values: calls out of
// the component are forbidden there, so the preview1 adapter's
// clock_time_get would trap the instance ("cannot leave component
// instance"; the adapter's adapter_monotonic_clock_set_paused, which the
// generated runtime uses, covers only the monotonic clock). So the SDK turns
// the pacer off (GOGC=off) and collects itself, at points where calls out
// are allowed (in an export, outside the generated glue): every
// gcCheckEvery records or calls it checks whether the heap has doubled since
// the last collection (GOGC=100's rule), and if so collects. (Toggling GOGC
// around every host call instead cost ~40 µs per call; reading the heap size
// on every call ~10% of a one-record call.)
const (
	gcCheckEvery = 64
	gcMinHeap    = 4 << 20 // bytes of heap objects below which it never collects
)

var (
	gcSample = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	gcNext   = uint64(gcMinHeap)
	gcBudget = gcCheckEvery
)

// gcAccount counts units of work (records, calls) towards the next heap
// check.
func gcAccount(units int) {
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

type (
	unit         = witTypes.Unit
	inputRecord  = sluice_transform_types.InputRecord
	outputRecord = sluice_transform_types.OutputRecord
)

func initExport(config []witTypes.Tuple2[string, string]) witTypes.Result[unit, string] {
	gcAccount(gcCheckEvery)
	if factory == nil {
		return witTypes.Err[unit]("no transform: call sluice.Export from an init function of package main")
	}
	cache.discard()
	var t Transform
	err := guard(func() (err error) {
		t, err = factory(newConfig(config))
		return err
	})
	if err != nil {
		cache.discard()
		return witTypes.Err[unit](err.Error())
	}
	cache.finish() // state touched in init is written back now, and the host refuses it: state belongs to an input partition
	instance = t
	return witTypes.Ok[unit, string](unit{})
}

func processExport(records []inputRecord) witTypes.Result[[]outputRecord, string] {
	gcAccount(1)
	if instance == nil {
		return witTypes.Err[[]outputRecord]("process called before init")
	}
	batch := newBatch(records)
	out := &Emitter{records: make([]outputRecord, 0, len(records))}
	cache.discard()
	if err := runBatch(instance, batch, out); err != nil {
		cache.discard()
		return witTypes.Err[[]outputRecord](err.Error())
	}
	cache.finish()
	return witTypes.Ok[[]outputRecord, string](out.records)
}

func runBatch(t Transform, batch *Batch, out *Emitter) error {
	if b, ok := t.(BatchBeginner); ok {
		if err := guard(func() error { return b.BeginBatch(batch) }); err != nil {
			return fmt.Errorf("begin_batch: %w", err)
		}
	}
	for i := range batch.records {
		gcAccount(1)
		r := &batch.records[i]
		if err := guard(func() error { return t.Process(r, out) }); err != nil {
			return fmt.Errorf("record %s-%d@%d: %w", r.Topic(), r.Partition(), r.Offset(), err)
		}
	}
	if e, ok := t.(BatchEnder); ok {
		if err := guard(func() error { return e.EndBatch(out) }); err != nil {
			return fmt.Errorf("end_batch: %w", err)
		}
	}
	return nil
}

// guard runs f, turning a panic into an error so that it fails the batch
// with a message instead of trapping the instance.
func guard(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return f()
}
