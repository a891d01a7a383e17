package sluice

// keyIndex: the state cache's index from a host key to its slot. A Go map
// did this before, and on wasm it was the cache's largest cost: wasm has no
// AES instructions, so the runtime hashes strings with its portable
// fallback, and a lookup then an insert hashed every new key twice (about
// 1,500 instructions per record of the Go running count, by callgrind).
// The index is open addressing with linear probing over a power-of-two
// table of 64-bit entries, each the key's hash in its high half and its
// slot number + 1 in its low half (0: empty), and hashes 8 bytes at a time
// with multiplies, which wasm has. A lookup hashes once and, for a key
// that is not there yet, returns where it goes.
//
// The hash is seeded per instance, so the keys that collide in one
// instance do not in another; a run of colliding keys costs at worst a
// scan of one call's keys, since the index lives for one call.

import (
	"math/bits"
	"math/rand/v2"
	"unsafe"
)

type keyIndex struct {
	entries []uint64 // len a power of two, or 0
	used    int
	seed    uint64
}

const (
	indexMinEntries = 16
	hashMul1        = 0x9e3779b97f4a7c15
	hashMul2        = 0xbf58476d1ce4e5b9
	hashMul3        = 0x94d049bb133111eb
)

func newKeyIndex() keyIndex { return keyIndex{seed: rand.Uint64() | 1} }

// hash is k's hash under the index's seed.
func (x *keyIndex) hash(k []byte) uint64 {
	h := x.seed ^ uint64(len(k))*hashMul1
	p := unsafe.Pointer(unsafe.SliceData(k))
	n := len(k)
	for ; n >= 8; n -= 8 {
		h = bits.RotateLeft64((h^*(*uint64)(p))*hashMul2, 31)
		p = unsafe.Add(p, 8)
	}
	if n > 0 {
		// The last 1-7 bytes as one word: two overlapping 4-byte reads for
		// 4 or more, else the first, middle and last byte.
		var w uint64
		if n >= 4 {
			w = uint64(*(*uint32)(p))<<32 | uint64(*(*uint32)(unsafe.Add(p, n-4)))
		} else {
			w = uint64(*(*byte)(p))<<16 | uint64(*(*byte)(unsafe.Add(p, n/2)))<<8 | uint64(*(*byte)(unsafe.Add(p, n-1)))
		}
		h = bits.RotateLeft64((h^w)*hashMul2, 31)
	}
	h ^= h >> 32
	h *= hashMul3
	return h ^ h>>29
}

// find returns the slot of key k (whose hash is h) and true, or where in
// entries k goes and false. The index must have room (see reserve).
func (x *keyIndex) find(k []byte, h uint64, slots []slot) (int32, bool) {
	mask := uint64(len(x.entries) - 1)
	tag := h &^ 0xffff_ffff
	for i := h & mask; ; i = (i + 1) & mask {
		e := x.entries[i]
		if e == 0 {
			return int32(i), false
		}
		if e&^0xffff_ffff == tag {
			if s := int32(uint32(e)) - 1; slots[s].key == string(k) {
				return s, true
			}
		}
	}
}

// insert records that the key with hash h, found missing at position at,
// is slot s.
func (x *keyIndex) insert(at int32, h uint64, s int32) {
	x.entries[at] = indexEntry(h, s)
	x.used++
}

// indexEntry is the entry of slot s, whose key's hash is h: the hash's
// high half as a tag, and s + 1 (so that no entry is 0, which is empty).
func indexEntry(h uint64, s int32) uint64 { return h&^0xffff_ffff | uint64(uint32(s+1)) }

// reserve makes room for one more key: when the table is half full, a
// table twice the size (grow), apart so that reserve inlines.
func (x *keyIndex) reserve(slots []slot) {
	if 2*(x.used+1) > len(x.entries) {
		x.grow(slots)
	}
}

// grow rehashes slots' keys into a table twice the size.
func (x *keyIndex) grow(slots []slot) {
	x.entries = make([]uint64, max(2*len(x.entries), indexMinEntries))
	mask := uint64(len(x.entries) - 1)
	for s := range slots {
		h := x.hash(view(slots[s].key))
		i := h & mask
		for x.entries[i] != 0 {
			i = (i + 1) & mask
		}
		x.entries[i] = indexEntry(h, int32(s))
	}
}

// reset empties the index for the next call. The table is kept, unless it
// is more than four times what this call needed: one call over a million
// keys must not make every later call clear a table that size.
func (x *keyIndex) reset() {
	if x.used == 0 {
		return // empty already (a call both begins and ends with a reset)
	}
	need := indexMinEntries
	for need < 2*x.used {
		need *= 2
	}
	if len(x.entries) > 4*need {
		x.entries = make([]uint64, need)
	} else {
		clear(x.entries)
	}
	x.used = 0
}
