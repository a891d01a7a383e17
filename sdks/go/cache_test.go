package sluice

// Tests of the per-call state cache itself, from inside the package.

import (
	"testing"

	"sluice.dev/sdk/go/internal/hostapi"
	"sluice.dev/sdk/go/internal/simhost"
)

// brokenGetMany is a host whose `state.get-many` answers with no values.
type brokenGetMany struct{ *simhost.Host }

func (brokenGetMany) GetMany([]byte, int) []hostapi.Value { return nil }

// withHost runs f with h as the host and a fresh cache.
func withHost(t *testing.T, h hostapi.Host, f func()) {
	t.Helper()
	previous := hostapi.Current
	hostapi.Current = h
	defer func() { hostapi.Current = previous; cache.discard() }()
	cache.discard()
	f()
}

func TestAKeyWhosePrefetchFailedIsReadFromTheHost(t *testing.T) {
	sim := simhost.New()
	sim.State["count\x00k"] = []byte("41")
	withHost(t, brokenGetMany{sim}, func() {
		counts := NewValueState[uint64]("count")
		if err := counts.Prefetch([][]byte{[]byte("k")}); err == nil {
			t.Fatal("a get-many without values must fail the prefetch")
		}
		n, ok, err := counts.Get([]byte("k"))
		if err != nil || !ok || n != 41 {
			t.Fatalf("got %d, %v, %v; want the host's 41", n, ok, err)
		}
		// And a delete of it still goes to the host.
		if err := counts.Clear([]byte("k")); err != nil {
			t.Fatal(err)
		}
		cache.flush()
		if _, ok := sim.State["count\x00k"]; ok {
			t.Fatal("the delete did not reach the host")
		}
	})
}

func TestAWriteOfAKeyNeverReadGoesToTheHost(t *testing.T) {
	sim := simhost.New()
	withHost(t, sim, func() {
		counts := NewValueState[uint64]("count")
		// Nothing is known of the key: a delete must not be taken for "the
		// host has that already".
		sim.State["count\x00k"] = []byte("7")
		if err := counts.Clear([]byte("k")); err != nil {
			t.Fatal(err)
		}
		cache.flush()
		if _, ok := sim.State["count\x00k"]; ok {
			t.Fatal("the delete did not reach the host")
		}
		if got := sim.Calls["get"]; got != 0 {
			t.Fatalf("a write asked the host for the value %d times", got)
		}
	})
}

// An update of a prefetched key (the running count's work per record)
// costs no allocation of its own: the key is looked up in scratch space
// and the number's text goes into the call's space.
func TestUpdatingAPrefetchedCountAllocatesNothingPerRecord(t *testing.T) {
	withHost(t, simhost.New(), func() {
		counts := NewValueState[uint64]("count")
		key := []byte("user-00042")
		// Numbers above 255, which Go would box with an allocation.
		if err := counts.Set(key, 1<<40); err != nil {
			t.Fatal(err)
		}
		cache.finish()
		if err := counts.Prefetch([][]byte{key}); err != nil {
			t.Fatal(err)
		}
		increment := func(n uint64, _ bool) uint64 { return n + 1 }
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := counts.Update(key, increment); err != nil {
				t.Fatal(err)
			}
		})
		// An average, rounded down: the call's space for values takes one
		// allocation per 4 KiB, fewer than one per update.
		if allocs != 0 {
			t.Fatalf("%v allocations per update", allocs)
		}
		n, _, _ := counts.Get(key)
		if n != 1<<40+1001 { // AllocsPerRun runs f once more to warm up
			t.Fatalf("count %d", n)
		}
	})
}

func TestNumbersDecodeToTheirLimitsAndNoFurther(t *testing.T) {
	var u uint64
	if err := decode([]byte("18446744073709551615"), &u); err != nil || u != 1<<64-1 {
		t.Fatalf("max uint64: %d, %v", u, err)
	}
	if err := decode([]byte("18446744073709551616"), &u); err == nil {
		t.Fatal("2^64 decoded into a uint64")
	}
	var i int64
	if err := decode([]byte("-9223372036854775808"), &i); err != nil || i != -1<<63 {
		t.Fatalf("min int64: %d, %v", i, err)
	}
	if err := decode([]byte("9223372036854775807"), &i); err != nil || i != 1<<63-1 {
		t.Fatalf("max int64: %d, %v", i, err)
	}
	if err := decode([]byte("9223372036854775808"), &i); err == nil {
		t.Fatal("2^63 decoded into an int64")
	}
	if err := decode([]byte("-0"), &i); err != nil || i != 0 {
		t.Fatalf("-0: %d, %v", i, err)
	}
}
