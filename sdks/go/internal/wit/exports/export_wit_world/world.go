//go:build wasip1

// Package export_wit_world is where the export glue that `wit-bindgen go`
// generates at build time (internal/wit/exports/wit_exports) calls the
// exported functions of world `packed-out`: `init`, `process`,
// `process-packed`, `process-packed-out`, `on-timers`, `migrate`,
// `hold-state` and `flush-state`.
//
// Hand-written, not generated: it only forwards to hooks that package sluice
// installs from its init function (host_wasm.go), so that it need not import
// sluice (which imports the glue, and would make a cycle).
package export_wit_world

import (
	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"sluice.dev/sdk/go/internal/wit/imports/sluice_transform_time"
	"sluice.dev/sdk/go/internal/wit/imports/sluice_transform_types"
)

// The world's exports, as package sluice implements them.
var (
	InitHook    func(config []witTypes.Tuple2[string, string]) witTypes.Result[witTypes.Unit, string]
	ProcessHook func(batch []sluice_transform_types.InputRecord) witTypes.Result[[]sluice_transform_types.OutputRecord, string]
	// ProcessPackedHook takes the batch as one byte string (`packed-batch`).
	ProcessPackedHook func(batch []uint8) witTypes.Result[[]sluice_transform_types.OutputRecord, string]
	// ProcessPackedOutHook also returns the outputs as one byte string
	// (`packed-outputs`).
	ProcessPackedOutHook func(batch []uint8) witTypes.Result[[]uint8, string]
	OnTimersHook         func(fired []sluice_transform_time.Timer) witTypes.Result[[]sluice_transform_types.OutputRecord, string]
	MigrateHook          func(fromModule string) witTypes.Result[witTypes.Unit, string]
	HoldStateHook        func(maxBytes uint64)
	FlushStateHook       func(shard uint32) witTypes.Result[witTypes.Unit, string]
)

// Init is the export `init`.
func Init(config []witTypes.Tuple2[string, string]) witTypes.Result[witTypes.Unit, string] {
	return InitHook(config)
}

// Process is the export `process`.
func Process(batch []sluice_transform_types.InputRecord) witTypes.Result[[]sluice_transform_types.OutputRecord, string] {
	return ProcessHook(batch)
}

// ProcessPacked is the export `process-packed`.
func ProcessPacked(batch []uint8) witTypes.Result[[]sluice_transform_types.OutputRecord, string] {
	return ProcessPackedHook(batch)
}

// ProcessPackedOut is the export `process-packed-out`.
func ProcessPackedOut(batch []uint8) witTypes.Result[[]uint8, string] {
	return ProcessPackedOutHook(batch)
}

// HoldState is the export `hold-state`.
func HoldState(maxBytes uint64) { HoldStateHook(maxBytes) }

// FlushState is the export `flush-state`.
func FlushState(shard uint32) witTypes.Result[witTypes.Unit, string] {
	return FlushStateHook(shard)
}

// OnTimers is the export `on-timers`.
func OnTimers(fired []sluice_transform_time.Timer) witTypes.Result[[]sluice_transform_types.OutputRecord, string] {
	return OnTimersHook(fired)
}

// Migrate is the export `migrate`.
func Migrate(fromModule string) witTypes.Result[witTypes.Unit, string] {
	return MigrateHook(fromModule)
}
