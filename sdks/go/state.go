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
	"strconv"
	"strings"

	"time"

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
}

// NewValueState returns a handle on the state called name. The name must be
// non-empty, contain no 0x00 byte and be unique among the transform's
// states; a bad name is reported by the first call that uses it.
func NewValueState[T any](name string) ValueState[T] { return ValueState[T]{name: name} }

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
	k, err := valueKey(s.name, key)
	if err != nil {
		return value, false, err
	}
	return s.get(k)
}

func (s ValueState[T]) get(k string) (value T, ok bool, err error) {
	if s.ttl < 0 {
		return value, false, errNegativeTTL(s.name)
	}
	slot := cache.read(k)
	if !slot.present {
		return value, false, nil
	}
	if s.ttl > 0 {
		return ttlDecode[T](s.name, slot.value)
	}
	if err := decode(slot.value, &value); err != nil {
		return value, false, invalidJSON(s.name, value, err)
	}
	return value, true, nil
}

func invalidJSON(name string, value any, err error) error {
	return fmt.Errorf("state `%s`: invalid JSON for %T: %w", name, value, err)
}

// Set stores value for key.
func (s ValueState[T]) Set(key []byte, value T) error {
	k, err := valueKey(s.name, key)
	if err != nil {
		return err
	}
	return s.set(k, value)
}

func (s ValueState[T]) set(k string, value T) error {
	v, err := ttlEncode(s.name, s.ttl, k, value)
	if err != nil {
		return err
	}
	cache.write(k, v, true)
	return nil
}

// Update replaces the value for key with f(current, found) (found is false
// when there is none or it expired) and returns the new value.
func (s ValueState[T]) Update(key []byte, f func(current T, found bool) T) (T, error) {
	k, err := valueKey(s.name, key)
	if err != nil {
		var zero T
		return zero, err
	}
	current, found, err := s.get(k)
	if err != nil {
		return current, err
	}
	next := f(current, found)
	return next, s.set(k, next)
}

// Clear removes the value for key.
func (s ValueState[T]) Clear(key []byte) error {
	k, err := valueKey(s.name, key)
	if err != nil {
		return err
	}
	cache.write(k, nil, false)
	return nil
}

// Prefetch loads the values for all of keys into the call's cache with one
// `state.get-many` call, so the reads that follow cross nothing. Pass
// [Batch.Keys] from BeginBatch.
func (s ValueState[T]) Prefetch(keys [][]byte) error { return prefetchValues(s.name, keys) }

func prefetchValues(name string, keys [][]byte) error {
	ks := make([]string, len(keys))
	for i, key := range keys {
		k, err := valueKey(name, key)
		if err != nil {
			return err
		}
		ks[i] = k
	}
	return cache.prefetch(ks)
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
	var b strings.Builder
	b.Grow(len(name) + 1 + len(key))
	b.WriteString(name)
	b.WriteByte(0)
	b.Write(key)
	return b.String(), nil
}

// encode is v's JSON text, compact and without HTML escaping (as
// serde_json writes it). Integers skip encoding/json's reflection.
func encode(v any) ([]byte, error) {
	switch n := v.(type) {
	case uint64:
		return strconv.AppendUint(nil, n, 10), nil
	case int64:
		return strconv.AppendInt(nil, n, 10), nil
	case int:
		return strconv.AppendInt(nil, int64(n), 10), nil
	case uint:
		return strconv.AppendUint(nil, uint64(n), 10), nil
	}
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
	switch p := any(out).(type) {
	case *uint64:
		if plainInt(data, false) {
			if n, err := strconv.ParseUint(string(data), 10, 64); err == nil {
				*p = n
				return nil
			}
		}
	case *int64:
		if plainInt(data, true) {
			if n, err := strconv.ParseInt(string(data), 10, 64); err == nil {
				*p = n
				return nil
			}
		}
	}
	return json.Unmarshal(data, out)
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

// slot is a cached entry: the value as the call sees it (present false:
// absent or deleted), and whether the host has yet to hear about it.
type slot struct {
	value   []byte
	present bool
	dirty   bool
}

// stateCache is the per-call write-back cache. It must never keep anything
// across calls: the host may roll state back between them.
type stateCache struct {
	entries map[string]*slot
	dirty   []string // keys in the order they became dirty
}

var cache = stateCache{entries: map[string]*slot{}}

// read returns the entry for k, fetching it with one `state.get` on a miss.
func (c *stateCache) read(k string) *slot {
	if s, ok := c.entries[k]; ok {
		return s
	}
	v := host().Get([]byte(k))
	s := &slot{value: v.Bytes, present: v.Present}
	c.entries[k] = s
	return s
}

// prefetch loads every key the cache lacks with one `state.get-many`.
func (c *stateCache) prefetch(keys []string) error {
	var missing []string
	for _, k := range keys {
		if _, ok := c.entries[k]; !ok {
			c.entries[k] = &slot{} // placeholder; also dedups
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	raw := make([][]byte, len(missing))
	for i, k := range missing {
		raw[i] = []byte(k)
	}
	values := host().GetMany(raw)
	if len(values) != len(missing) {
		return fmt.Errorf("host bug: state.get-many returned %d values for %d keys", len(values), len(missing))
	}
	for i, k := range missing {
		s := c.entries[k]
		s.value, s.present = values[i].Bytes, values[i].Present
	}
	return nil
}

// write sets (present) or deletes k in the cache and marks it dirty.
func (c *stateCache) write(k string, value []byte, present bool) {
	s, ok := c.entries[k]
	if !ok {
		s = &slot{}
		c.entries[k] = s
	} else if !s.dirty && s.present == present && bytes.Equal(s.value, value) {
		return // the host already has exactly this
	}
	s.value, s.present = value, present
	if !s.dirty {
		s.dirty = true
		c.dirty = append(c.dirty, k)
	}
}

// flush sends the dirty entries with one `state.write` (none if nothing
// changed) and keeps the cache, now clean.
func (c *stateCache) flush() {
	if len(c.dirty) == 0 {
		return
	}
	entries := make([]hostapi.Entry, len(c.dirty))
	for i, k := range c.dirty {
		s := c.entries[k]
		entries[i] = hostapi.Entry{Key: []byte(k), Value: s.value, Present: s.present}
		s.dirty = false
	}
	c.dirty = c.dirty[:0]
	host().Write(entries)
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
	clear(c.entries)
	c.dirty = c.dirty[:0]
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

// RawGet returns the bytes stored under host key key (through the call's
// cache), for migrations.
func RawGet(key []byte) ([]byte, bool) {
	s := cache.read(string(key))
	return s.value, s.present
}

// RawSet stores value under host key key (through the call's cache), for
// migrations.
func RawSet(key, value []byte) { cache.write(string(key), value, true) }

// RawDelete removes host key key (through the call's cache), for
// migrations.
func RawDelete(key []byte) { cache.write(string(key), nil, false) }

// scanPage is the entries asked for per `state.scan-prefix` call.
const scanPage = 1024
