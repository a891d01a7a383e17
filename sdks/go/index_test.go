package sluice

import (
	"bytes"
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
