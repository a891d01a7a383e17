package sluice

// Keyed state: [ValueState] and the per-call write-back cache in front of
// the host's `state` interface. The key layout (name 0x00 key) and the JSON
// values are shared with the Rust, Python, JavaScript and C SDKs; change
// them together or not at all.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"sluice.dev/sdk/go/internal/hostapi"
)

// ValueState is one value of type T per record key, stored as JSON under
// host key `name 0x00 key`. It is only a name: declare it as a package
// variable; every call goes through the call's cache.
//
// With a time-to-live ([ValueState.WithTTL]) a value expires that long in
// processing time after it was last written: an expired value is never
// returned, and an expiry timer removes it from the store. The stored form
// is then `[expires_at_ms,value]`, so add or remove a TTL only with a
// migration ([Migrator]).
type ValueState[T any] struct {
	name string
	ttl  int64 // ms; 0: none
	// T is uint64: its values are read and written as plain digits
	// without encoding/json or the generic integer code, whose type switch
	// and calls were a third of a Go running count's state cost on wasm.
	// (A ValueState not made by NewValueState takes the generic path.)
	u64 bool
}

// NewValueState returns a handle on the state called name. The name must be
// non-empty, contain no 0x00 byte and be unique among the transform's
// states; a bad name is reported by the first call that uses it.
func NewValueState[T any](name string) ValueState[T] {
	var zero T
	_, u64 := any(zero).(uint64)
	return ValueState[T]{name: name, u64: u64}
}

// WithTTL returns the same state with a time-to-live of ttl (whole
// milliseconds; 0: none; a negative ttl is reported by the first call).
func (s ValueState[T]) WithTTL(ttl time.Duration) ValueState[T] {
	s.ttl = ttlMillis(ttl)
	return s
}

// Name returns the state's name.
func (s ValueState[T]) Name() string { return s.name }

// Key returns the host key for record key key: `name 0x00 key`.
func (s ValueState[T]) Key(key []byte) ([]byte, error) {
	k, err := valueKey(s.name, key)
	return []byte(k), err
}

// Get returns the value for key; ok is false if there is none.
func (s ValueState[T]) Get(key []byte) (value T, ok bool, err error) {
	i, err := s.read(key)
	if err != nil {
		return value, false, err
	}
	return s.decode(cache.slots[i])
}

// read returns the cache slot of key's value (fetched if need be).
func (s ValueState[T]) read(key []byte) (int32, error) {
	if s.ttl < 0 {
		return 0, errNegativeTTL(s.name)
	}
	if i, ok := cache.hinted(s.name, key); ok {
		return cache.fill(i), nil
	}
	k, err := cache.valueKey(s.name, key)
	if err != nil {
		return 0, err
	}
	return cache.at(k), nil
}

func (s ValueState[T]) decode(slot slot) (value T, ok bool, err error) {
	if !slot.present {
		return value, false, nil
	}
	if s.ttl > 0 {
		return ttlDecode[T](s.name, slot.value)
	}
	if s.u64 {
		if n, ok := parseSmallU64(slot.value); ok {
			*(*uint64)(unsafe.Pointer(&value)) = n
			return value, true, nil
		}
	}
	// Apart, so that value stays off the heap for a number.
	if decodeInt(slot.value, &value) {
		return value, true, nil
	}
	return s.decodeJSON(slot.value)
}

func (s ValueState[T]) decodeJSON(data []byte) (value T, ok bool, err error) {
	if err := json.Unmarshal(data, &value); err != nil {
		return value, false, invalidJSON(s.name, value, err)
	}
	return value, true, nil
}

func invalidJSON(name string, value any, err error) error {
	return fmt.Errorf("state `%s`: invalid JSON for %T: %w", name, value, err)
}

// Set stores value for key.
func (s ValueState[T]) Set(key []byte, value T) error {
	k, err := cache.valueKey(s.name, key)
	if err != nil {
		return err
	}
	return s.set(cache.place(k), value)
}

// set stores value in slot i.
func (s ValueState[T]) set(i int32, value T) error {
	if s.u64 && s.ttl == 0 {
		cache.writeAt(i, cache.space.keepUint(*(*uint64)(unsafe.Pointer(&value))), true)
		return nil
	}
	v, err := ttlEncode(s.name, s.ttl, cache.slots[i].key, value)
	if err != nil {
		return err
	}
	cache.writeAt(i, v, true)
	return nil
}

// Update replaces the value for key with f(current, found) (found is false
// when there is none or it expired) and returns the new value.
func (s ValueState[T]) Update(key []byte, f func(current T, found bool) T) (T, error) {
	i, err := s.read(key)
	if err != nil {
		var zero T
		return zero, err
	}
	if s.u64 && s.ttl == 0 {
		// decode and set for a uint64, written out: a counter's path.
		var current T
		found := false
		if slot := &cache.slots[i]; slot.present {
			n, ok := parseSmallU64(slot.value)
			if !ok {
				return s.updateGeneric(i, f)
			}
			*(*uint64)(unsafe.Pointer(&current)) = n
			found = true
		}
		next := f(current, found)
		cache.writeAt(i, cache.space.keepUint(*(*uint64)(unsafe.Pointer(&next))), true)
		return next, nil
	}
	return s.updateGeneric(i, f)
}

// updateGeneric is Update of slot i for any T.
func (s ValueState[T]) updateGeneric(i int32, f func(current T, found bool) T) (T, error) {
	current, found, err := s.decode(cache.slots[i])
	if err != nil {
		return current, err
	}
	next := f(current, found)
	return next, s.set(i, next)
}

// Clear removes the value for key.
func (s ValueState[T]) Clear(key []byte) error {
	k, err := cache.valueKey(s.name, key)
	if err != nil {
		return err
	}
	cache.writeAt(cache.place(k), nil, false)
	return nil
}

// Prefetch loads the values for all of keys into the call's cache with one
// `state.get-many` call, so the reads that follow cross nothing. Pass
// [Batch.Keys] from BeginBatch.
func (s ValueState[T]) Prefetch(keys [][]byte) error { return prefetchValues(s.name, keys) }

func prefetchValues(name string, keys [][]byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	return cache.prefetch(name, keys)
}

// checkName checks a state name: non-empty, no 0x00 byte.
func checkName(name string) error {
	if name == "" {
		return errors.New("state name must not be empty")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return fmt.Errorf("state name \"%s\" must not contain a 0x00 byte", strings.ReplaceAll(name, "\x00", `\0`))
	}
	return nil
}

// valueKey is `name 0x00 key`, as a string (the cache's map key).
func valueKey(name string, key []byte) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	return string(appendValueKey(make([]byte, 0, len(name)+1+len(key)), name, key)), nil
}

// appendValueKey appends `name 0x00 key` to dst.
func appendValueKey(dst []byte, name string, key []byte) []byte {
	return append(append(append(dst, name...), 0), key...)
}

// encode is v's JSON text, compact and without HTML escaping (as
// serde_json writes it). Integers skip encoding/json's reflection (and
// boxing), and their text goes into the call's cache space rather than an
// allocation of its own.
func encode[T any](v T) ([]byte, error) {
	if text, ok := encodeInt(&v); ok {
		return text, nil
	}
	return encodeJSON(v)
}

// encodeInt is the text of *v if it is an integer; v does not escape.
func encodeInt[T any](v *T) ([]byte, bool) {
	var digits [20]byte
	var text []byte
	switch n := any(v).(type) {
	case *uint64:
		text = strconv.AppendUint(digits[:0], *n, 10)
	case *int64:
		text = strconv.AppendInt(digits[:0], *n, 10)
	case *int:
		text = strconv.AppendInt(digits[:0], int64(*n), 10)
	case *uint:
		text = strconv.AppendUint(digits[:0], uint64(*n), 10)
	case *any: // EmitJSON's value
		switch m := (*n).(type) {
		case uint64:
			text = strconv.AppendUint(digits[:0], m, 10)
		case int64:
			text = strconv.AppendInt(digits[:0], m, 10)
		case int:
			text = strconv.AppendInt(digits[:0], int64(m), 10)
		case uint:
			text = strconv.AppendUint(digits[:0], uint64(m), 10)
		}
	}
	if text == nil {
		return nil, false
	}
	return cache.space.keep(text), true
}

func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// decode parses JSON text into *out. Plain integers (what serde_json and
// encode write for them) skip encoding/json's reflection; anything else,
// including errors, goes through json.Unmarshal.
func decode[T any](data []byte, out *T) error {
	if decodeInt(data, out) {
		return nil
	}
	return json.Unmarshal(data, out)
}

// decodeInt decodes data into *out if out is a *uint64 or *int64 and data
// a plain integer that fits; false otherwise. out does not escape.
func decodeInt[T any](data []byte, out *T) bool {
	switch p := any(out).(type) {
	case *uint64:
		if plainInt(data, false) {
			if n, ok := parseDigits(data); ok {
				*p = n
				return true
			}
		}
	case *int64:
		if plainInt(data, true) {
			digits, negative := data, data[0] == '-'
			if negative {
				digits = data[1:]
			}
			if n, ok := parseDigits(digits); ok {
				switch {
				case !negative && n <= 1<<63-1:
					*p = int64(n)
					return true
				case negative && n <= 1<<63:
					*p = int64(-n) // -(1<<63) wraps to itself: math.MinInt64
					return true
				}
			}
		}
	}
	return false
}

// parseSmallU64 is the uint64 that data spells as a plain JSON integer of
// 1 to 19 digits (which cannot overflow), in one pass; false for anything
// else, which the general path then reads (or rejects).
func parseSmallU64(data []byte) (uint64, bool) {
	if len(data) == 0 || len(data) > 19 || data[0] == '0' && len(data) > 1 {
		return 0, false
	}
	var n uint64
	for _, c := range data {
		d := uint64(c) - '0'
		if d > 9 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// parseDigits is the number that the ASCII digits in data spell; false if
// it does not fit a uint64. (strconv.ParseUint takes a string, and the
// conversion would cost an allocation per value.)
func parseDigits(data []byte) (uint64, bool) {
	var n uint64
	for _, c := range data {
		d := uint64(c - '0')
		if n > (1<<64-1-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// plainInt reports whether data is a JSON integer with no sign (or, if
// signed, an optional '-'), fraction, exponent, whitespace or leading zero.
func plainInt(data []byte, signed bool) bool {
	if signed && len(data) > 0 && data[0] == '-' {
		data = data[1:]
	}
	if len(data) == 0 || len(data) > 1 && data[0] == '0' {
		return false
	}
	for _, c := range data {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// slot is a cached entry: its host key, the value as the call sees it
// (present false: absent or deleted), whether that is what the host has
// (fetched, or written back), and whether the host has yet to hear of it.
type slot struct {
	key     string
	value   []byte
	present bool
	fetched bool
	dirty   bool
}

// stateCache is the write-back cache. A call's cache ends with the call,
// unless the host lets a shard's be held from batch to batch (see hold).
//
// Slots live in one slice, indexed by host key (keyIndex), so a key costs
// no allocation of its own; a slot number stays valid for the whole call
// (slots are only appended). Lookups by a key built in `scratch` allocate
// nothing.
type stateCache struct {
	index   keyIndex
	slots   []slot
	dirty   []int32 // slots in the order they became dirty
	scratch []byte  // the host key being looked up
	// Room for small values and keys. Never reused (a value may be held
	// past the call: see RawGet); a new cache starts on fresh space.
	space space
	hint  hint
	// What the cache has taken since it began, never less: the values
	// written and fetched, and the buffers its keys and values are slices
	// of (a prefetch's keys, a get-many's answer), each whole, as each
	// keeps its whole buffer alive. With its tables and the space's blocks,
	// its footprint: what holding counts.
	bytes int
}

// cacheBytes is what a cache takes besides its tables and the bytes it
// counts: the struct itself, and its entry in hold.parked.
const cacheBytes = 256

// footprint is what the cache takes, as holding counts it.
func (c *stateCache) footprint() int {
	tables := cap(c.slots)*int(unsafe.Sizeof(slot{})) + len(c.index.entries)*8 + (cap(c.dirty)+cap(c.hint.slots))*4
	return cacheBytes + tables + c.bytes + c.space.taken
}

// hold is the holding of world `cached`. Once the host has said it will
// ask for held state back (`hold-state`), the cache of a packed batch's
// shard stays from one batch of the shard to the next, within max bytes
// over all shards, until the host's `flush-state` for it. The shard being
// served is the cache (holding); other held shards wait in parked. This is
// the Rust SDK's store.
var hold struct {
	max         int // 0: hold nothing
	holding     bool
	shard       uint32
	parked      map[uint32]stateCache
	parkedBytes int
}

// holdState is the host's `hold-state`.
func holdState(maxBytes uint64) { hold.max = int(min(maxBytes, uint64(math.MaxInt))) }

// beginCache starts a call for shard (has false: a call without one): the
// shard's held cache, if any, becomes the cache, and the one held before
// is parked. What an unheld call left is dropped.
func beginCache(shard uint32, has bool) {
	has = has && hold.max > 0
	if has && hold.holding && shard == hold.shard {
		return
	}
	if hold.holding && len(cache.slots) > 0 {
		if hold.parked == nil {
			hold.parked = map[uint32]stateCache{}
		}
		hold.parked[hold.shard] = cache
		hold.parkedBytes += cache.footprint()
		cache = stateCache{index: newKeyIndex()}
	} else {
		cache.discard()
	}
	if parked, ok := hold.parked[shard]; has && ok {
		delete(hold.parked, shard)
		hold.parkedBytes -= parked.footprint()
		cache = parked
		cache.hint = hint{slots: cache.hint.slots[:0]}
	}
	hold.holding, hold.shard = has, shard
}

// endCache ends a call that succeeded: a shard's cache stays while all
// that is held is within hold.max; anything else is written back.
func endCache() {
	if hold.holding && cache.footprint()+hold.parkedBytes <= hold.max {
		return
	}
	hold.holding = false
	cache.finish()
}

// flushState is the host's `flush-state`: writes back what is held of
// shard and forgets it.
func flushState(shard uint32) {
	beginCache(shard, true)
	hold.holding = false
	cache.finish()
}

// dropCaches ends a failed call: every cache goes, held ones too, with
// their unsent writes (the host ends the instance and rolls its epoch back).
func dropCaches() {
	cache.discard()
	clear(hold.parked)
	hold.parkedBytes = 0
	hold.holding = false
}

// hint is what the last prefetch placed, in the order of its keys: a
// transform that prefetches Batch.Keys() and then reads each record's key
// in turn finds each slot here without building and hashing the key again
// (a map lookup was ~10% of the Go running count's time in the component).
// A read that is not the next one falls back to the map.
type hint struct {
	name  string
	slots []int32
	next  int
}

// hinted returns the slot of `name 0x00 key` if it is the next one the
// last prefetch placed. It compares the slot's own host key, which the
// call's space holds unchanged, so a caller that reuses or changes its key
// buffers gets the map's answer, never another key's slot.
func (c *stateCache) hinted(name string, key []byte) (int32, bool) {
	h := &c.hint
	if h.next >= len(h.slots) || name != h.name {
		return 0, false
	}
	i := h.slots[h.next]
	k := c.slots[i].key
	if len(k) != len(name)+1+len(key) || k[len(name)+1:] != string(key) {
		return 0, false
	}
	h.next++
	return i, true
}

var cache = stateCache{index: newKeyIndex()}

// valueKey builds `name 0x00 key` in the cache's scratch space, valid
// until the next key is built there.
func (c *stateCache) valueKey(name string, key []byte) ([]byte, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	return c.build(name, key), nil
}

// build is valueKey for a name already checked.
func (c *stateCache) build(name string, key []byte) []byte {
	c.scratch = appendValueKey(c.scratch[:0], name, key)
	return c.scratch
}

// at returns k's slot, fetching it with one `state.get` on a miss, or
// if a prefetch that placed it failed before it was filled.
func (c *stateCache) at(k []byte) int32 { return c.fill(c.place(k)) }

// fill fetches slot i's value with one `state.get` if nothing is known of
// it, and returns i.
func (c *stateCache) fill(i int32) int32 {
	if s := &c.slots[i]; !s.fetched && !s.dirty {
		v := host().Get(view(s.key))
		s.value, s.present, s.fetched = v.Bytes, v.Present, true
		c.bytes += len(v.Bytes)
	}
	return i
}

// place returns k's slot for a write: on a miss, one that nothing is known
// of (the write goes to the host whatever it is).
func (c *stateCache) place(k []byte) int32 {
	i, h, found := c.lookup(k)
	if found {
		return i
	}
	// The key's copy goes to the call's space, which is never written
	// again: one allocation per few kilobytes, not one per key.
	return c.adopt(c.space.keep(k), i, h)
}

// lookup returns k's slot and true, or, with false, where in the index k
// goes and its hash (for adopt).
func (c *stateCache) lookup(k []byte) (int32, uint64, bool) {
	c.index.reserve(c.slots)
	h := c.index.hash(k)
	i, found := c.index.find(k, h, c.slots)
	return i, h, found
}

// adopt adds a slot for key, which lookup found missing at index position
// at with hash h, and returns it. key is the slot's own: nothing may write
// to it for the rest of the call.
func (c *stateCache) adopt(key []byte, at int32, h uint64) int32 {
	s := int32(len(c.slots))
	c.slots = append(c.slots, slot{key: unsafe.String(unsafe.SliceData(key), len(key))})
	c.index.insert(at, h, s)
	return s
}

// read returns the entry for k, fetching it with one `state.get` on a miss.
func (c *stateCache) read(k string) slot { return c.slots[c.at(view(k))] }

// write sets (present) or deletes k in the cache and marks it dirty.
func (c *stateCache) write(k string, value []byte, present bool) {
	c.writeAt(c.place(view(k)), value, present)
}

// writeAt sets (present) or deletes slot i's value and marks it dirty,
// unless the host already has exactly that.
func (c *stateCache) writeAt(i int32, value []byte, present bool) {
	s := &c.slots[i]
	if s.fetched && !s.dirty && s.present == present && bytes.Equal(s.value, value) {
		return
	}
	c.bytes += len(value)
	s.value, s.present = value, present
	if !s.dirty {
		s.dirty = true
		c.dirty = append(c.dirty, i)
	}
}

// prefetch loads `name 0x00 key` for every key the cache lacks with one
// `state.get-many`; name is checked already. Each key is built where the
// host call's argument holds it, and a new slot keeps that copy as its
// key: one copy of each key, where building it, keeping it and packing it
// were three (on wasm every copy is a call out of the module).
func (c *stateCache) prefetch(name string, keys [][]byte) error {
	first := int32(len(c.slots))
	c.hint.name, c.hint.slots, c.hint.next = name, c.hint.slots[:0], 0
	size := 4
	for _, key := range keys {
		size += 4 + len(name) + 1 + len(key)
	}
	// Never grown (size is all it can take), so a slot's key in it stays.
	packed := make([]byte, 4, size)
	for _, key := range keys {
		start := len(packed)
		packed = appendValueKey(append(packed, 0, 0, 0, 0), name, key)
		k := packed[start+4:]
		i, h, found := c.lookup(k)
		if found {
			packed = packed[:start]
		} else {
			hostapi.PutU32(packed[start:], len(k))
			i = c.adopt(k[:len(k):len(k)], i, h)
		}
		c.hint.slots = append(c.hint.slots, i)
	}
	missing := c.slots[first:] // the keys placed just now, each once
	if len(missing) == 0 {
		return nil
	}
	c.bytes += cap(packed) // their keys are slices of it
	hostapi.PutU32(packed, len(missing))
	values := host().GetMany(packed, len(missing))
	if len(values) != len(missing) {
		return fmt.Errorf("host bug: state.get-many returned %d values for %d keys", len(values), len(missing))
	}
	for i := range missing {
		missing[i].value, missing[i].present, missing[i].fetched = values[i].Bytes, values[i].Present, true
		c.bytes += 5 + len(values[i].Bytes) // the values are slices of the answer
	}
	return nil
}

// space holds copies of small byte strings, in blocks of spaceChunk: one
// allocation per few kilobytes rather than one per copy. It is only ever
// appended to, so a copy stays as it was for as long as it is referenced.
type space struct {
	block []byte
	taken int // the bytes of every block and copy it allocated
}

// keep copies b into the space and returns the copy.
func (s *space) keep(b []byte) []byte {
	if cap(s.block)-len(s.block) < len(b) {
		if len(b) > spaceChunk/8 {
			s.taken += len(b)
			return append([]byte(nil), b...)
		}
		s.newBlock()
	}
	start := len(s.block)
	s.block = append(s.block, b...)
	return s.block[start:len(s.block):len(s.block)]
}

func (s *space) newBlock() {
	s.block = make([]byte, 0, spaceChunk)
	s.taken += spaceChunk
}

// keepUint writes n's decimal digits into the space and returns them.
func (s *space) keepUint(n uint64) []byte {
	size := 1
	for p := uint64(10); size < 20 && n >= p; p *= 10 {
		size++
	}
	if cap(s.block)-len(s.block) < size {
		s.newBlock()
	}
	start := len(s.block)
	s.block = s.block[:start+size]
	digits := s.block[start : start+size : start+size]
	for i := size - 1; i > 0; i-- {
		digits[i] = byte('0' + n%10)
		n /= 10
	}
	digits[0] = byte('0' + n)
	return digits
}

// spaceChunk is the size of each block of a space.
const spaceChunk = 4096

// view is the bytes of s, without a copy: for the host calls that copy
// keys out (nothing may write to them).
func view(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// flush sends the dirty entries with one `state.write` (none if nothing
// changed) and keeps the cache, now clean.
func (c *stateCache) flush() {
	if len(c.dirty) == 0 {
		return
	}
	size := 4
	for _, i := range c.dirty {
		s := &c.slots[i]
		size += hostapi.EntrySize(view(s.key), s.value)
	}
	packed := make([]byte, 4, size)
	hostapi.PutU32(packed, len(c.dirty))
	for _, i := range c.dirty {
		s := &c.slots[i]
		packed = hostapi.AppendEntry(packed, view(s.key), s.value, s.present)
		s.dirty, s.fetched = false, true
	}
	c.dirty = c.dirty[:0]
	host().Write(packed)
}

// scan returns one page of `state.scan-prefix`, after flushing pending
// writes so the host sees them.
func (c *stateCache) scan(prefix, startAfter []byte, hasStartAfter bool, limit uint32) []hostapi.Entry {
	c.flush()
	return host().ScanPrefix(prefix, startAfter, hasStartAfter, limit)
}

// finish ends a call: it sends the dirty entries with one `state.write`
// (none if nothing changed) and empties the cache.
func (c *stateCache) finish() {
	c.flush()
	c.discard()
}

// discard forgets the cache and its unflushed writes.
func (c *stateCache) discard() {
	c.index.reset()
	clear(c.slots) // the values may be garbage now
	c.slots = c.slots[:0]
	c.hint = hint{slots: c.hint.slots[:0]}
	c.dirty = c.dirty[:0]
	c.space = space{}
	c.bytes = 0
}

// ScanPrefix calls f with every entry whose host key starts with prefix,
// in key order, paging through the host's `state.scan-prefix` (1024
// entries a call) after writing the call's pending changes back: for
// [Migrator.Migrate], to read state in an old layout. f must not keep the
// slices. Host keys of the typed states are built by their Key methods.
func ScanPrefix(prefix []byte, f func(key, value []byte) error) error {
	return scanPrefix(prefix, "", f)
}

// scanPrefix is ScanPrefix; name, if not empty, is the state named in a
// host-bug error.
func scanPrefix(prefix []byte, name string, f func(key, value []byte) error) error {
	var after []byte
	hasAfter := false
	for {
		page := cache.scan(prefix, after, hasAfter, scanPage)
		for _, e := range page {
			if !bytes.HasPrefix(e.Key, prefix) || hasAfter && bytes.Compare(e.Key, after) <= 0 {
				msg := "host bug: state.scan-prefix returned a key out of order or outside the prefix"
				if name != "" {
					msg += fmt.Sprintf(" (state `%s`)", name)
				}
				return errors.New(msg)
			}
			if err := f(e.Key, e.Value); err != nil {
				return err
			}
			after, hasAfter = e.Key, true
		}
		if len(page) < scanPage {
			return nil
		}
	}
}

// RawGet returns a copy of the bytes stored under host key key (through
// the cache), for migrations.
func RawGet(key []byte) ([]byte, bool) {
	s := cache.read(string(key))
	return bytes.Clone(s.value), s.present
}

// RawSet stores a copy of value under host key key (through the cache),
// for migrations: the caller may reuse value at once.
func RawSet(key, value []byte) { cache.write(string(key), bytes.Clone(value), true) }

// RawDelete removes host key key (through the call's cache), for
// migrations.
func RawDelete(key []byte) { cache.write(string(key), nil, false) }

// scanPage is the entries asked for per `state.scan-prefix` call.
const scanPage = 1024
