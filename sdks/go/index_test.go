package sluice

import (
	"bytes"
	"fmt"
	"testing"
)

// keysForIndex are distinct keys of every length from 0 to 40, many of them
// alike but for one byte at the start, the middle or the end of their
// last word: what a weak hash of the tail would confuse.
func keysForIndex() [][]byte {
	var keys [][]byte
	for n := 0; n <= 40; n++ {
		for v := 0; v < 64; v++ {
			k := bytes.Repeat([]byte{'k'}, n)
			if n == 0 {
				if v > 0 {
					break
				}
			} else {
				k[(v%3)*(n-1)/2] = byte('A' + v/3) // the first, middle or last byte
			}
			keys = append(keys, k)
		}
	}
	seen := map[string]bool{}
	var distinct [][]byte
	for _, k := range keys {
		if !seen[string(k)] {
			seen[string(k)] = true
			distinct = append(distinct, k)
		}
	}
	return distinct
}

func TestTheKeyIndexFindsEveryKeyItHoldsAndNoOther(t *testing.T) {
	withHost(t, nil, func() {
		keys := keysForIndex()
		half := len(keys) / 2
		slots := map[string]int32{}
		for _, k := range keys[:half] {
			slots[string(k)] = cache.place(k)
		}
		if len(cache.slots) != half {
			t.Fatalf("%d slots for %d distinct keys", len(cache.slots), half)
		}
		for _, k := range keys[:half] {
			if s := cache.place(k); s != slots[string(k)] || cache.slots[s].key != string(k) {
				t.Fatalf("key %q: slot %d (%q), placed at %d", k, s, cache.slots[s].key, slots[string(k)])
			}
		}
		for _, k := range keys[half:] {
			if s, found := cache.index.find(k, cache.index.hash(k), cache.slots); found {
				t.Fatalf("key %q never placed, found at slot %d (%q)", k, s, cache.slots[s].key)
			}
		}
		// A new call knows none of them, and keeps the table sized for this
		// one's keys (a call begins and ends with a discard).
		size := len(cache.index.entries)
		cache.discard()
		cache.discard()
		if len(cache.index.entries) != size {
			t.Fatalf("the next call's table has %d entries, this one's %d", len(cache.index.entries), size)
		}
		if s := cache.place(keys[0]); s != 0 {
			t.Fatalf("the first key of a new call got slot %d", s)
		}
		cache.discard()
		if n := len(cache.index.entries); n > 4*indexMinEntries {
			t.Fatalf("a call of one key left a table of %d entries", n)
		}
	})
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
