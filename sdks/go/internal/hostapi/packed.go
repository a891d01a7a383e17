package hostapi

// The packed layouts of wit/sluice.wit (since 0.1.3): a batch for
// `process-packed`, and the keys and values of `state.get-many-packed` and
// the entries of `state.write-packed`, each one byte string instead of a
// list whose every element the canonical ABI allocates for (and, in Go,
// pins). Little-endian, u32 lengths and counts. Plain Go, so that the
// native tests cover what host_wasm.go hands the host.

import (
	"encoding/binary"
	"errors"
)

var errMalformed = errors.New("host bug: a malformed packed string")

// unpacker reads a packed string the host sent; past its end it sets bad
// and yields zeros, so a caller checks once at the end. Its readers are
// kept within the Go inliner's budget: on wasm a call costs more than the
// read itself.
type unpacker struct {
	b   []byte
	bad bool
}

// fail marks the string bad; every later read yields zeros.
func (u *unpacker) fail() {
	u.bad = true
	u.b = nil
}

func (u *unpacker) u32() uint32 {
	if len(u.b) < 4 {
		u.fail()
		return 0
	}
	v := binary.LittleEndian.Uint32(u.b)
	u.b = u.b[4:]
	return v
}

// bytes reads a u32 length, then that many bytes (a view).
func (u *unpacker) bytes() []byte {
	out, rest, ok := cut(u.b)
	if !ok {
		u.fail()
	}
	u.b = rest
	return out
}

// cut splits a u32 length and that many bytes (a view) off the front of b;
// ok is false if b is too short.
func cut(b []byte) (part, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	if uint64(len(b)-4) < n {
		return nil, nil, false
	}
	return b[4 : 4+n : 4+n], b[4+n:], true
}

// UnpackBatch reads a `packed-batch`. Keys, values and header values are
// views into b (the batch is never written to); each topic name is one
// string, shared by its records.
func UnpackBatch(b []byte) ([]InputRecord, error) {
	u := unpacker{b: b}
	partition := int32(u.u32())
	topicCount := u.u32()
	if uint64(topicCount) > uint64(len(u.b))/4 {
		return nil, errMalformed
	}
	topics := make([]string, topicCount)
	for i := range topics {
		topics[i] = string(u.bytes())
	}
	count := u.u32()
	// A record is at least 17 bytes: flags, topic, offset, header count.
	if u.bad || uint64(count) > uint64(len(u.b))/17 {
		return nil, errMalformed
	}
	records := make([]InputRecord, count)
	// Each record is read off the front of rest with the reads written out:
	// on wasm the unpacker's calls cost more than the reads.
	rest := u.b
	var ok bool
	for i := range records {
		r := &records[i]
		// flags, topic and offset (the header count is checked below).
		if len(rest) < 13 {
			return nil, errMalformed
		}
		flags := rest[0]
		topic := binary.LittleEndian.Uint32(rest[1:])
		if topic >= topicCount {
			return nil, errMalformed
		}
		r.Topic = topics[topic]
		r.Partition = partition
		r.Offset = int64(binary.LittleEndian.Uint64(rest[5:]))
		rest = rest[13:]
		if r.HasTimestamp = flags&4 != 0; r.HasTimestamp {
			if len(rest) < 8 {
				return nil, errMalformed
			}
			r.Timestamp = int64(binary.LittleEndian.Uint64(rest))
			rest = rest[8:]
		}
		if r.HasKey = flags&1 != 0; r.HasKey {
			if r.Key, rest, ok = cut(rest); !ok {
				return nil, errMalformed
			}
		}
		if r.HasValue = flags&2 != 0; r.HasValue {
			if r.Value, rest, ok = cut(rest); !ok {
				return nil, errMalformed
			}
		}
		if len(rest) < 4 {
			return nil, errMalformed
		}
		headers := binary.LittleEndian.Uint32(rest)
		rest = rest[4:]
		if headers > 0 {
			if r.Headers, rest, ok = cutHeaders(rest, headers); !ok {
				return nil, errMalformed
			}
		}
	}
	u.b = rest
	if u.bad || len(u.b) != 0 {
		return nil, errMalformed
	}
	return records, nil
}

// cutHeaders splits n headers (each a key's and a value's length and
// bytes) off the front of b, the values views into it; ok is false if b is
// too short. Called only for n > 0, so that a record without headers makes
// no call.
func cutHeaders(b []byte, n uint32) (headers []Header, rest []byte, ok bool) {
	if uint64(n) > uint64(len(b))/8 {
		return nil, nil, false
	}
	headers = make([]Header, n)
	for j := range headers {
		var key, value []byte
		if key, b, ok = cut(b); !ok {
			return nil, nil, false
		}
		if value, b, ok = cut(b); !ok {
			return nil, nil, false
		}
		headers[j] = Header{Key: string(key), Value: value}
	}
	return headers, b, true
}

func appendU32(b []byte, n int) []byte { return binary.LittleEndian.AppendUint32(b, uint32(n)) }

// UnpackKeys reads the argument of `state.get-many-packed` (a count, then
// each key's length and bytes, as the state cache writes it), as the host
// does (for the simulated host). The keys are views into b.
func UnpackKeys(b []byte) ([][]byte, error) {
	u := unpacker{b: b}
	n := u.u32()
	if uint64(n) > uint64(len(u.b))/4 {
		return nil, errMalformed
	}
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = u.bytes()
	}
	if u.bad || len(u.b) != 0 {
		return nil, errMalformed
	}
	return keys, nil
}

// UnpackValues reads the answer of `state.get-many-packed` for n keys: the
// same count, then per key a byte 0 (absent) or 1 and the value's length
// and bytes. The values are views into b.
func UnpackValues(b []byte, n int) ([]Value, error) {
	u := unpacker{b: b}
	if int(u.u32()) != n || u.bad {
		return nil, errMalformed
	}
	values := make([]Value, n)
	rest := u.b
	var ok bool
	for i := range values {
		if len(rest) < 1 {
			return nil, errMalformed
		}
		present := rest[0] != 0
		rest = rest[1:]
		if present {
			values[i].Present = true
			if values[i].Bytes, rest, ok = cut(rest); !ok {
				return nil, errMalformed
			}
		}
	}
	if len(rest) != 0 {
		return nil, errMalformed
	}
	return values, nil
}

// The argument of `state.write-packed` is a count (PutU32), then each
// entry as AppendEntry writes it.

// EntrySize is the bytes AppendEntry appends for key and value.
func EntrySize(key, value []byte) int { return 9 + len(key) + len(value) }

// AppendEntry appends one entry of `state.write-packed` to b: the key's
// length and bytes, then a byte 0 (remove) or 1 and the value's length and
// bytes.
func AppendEntry(b, key, value []byte, present bool) []byte {
	b = append(appendU32(b, len(key)), key...)
	if !present {
		return append(b, 0)
	}
	return append(appendU32(append(b, 1), len(value)), value...)
}

// PutU32 writes n as the u32 at the start of b: a count or a length
// written after what it counts.
func PutU32(b []byte, n int) { binary.LittleEndian.PutUint32(b, uint32(n)) }

// UnpackEntries reads the argument of `state.write-packed`, as the host
// does (for the simulated host). Keys and values are views into b.
func UnpackEntries(b []byte) ([]Entry, error) {
	u := unpacker{b: b}
	n := u.u32()
	if uint64(n) > uint64(len(u.b))/5 {
		return nil, errMalformed
	}
	entries := make([]Entry, n)
	for i := range entries {
		e := &entries[i]
		e.Key = u.bytes()
		if len(u.b) < 1 {
			return nil, errMalformed
		}
		flag := u.b[0]
		u.b = u.b[1:]
		switch flag {
		case 0:
		case 1:
			e.Value, e.Present = u.bytes(), true
		default:
			return nil, errMalformed
		}
	}
	if u.bad || len(u.b) != 0 {
		return nil, errMalformed
	}
	return entries, nil
}

// Outputs is a `packed-outputs` string (since 0.1.5), which
// `process-packed-out` returns, written as records are emitted: a count,
// then per record a flags byte (1: key, 2: value, 4: topic), the topic, key
// and value each as a length and bytes when present, and the headers'
// count and each header's key and value. One string for the whole batch,
// where a list of output records costs a list entry and a pinned slice per
// key and value. The zero Outputs is empty; Reset reuses storage.
type Outputs struct {
	b     []byte
	count uint32
}

// Reset starts an empty string in buf's storage (nil: new storage).
func (o *Outputs) Reset(buf []byte) {
	o.b = appendU32(buf[:0], 0)
	o.count = 0
}

// Len returns the number of records added.
func (o *Outputs) Len() int { return int(o.count) }

// AddKeyValue adds a record with key and value, no headers, for the
// default topic (the common case, without an OutputRecord).
func (o *Outputs) AddKeyValue(key, value []byte) {
	o.begin()
	b := append(o.b, 1|2)
	b = append(appendU32(b, len(key)), key...)
	b = append(appendU32(b, len(value)), value...)
	o.b = appendU32(b, 0)
	o.count++
}

// Add adds r.
func (o *Outputs) Add(r *OutputRecord) {
	var flags byte
	if r.HasKey {
		flags |= 1
	}
	if r.HasValue {
		flags |= 2
	}
	if r.HasTopic {
		flags |= 4
	}
	o.begin()
	b := append(o.b, flags)
	if r.HasTopic {
		b = append(appendU32(b, len(r.Topic)), r.Topic...)
	}
	if r.HasKey {
		b = append(appendU32(b, len(r.Key)), r.Key...)
	}
	if r.HasValue {
		b = append(appendU32(b, len(r.Value)), r.Value...)
	}
	b = appendU32(b, len(r.Headers))
	for _, h := range r.Headers {
		b = append(appendU32(b, len(h.Key)), h.Key...)
		b = append(appendU32(b, len(h.Value)), h.Value...)
	}
	o.b = b
	o.count++
}

// begin writes the count's place if nothing has yet (a zero Outputs).
func (o *Outputs) begin() {
	if len(o.b) < 4 {
		o.Reset(o.b)
	}
}

// Bytes returns the string, its count written.
func (o *Outputs) Bytes() []byte {
	o.begin()
	binary.LittleEndian.PutUint32(o.b, o.count)
	return o.b
}

// UnpackOutputs reads a `packed-outputs` string back into records, whose
// keys, values and header values are views into b.
func UnpackOutputs(b []byte) ([]OutputRecord, error) {
	if len(b) < 4 {
		return nil, errMalformed
	}
	count := binary.LittleEndian.Uint32(b)
	rest := b[4:]
	// A record is at least 5 bytes: flags and the header count.
	if uint64(count) > uint64(len(rest))/5 {
		return nil, errMalformed
	}
	records := make([]OutputRecord, count)
	var ok bool
	for i := range records {
		r := &records[i]
		if len(rest) < 1 {
			return nil, errMalformed
		}
		flags := rest[0]
		rest = rest[1:]
		if flags&^7 != 0 {
			return nil, errMalformed
		}
		if r.HasTopic = flags&4 != 0; r.HasTopic {
			var topic []byte
			if topic, rest, ok = cut(rest); !ok {
				return nil, errMalformed
			}
			r.Topic = string(topic)
		}
		if r.HasKey = flags&1 != 0; r.HasKey {
			if r.Key, rest, ok = cut(rest); !ok {
				return nil, errMalformed
			}
		}
		if r.HasValue = flags&2 != 0; r.HasValue {
			if r.Value, rest, ok = cut(rest); !ok {
				return nil, errMalformed
			}
		}
		if len(rest) < 4 {
			return nil, errMalformed
		}
		headers := binary.LittleEndian.Uint32(rest)
		rest = rest[4:]
		if headers > 0 {
			if r.Headers, rest, ok = cutHeaders(rest, headers); !ok {
				return nil, errMalformed
			}
		}
	}
	if len(rest) != 0 {
		return nil, errMalformed
	}
	return records, nil
}
