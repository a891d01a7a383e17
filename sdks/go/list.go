package sluice

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// ListState is a list of T per record key, stored as one JSON array under
// host key `name 0x00 key` (the Rust SDK's layout).
//
// Push appends to the encoded array without decoding it, but every push
// still copies the whole value: keep lists short (a window, the last N
// events), or use [MapState].
type ListState[T any] struct {
	name string
}

// NewListState returns a handle on the state called name (same rules as
// [NewValueState]).
func NewListState[T any](name string) ListState[T] { return ListState[T]{name: name} }

// Name returns the state's name.
func (s ListState[T]) Name() string { return s.name }

// Key returns the host key for record key key: `name 0x00 key`.
func (s ListState[T]) Key(key []byte) ([]byte, error) {
	k, err := valueKey(s.name, key)
	return []byte(k), err
}

// Push appends item to the list for key.
func (s ListState[T]) Push(key []byte, item T) error {
	k, err := valueKey(s.name, key)
	if err != nil {
		return err
	}
	v, err := encode(item)
	if err != nil {
		return fmt.Errorf("state `%s`: %w", s.name, err)
	}
	slot := cache.read(k)
	var current []byte
	if slot.present {
		current = slot.value
	}
	list, err := appendJSON(current, slot.present, v)
	if err != nil {
		return fmt.Errorf("state `%s`: %w", s.name, err)
	}
	cache.write(k, list, true)
	return nil
}

// Get returns the list for key; empty if there is none.
func (s ListState[T]) Get(key []byte) ([]T, error) {
	k, err := valueKey(s.name, key)
	if err != nil {
		return nil, err
	}
	slot := cache.read(k)
	if !slot.present {
		return []T{}, nil
	}
	var out []T
	if err := json.Unmarshal(slot.value, &out); err != nil {
		return nil, invalidJSON(s.name, out, err)
	}
	if out == nil { // JSON null
		return nil, fmt.Errorf("state `%s`: invalid JSON: expected a JSON array", s.name)
	}
	return out, nil
}

// Set replaces the list for key (nil: the empty list).
func (s ListState[T]) Set(key []byte, items []T) error {
	k, err := valueKey(s.name, key)
	if err != nil {
		return err
	}
	if items == nil {
		items = []T{}
	}
	v, err := encode(items)
	if err != nil {
		return fmt.Errorf("state `%s`: %w", s.name, err)
	}
	cache.write(k, v, true)
	return nil
}

// Clear removes the list for key.
func (s ListState[T]) Clear(key []byte) error {
	k, err := valueKey(s.name, key)
	if err != nil {
		return err
	}
	cache.write(k, nil, false)
	return nil
}

// Prefetch loads the lists for all of keys with one `state.get-many` call
// (see [ValueState.Prefetch]).
func (s ListState[T]) Prefetch(keys [][]byte) error { return prefetchValues(s.name, keys) }

// trimASCII trims what Rust's trim_ascii trims (not \v).
func trimASCII(b []byte) []byte { return bytes.Trim(b, " \t\n\f\r") }

// appendJSON appends the JSON item to the JSON array list (present false:
// none yet) without parsing the array's elements, byte for byte what the
// Rust SDK writes.
func appendJSON(list []byte, present bool, item []byte) ([]byte, error) {
	if !present {
		out := make([]byte, 0, len(item)+2)
		out = append(out, '[')
		out = append(out, item...)
		return append(out, ']'), nil
	}
	trimmed := trimASCII(list)
	if len(trimmed) < 2 || trimmed[0] != '[' || trimmed[len(trimmed)-1] != ']' {
		return nil, fmt.Errorf("stored value is not a JSON array")
	}
	inner := trimmed[1 : len(trimmed)-1]
	out := make([]byte, 0, len(trimmed)+len(item)+1)
	out = append(out, trimmed[:len(trimmed)-1]...)
	if len(trimASCII(inner)) > 0 {
		out = append(out, ',')
	}
	out = append(out, item...)
	return append(out, ']'), nil
}
