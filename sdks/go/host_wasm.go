//go:build wasip1

package sluice

// Inside a component: the host is the `wit-bindgen go` bindings, which
// sdks/go/build.sh generates into internal/wit at every build (never
// committed). This file is the only one that imports them; everything else
// talks to internal/hostapi's plain Go types, so that the package also
// builds natively, against the simulated host, for unit tests.

import (
	"runtime/debug"

	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"sluice.dev/sdk/go/internal/hostapi"
	"sluice.dev/sdk/go/internal/wit/exports/export_wit_world"
	_ "sluice.dev/sdk/go/internal/wit/exports/wit_exports" // the component's exports
	"sluice.dev/sdk/go/internal/wit/imports/sluice_transform_log"
	"sluice.dev/sdk/go/internal/wit/imports/sluice_transform_state"
	"sluice.dev/sdk/go/internal/wit/imports/sluice_transform_time"
	"sluice.dev/sdk/go/internal/wit/imports/sluice_transform_types"
)

func init() {
	hostapi.Current = witHost{}
	export_wit_world.InitHook = witInit
	export_wit_world.ProcessHook = witProcess
	export_wit_world.ProcessPackedHook = witProcessPacked
	export_wit_world.ProcessPackedOutHook = witProcessPackedOut
	export_wit_world.HoldStateHook = holdState
	export_wit_world.FlushStateHook = witFlushState
	export_wit_world.OnTimersHook = witOnTimers
	export_wit_world.MigrateHook = witMigrate
	manualGC = true
	debug.SetGCPercent(-1) // see maybeGC
}

type (
	unit      = witTypes.Unit
	witInput  = sluice_transform_types.InputRecord
	witOutput = sluice_transform_types.OutputRecord
	witOpt    = witTypes.Option[[]byte]
)

func witInit(config []witTypes.Tuple2[string, string]) witTypes.Result[unit, string] {
	pairs := make([][2]string, len(config))
	for i, e := range config {
		pairs[i] = [2]string{e.F0, e.F1}
	}
	if err := initExport(pairs); err != nil {
		return witTypes.Err[unit](err.Error())
	}
	return witTypes.Ok[unit, string](unit{})
}

func witProcess(records []witInput) witTypes.Result[[]witOutput, string] {
	in := make([]hostapi.InputRecord, len(records))
	for i := range records {
		r := &records[i]
		in[i] = hostapi.InputRecord{
			Key: r.Key.SomeOr(nil), HasKey: r.Key.IsSome(),
			Value: r.Value.SomeOr(nil), HasValue: r.Value.IsSome(),
			Timestamp: r.Timestamp.SomeOr(0), HasTimestamp: r.Timestamp.IsSome(),
			Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		}
		if len(r.Headers) > 0 {
			hs := make([]hostapi.Header, len(r.Headers))
			for j, h := range r.Headers {
				hs[j] = hostapi.Header{Key: h.Key, Value: h.Value}
			}
			in[i].Headers = hs
		}
	}
	return witResult(processExport(in))
}

// witResult is what `process`, `process-packed` and `on-timers` return:
// the outputs, or the error that failed the call.
func witResult(out []hostapi.OutputRecord, err error) witTypes.Result[[]witOutput, string] {
	if err != nil {
		return witTypes.Err[[]witOutput](err.Error())
	}
	return witTypes.Ok[[]witOutput, string](witOutputs(out))
}

// witProcessPacked is `process-packed`, which a host of 0.1.3 or later
// calls instead of `process`: the batch is one byte string, and its
// records' keys and values are views into it (no allocation, and no pin,
// per record).
func witProcessPacked(batch []byte) witTypes.Result[[]witOutput, string] {
	in, err := hostapi.UnpackBatch(batch)
	if err != nil {
		return witTypes.Err[[]witOutput](err.Error())
	}
	packed, err := processPacked(in, nil, true)
	if err != nil {
		return witTypes.Err[[]witOutput](err.Error())
	}
	return witResult(hostapi.UnpackOutputs(packed))
}

// packedOut holds what `process-packed-out` returned last: the host copies
// it before the next call, so its allocation is reused from batch to batch.
var packedOut []byte

// witProcessPackedOut is `process-packed-out`, which a host of 0.1.5 or
// later calls instead of `process-packed`: the outputs go back as one byte
// string, so returning them allocates and pins nothing per record.
func witProcessPackedOut(batch []byte) witTypes.Result[[]byte, string] {
	in, err := hostapi.UnpackBatch(batch)
	if err != nil {
		return witTypes.Err[[]byte](err.Error())
	}
	out, err := processPacked(in, packedOut, true)
	if err != nil {
		return witTypes.Err[[]byte](err.Error())
	}
	packedOut = out
	return witTypes.Ok[[]byte, string](packedOut)
}

// witFlushState is `flush-state`: what is held of the shard goes to the
// host (one `state.write-packed`, which cannot fail: a refused write traps).
func witFlushState(shard uint32) witTypes.Result[unit, string] {
	flushState(shard)
	return witTypes.Ok[unit, string](unit{})
}

func witOnTimers(fired []sluice_transform_time.Timer) witTypes.Result[[]witOutput, string] {
	timers := make([]hostapi.Timer, len(fired))
	for i, t := range fired {
		timers[i] = hostapi.Timer{Clock: t.Clock, Key: t.Key, At: t.At}
	}
	return witResult(onTimersExport(timers))
}

func witMigrate(fromModule string) witTypes.Result[unit, string] {
	if err := migrateExport(fromModule); err != nil {
		return witTypes.Err[unit](err.Error())
	}
	return witTypes.Ok[unit, string](unit{})
}

func option(b []byte, present bool) witOpt {
	if !present {
		return witTypes.None[[]byte]()
	}
	return witTypes.Some(b)
}

func witOutputs(records []hostapi.OutputRecord) []witOutput {
	out := make([]witOutput, len(records))
	for i := range records {
		r := &records[i]
		o := witOutput{Key: option(r.Key, r.HasKey), Value: option(r.Value, r.HasValue), Topic: witTypes.None[string]()}
		if r.HasTopic {
			o.Topic = witTypes.Some(r.Topic)
		}
		if len(r.Headers) > 0 {
			o.Headers = make([]sluice_transform_types.Header, len(r.Headers))
			for j, h := range r.Headers {
				o.Headers[j] = sluice_transform_types.Header{Key: h.Key, Value: h.Value}
			}
		}
		out[i] = o
	}
	return out
}

// witHost is hostapi.Host over the generated imports.
type witHost struct{}

func (witHost) Get(key []byte) hostapi.Value {
	v := sluice_transform_state.Get(key)
	return hostapi.Value{Bytes: v.SomeOr(nil), Present: v.IsSome()}
}

// GetMany is `state.get-many-packed`: the keys and the values each cross
// as one byte string.
func (witHost) GetMany(packedKeys []byte, n int) []hostapi.Value {
	answer := sluice_transform_state.GetManyPacked(packedKeys)
	values, err := hostapi.UnpackValues(answer, n)
	if err != nil {
		// The host broke the contract; no value may pass for absent.
		panic(err)
	}
	return values
}

// Write is `state.write-packed`.
func (witHost) Write(packedEntries []byte) {
	sluice_transform_state.WritePacked(packedEntries)
}

func (witHost) ScanPrefix(prefix, startAfter []byte, hasStartAfter bool, limit uint32) []hostapi.Entry {
	page := sluice_transform_state.ScanPrefix(prefix, option(startAfter, hasStartAfter), limit)
	out := make([]hostapi.Entry, len(page))
	for i, e := range page {
		out[i] = hostapi.Entry{Key: e.F0, Value: e.F1, Present: true}
	}
	return out
}

func (witHost) Log(level uint8, message string) {
	sluice_transform_log.Log(sluice_transform_log.Level(level), message)
}

func (witHost) Watermark() (int64, bool) {
	w := sluice_transform_time.Watermark()
	return w.SomeOr(0), w.IsSome()
}

func (witHost) ProcessingTime() int64 { return sluice_transform_time.ProcessingTime() }

func (witHost) SetTimer(t hostapi.Timer) {
	sluice_transform_time.SetTimer(sluice_transform_time.Timer{Clock: t.Clock, Key: t.Key, At: t.At})
}

func (witHost) DeleteTimer(t hostapi.Timer) {
	sluice_transform_time.DeleteTimer(sluice_transform_time.Timer{Clock: t.Clock, Key: t.Key, At: t.At})
}
