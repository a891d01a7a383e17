// Command dedup passes each record whose value has not been seen for its
// key within a time-to-live (config `ttl`, a duration, default `1h`), and
// drops the repeats. The memory of a (key, value) expires, so the state
// holds only what the last `ttl` brought (see README.md). The Go twin of
// examples/rust/dedup.
package main

import (
	"time"

	sluice "sluice.dev/sdk/go"
)

type dedup struct {
	// Per record key, a map from the value's bytes to true.
	seen sluice.MapState[[]byte, bool]
}

func newDedup(config *sluice.Config) (sluice.Transform, error) {
	ttl, err := config.Duration("ttl", time.Hour)
	if err != nil {
		return nil, err
	}
	return &dedup{seen: sluice.NewMapState[[]byte, bool]("seen").WithTTL(ttl)}, nil
}

func (t *dedup) Process(record *sluice.Record, out *sluice.Emitter) error {
	key, value := record.KeyOrEmpty(), record.ValueOrEmpty()
	_, seen, err := t.seen.Get(key, value)
	if err != nil || seen {
		return err
	}
	if err := t.seen.Set(key, value, true); err != nil {
		return err
	}
	out.Forward(record)
	return nil
}

func init() { sluice.Export(newDedup) }

// main is not called: the component is a reactor, driven by its exports.
func main() {}
