// Package export_wit_world is where the export glue that `wit-bindgen go`
// generates at build time (internal/wit/exports/wit_exports) calls the
// world's exported functions, `init` and `process`.
//
// Hand-written, not generated: it only forwards to hooks that package sluice
// installs from its init function, so that it need not import sluice (which
// imports the glue, and would make a cycle).
package export_wit_world

import (
	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"sluice/internal/wit/imports/sluice_transform_types"
)

// The world's exports, as package sluice implements them.
var (
	InitHook    func(config []witTypes.Tuple2[string, string]) witTypes.Result[witTypes.Unit, string]
	ProcessHook func(batch []sluice_transform_types.InputRecord) witTypes.Result[[]sluice_transform_types.OutputRecord, string]
)

// Init is the export `init`.
func Init(config []witTypes.Tuple2[string, string]) witTypes.Result[witTypes.Unit, string] {
	return InitHook(config)
}

// Process is the export `process`.
func Process(batch []sluice_transform_types.InputRecord) witTypes.Result[[]sluice_transform_types.OutputRecord, string] {
	return ProcessHook(batch)
}
