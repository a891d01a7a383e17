// Command running-count emits, for each record, its key and the number of
// records seen so far with that key (see README.md). The Go twin of
// examples/rust/running-count.
package main

import (
	"strconv"

	sluice "sluice.dev/sdk/go"
)

// Host key `count 0x00 <key>`, value the JSON number: the same entries the
// Rust example's `ValueState<u64>::new("count")` reads and writes.
var counts = sluice.NewValueState[uint64]("count")

type runningCount struct{}

func (runningCount) BeginBatch(batch *sluice.Batch) error {
	// One state.get-many call for the whole batch.
	return counts.Prefetch(batch.Keys())
}

func (runningCount) Process(record *sluice.Record, out *sluice.Emitter) error {
	// Records without a key count under the empty key.
	key := record.KeyOrEmpty()
	n, err := counts.Update(key, func(n uint64, _ bool) uint64 { return n + 1 })
	if err != nil {
		return err
	}
	// Emit copies the value: the digits can live on the stack.
	var digits [20]byte
	out.Emit(key, strconv.AppendUint(digits[:0], n, 10))
	return nil
}

func init() {
	sluice.Export(func(*sluice.Config) (sluice.Transform, error) { return runningCount{}, nil })
}

// main is not called: the component is a reactor, driven by its exports.
func main() {}
