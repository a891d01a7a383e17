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
// and yields zeros, so a caller checks once at the end.
type unpacker struct {
	b   []byte
	bad bool
}

func (u *unpacker) take(n uint64) []byte {
	if u.bad || uint64(len(u.b)) < n {
		u.bad = true
		return nil
	}
	out := u.b[:n:n]
	u.b = u.b[n:]
	return out
}

func (u *unpacker) u8() byte {
	if b := u.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (u *unpacker) u32() uint32 {
	if b := u.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (u *unpacker) s64() int64 {
	if b := u.take(8); b != nil {
		return int64(binary.LittleEndian.Uint64(b))
	}
	return 0
}

func (u *unpacker) bytes() []byte { return u.take(uint64(u.u32())) }

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
	for i := range records {
		r := &records[i]
		flags := u.u8()
		topic := u.u32()
		if topic >= topicCount {
			return nil, errMalformed
		}
		r.Topic = topics[topic]
		r.Partition = partition
		r.Offset = u.s64()
		if r.HasTimestamp = flags&4 != 0; r.HasTimestamp {
			r.Timestamp = u.s64()
		}
		if r.HasKey = flags&1 != 0; r.HasKey {
			r.Key = u.bytes()
		}
		if r.HasValue = flags&2 != 0; r.HasValue {
			r.Value = u.bytes()
		}
		headers := u.u32()
		if uint64(headers) > uint64(len(u.b))/8 {
			return nil, errMalformed
		}
		if headers > 0 {
			r.Headers = make([]Header, headers)
			for j := range r.Headers {
				r.Headers[j] = Header{Key: string(u.bytes()), Value: u.bytes()}
			}
		}
	}
	if u.bad || len(u.b) != 0 {
		return nil, errMalformed
	}
	return records, nil
}

func appendU32(b []byte, n int) []byte { return binary.LittleEndian.AppendUint32(b, uint32(n)) }

// PackKeys is the argument of `state.get-many-packed`: a count, then each
// key's length and bytes.
func PackKeys(keys [][]byte) []byte {
	size := 4
	for _, k := range keys {
		size += 4 + len(k)
	}
	b := appendU32(make([]byte, 0, size), len(keys))
	for _, k := range keys {
		b = append(appendU32(b, len(k)), k...)
	}
	return b
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
	for i := range values {
		if u.u8() != 0 {
			values[i] = Value{Bytes: u.bytes(), Present: true}
		}
	}
	if u.bad || len(u.b) != 0 {
		return nil, errMalformed
	}
	return values, nil
}

// PackEntries is the argument of `state.write-packed`: a count, then per
// entry the key's length and bytes and a byte 0 (remove) or 1 and the
// value's length and bytes.
func PackEntries(entries []Entry) []byte {
	size := 4
	for _, e := range entries {
		size += 9 + len(e.Key) + len(e.Value)
	}
	b := appendU32(make([]byte, 0, size), len(entries))
	for _, e := range entries {
		b = append(appendU32(b, len(e.Key)), e.Key...)
		if e.Present {
			b = append(appendU32(append(b, 1), len(e.Value)), e.Value...)
		} else {
			b = append(b, 0)
		}
	}
	return b
}

// PackOutputs appends to b the `packed-outputs` that `process-packed-out`
// returns (since 0.1.5): a count, then per record a flags byte (1: key,
// 2: value, 4: topic), the topic, key and value each as a length and bytes
// when present, and the headers' count and each header's key and value.
// One string for the whole batch, where a list of output records costs a
// list entry and a pinned slice per key and value.
func PackOutputs(b []byte, records []OutputRecord) []byte {
	size := 4
	for i := range records {
		r := &records[i]
		size += 17 + len(r.Topic) + len(r.Key) + len(r.Value)
		for _, h := range r.Headers {
			size += 8 + len(h.Key) + len(h.Value)
		}
	}
	if cap(b)-len(b) < size {
		b = append(make([]byte, 0, len(b)+size), b...)
	}
	b = appendU32(b, len(records))
	for i := range records {
		r := &records[i]
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
		b = append(b, flags)
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
	}
	return b
}
