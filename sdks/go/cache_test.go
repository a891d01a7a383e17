package sluice

// Tests of the per-call state cache itself, from inside the package.

import (
	"fmt"
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

// A count of any JSON form is read (or refused) by ValueState[uint64]'s
// digits path (Get, Update) exactly as by the generic path, and written
// the same.
func TestTheCountPathAgreesWithTheGenericPath(t *testing.T) {
	fast := NewValueState[uint64]("count")
	generic := ValueState[uint64]{name: "count"} // not made by NewValueState
	if !fast.u64 || generic.u64 {
		t.Fatal("NewValueState[uint64] must take the digits path, a zero ValueState not")
	}
	if NewValueState[int64]("n").u64 {
		t.Fatal("an int64 state took the uint64 path")
	}
	for _, text := range []string{
		"0", "7", "42", "1234567890123456789", "9999999999999999999", "18446744073709551615",
		"18446744073709551616", "00", "07", "-1", "1e3", "7.0", " 7", "7 ", "", "\"7\"", "null", "x",
	} {
		read := func(s ValueState[uint64]) string {
			cache.discard()
			k, _ := cache.valueKey("count", []byte("k"))
			i := cache.place(k)
			cache.slots[i].value, cache.slots[i].present, cache.slots[i].fetched = []byte(text), true, true
			n, ok, err := s.Get([]byte("k"))
			got := fmt.Sprint(n, ok, err != nil)
			// And Update, which reads and writes a count in a path of its own.
			next, err := s.Update([]byte("k"), func(n uint64, found bool) uint64 {
				got += fmt.Sprint(" update of ", n, found)
				return n + 1
			})
			got += fmt.Sprint(" gives ", next, err != nil, " ", string(cache.slots[i].value))
			return got
		}
		if f, g := read(fast), read(generic); f != g {
			t.Errorf("%q: the digits path read %s, the generic path %s", text, f, g)
		}
	}
	for _, n := range []uint64{0, 9, 10, 99, 100, 1 << 40, 1<<64 - 1} {
		write := func(s ValueState[uint64]) string {
			cache.discard()
			if err := s.Set([]byte("k"), n); err != nil {
				t.Fatal(err)
			}
			return string(cache.slots[cache.dirty[0]].value)
		}
		if f, g := write(fast), write(generic); f != g {
			t.Errorf("%d: the digits path wrote %q, the generic path %q", n, f, g)
		}
	}
	cache.discard()
}
