package sluice

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

// MapKey is the map-key types of a [MapState] and how they become bytes,
// part of the cross-language key layout: string as UTF-8, []byte as is,
// unsigned integers big-endian, signed integers big-endian with the sign
// bit flipped (int and uint are 64-bit, as i64 and u64). So a map's
// entries come back in key order, numerically for integers.
type MapKey interface {
	string | []byte | int8 | int16 | int32 | int64 | int | uint8 | uint16 | uint32 | uint64 | uint
}

// encodeMapKey appends k's bytes to out.
func encodeMapKey[K MapKey](out []byte, k K) []byte {
	switch v := any(k).(type) {
	case string:
		return append(out, v...)
	case []byte:
		return append(out, v...)
	case int8:
		return append(out, uint8(v)^0x80)
	case int16:
		return binary.BigEndian.AppendUint16(out, uint16(v)^0x8000)
	case int32:
		return binary.BigEndian.AppendUint32(out, uint32(v)^0x8000_0000)
	case int64:
		return binary.BigEndian.AppendUint64(out, uint64(v)^(1<<63))
	case int:
		return binary.BigEndian.AppendUint64(out, uint64(int64(v))^(1<<63))
	case uint8:
		return append(out, v)
	case uint16:
		return binary.BigEndian.AppendUint16(out, v)
	case uint32:
		return binary.BigEndian.AppendUint32(out, v)
	case uint64:
		return binary.BigEndian.AppendUint64(out, v)
	case uint:
		return binary.BigEndian.AppendUint64(out, uint64(v))
	}
	panic("unreachable: MapKey")
}

// decodeMapKey reads the bytes encodeMapKey wrote.
func decodeMapKey[K MapKey](raw []byte) (K, error) {
	var k K
	width := func(n int, name string) error {
		if len(raw) != n {
			return fmt.Errorf("map key of %d bytes is not a %s", len(raw), name)
		}
		return nil
	}
	var err error
	switch p := any(&k).(type) {
	case *string:
		if !utf8.Valid(raw) {
			return k, fmt.Errorf("invalid UTF-8 in a map key")
		}
		*p = string(raw)
	case *[]byte:
		*p = append([]byte{}, raw...)
	case *int8:
		if err = width(1, "i8"); err == nil {
			*p = int8(raw[0] ^ 0x80)
		}
	case *int16:
		if err = width(2, "i16"); err == nil {
			*p = int16(binary.BigEndian.Uint16(raw) ^ 0x8000)
		}
	case *int32:
		if err = width(4, "i32"); err == nil {
			*p = int32(binary.BigEndian.Uint32(raw) ^ 0x8000_0000)
		}
	case *int64:
		if err = width(8, "i64"); err == nil {
			*p = int64(binary.BigEndian.Uint64(raw) ^ (1 << 63))
		}
	case *int:
		if err = width(8, "i64"); err == nil {
			*p = int(int64(binary.BigEndian.Uint64(raw) ^ (1 << 63)))
		}
	case *uint8:
		if err = width(1, "u8"); err == nil {
			*p = raw[0]
		}
	case *uint16:
		if err = width(2, "u16"); err == nil {
			*p = binary.BigEndian.Uint16(raw)
		}
	case *uint32:
		if err = width(4, "u32"); err == nil {
			*p = binary.BigEndian.Uint32(raw)
		}
	case *uint64:
		if err = width(8, "u64"); err == nil {
			*p = binary.BigEndian.Uint64(raw)
		}
	case *uint:
		if err = width(8, "u64"); err == nil {
			*p = uint(binary.BigEndian.Uint64(raw))
		}
	}
	return k, err
}

// MapState is a map from K to V per record key, each entry its own state
// entry under `name 0x00 u32_be(len(key)) key mapkey` ([MapKey] says how K
// is encoded), the value as JSON (the Rust SDK's layout).
//
// Point reads and writes go through the per-call cache like
// [ValueState]; Entries, Keys and Clear page through the host's
// `scan-prefix` (1024 entries a call) after writing the call's pending
// changes back. [MapState.WithTTL] gives each entry a time-to-live, as for
// [ValueState]: an expired entry is never returned (not by Get, Entries or
// Keys) and is removed from the store.
type MapState[K MapKey, V any] struct {
	name string
	ttl  int64
}

// MapEntry is one entry of a record key's map.
type MapEntry[K MapKey, V any] struct {
	Key   K
	Value V
}

// NewMapState returns a handle on the state called name (same rules as
// [NewValueState]).
func NewMapState[K MapKey, V any](name string) MapState[K, V] { return MapState[K, V]{name: name} }

// WithTTL returns the same state with a time-to-live of ttl per entry
// (whole milliseconds; 0: none).
func (s MapState[K, V]) WithTTL(ttl time.Duration) MapState[K, V] {
	s.ttl = ttlMillis(ttl)
	return s
}

// Name returns the state's name.
func (s MapState[K, V]) Name() string { return s.name }

// Prefix returns `name 0x00 u32_be(len(key)) key`: what all of key's
// entries' host keys begin with.
func (s MapState[K, V]) Prefix(key []byte) ([]byte, error) {
	if err := checkName(s.name); err != nil {
		return nil, err
	}
	if uint64(len(key)) > math.MaxUint32 {
		return nil, fmt.Errorf("state `%s`: key of %d bytes is too long for a map key", s.name, len(key))
	}
	out := make([]byte, 0, len(s.name)+5+len(key)+16)
	out = append(out, s.name...)
	out = append(out, 0)
	out = binary.BigEndian.AppendUint32(out, uint32(len(key)))
	return append(out, key...), nil
}

// Key returns the host key of mapKey in key's map.
func (s MapState[K, V]) Key(key []byte, mapKey K) ([]byte, error) {
	p, err := s.Prefix(key)
	if err != nil {
		return nil, err
	}
	return encodeMapKey(p, mapKey), nil
}

func (s MapState[K, V]) decode(raw []byte) (value V, ok bool, err error) {
	if s.ttl > 0 {
		return ttlDecode[V](s.name, raw)
	}
	if err := decode(raw, &value); err != nil {
		return value, false, invalidJSON(s.name, value, err)
	}
	return value, true, nil
}

// Get returns the value under mapKey in key's map; ok is false if there is
// none (or it expired).
func (s MapState[K, V]) Get(key []byte, mapKey K) (value V, ok bool, err error) {
	if s.ttl < 0 {
		return value, false, errNegativeTTL(s.name)
	}
	k, err := s.Key(key, mapKey)
	if err != nil {
		return value, false, err
	}
	slot := cache.read(string(k))
	if !slot.present {
		return value, false, nil
	}
	return s.decode(slot.value)
}

// Set stores value under mapKey in key's map.
func (s MapState[K, V]) Set(key []byte, mapKey K, value V) error {
	k, err := s.Key(key, mapKey)
	if err != nil {
		return err
	}
	v, err := ttlEncode(s.name, s.ttl, string(k), value)
	if err != nil {
		return err
	}
	cache.write(string(k), v, true)
	return nil
}

// Remove removes mapKey from key's map.
func (s MapState[K, V]) Remove(key []byte, mapKey K) error {
	k, err := s.Key(key, mapKey)
	if err != nil {
		return err
	}
	cache.write(string(k), nil, false)
	return nil
}

// Entries returns all live entries of key's map, in map-key byte order.
func (s MapState[K, V]) Entries(key []byte) ([]MapEntry[K, V], error) {
	var out []MapEntry[K, V]
	err := s.scan(key, func(mapKey, raw []byte) error {
		v, ok, err := s.decode(raw)
		if err != nil || !ok {
			return err
		}
		k, err := decodeMapKey[K](mapKey)
		if err != nil {
			return fmt.Errorf("state `%s`: %w", s.name, err)
		}
		out = append(out, MapEntry[K, V]{Key: k, Value: v})
		return nil
	})
	return out, err
}

// Keys returns the map keys of key's live entries, in byte order.
func (s MapState[K, V]) Keys(key []byte) ([]K, error) {
	var out []K
	err := s.scan(key, func(mapKey, raw []byte) error {
		if s.ttl > 0 {
			live, err := ttlLive(s.name, raw)
			if err != nil || !live {
				return err
			}
		}
		k, err := decodeMapKey[K](mapKey)
		if err != nil {
			return fmt.Errorf("state `%s`: %w", s.name, err)
		}
		out = append(out, k)
		return nil
	})
	return out, err
}

// Clear removes every entry of key's map.
func (s MapState[K, V]) Clear(key []byte) error {
	prefix, err := s.Prefix(key)
	if err != nil {
		return err
	}
	var doomed []string
	if err := s.scan(key, func(mapKey, _ []byte) error {
		doomed = append(doomed, string(prefix)+string(mapKey))
		return nil
	}); err != nil {
		return err
	}
	for _, k := range doomed {
		cache.write(k, nil, false)
	}
	return nil
}

// scan calls f with (map key, value) of every entry of key's map.
func (s MapState[K, V]) scan(key []byte, f func(mapKey, raw []byte) error) error {
	if s.ttl < 0 {
		return errNegativeTTL(s.name)
	}
	prefix, err := s.Prefix(key)
	if err != nil {
		return err
	}
	return scanPrefix(prefix, s.name, func(k, v []byte) error { return f(k[len(prefix):], v) })
}
