package sluice

// Records: the input side ([Record], [Batch]) and the output side
// ([Emitter], [Output]). Emitting never crosses the component boundary: the
// records go to the host when the batch returns, or not at all if it fails.

import (
	"fmt"
	"unicode/utf8"
	"unsafe"

	"sluice.dev/sdk/go/internal/hostapi"
)

// Header is a Kafka record header: a UTF-8 key and raw bytes.
type Header = hostapi.Header

// Record is an input record. Its byte slices stay valid after the batch, but
// must not be modified.
type Record struct {
	raw hostapi.InputRecord
}

// Key returns the key, and false for records produced without one.
func (r *Record) Key() ([]byte, bool) {
	if !r.raw.HasKey {
		return nil, false
	}
	return r.raw.Key, true
}

// KeyOrEmpty returns the key, or an empty slice for records without one.
func (r *Record) KeyOrEmpty() []byte {
	if !r.raw.HasKey || r.raw.Key == nil {
		return []byte{}
	}
	return r.raw.Key
}

// KeyString returns the key as UTF-8 text; an error if there is none or it
// is not UTF-8.
func (r *Record) KeyString() (string, error) {
	if !r.raw.HasKey {
		return "", fmt.Errorf("record has no key")
	}
	if !utf8.Valid(r.raw.Key) {
		return "", fmt.Errorf("record key is not valid UTF-8")
	}
	return string(r.raw.Key), nil
}

// Value returns the value, and false for tombstones.
func (r *Record) Value() ([]byte, bool) {
	if !r.raw.HasValue {
		return nil, false
	}
	return r.raw.Value, true
}

// ValueOrEmpty returns the value, or an empty slice for tombstones.
func (r *Record) ValueOrEmpty() []byte {
	if !r.raw.HasValue || r.raw.Value == nil {
		return []byte{}
	}
	return r.raw.Value
}

// IsTombstone reports whether the record has no value.
func (r *Record) IsTombstone() bool { return !r.raw.HasValue }

// Headers returns the record's headers, in order.
func (r *Record) Headers() []Header { return r.raw.Headers }

// Header returns the value of the last header called name (as Kafka's
// Headers.lastHeader and the Rust and Python SDKs do).
func (r *Record) Header(name string) ([]byte, bool) {
	for i := len(r.raw.Headers) - 1; i >= 0; i-- {
		if h := r.raw.Headers[i]; h.Key == name {
			return h.Value, true
		}
	}
	return nil, false
}

// Timestamp returns the record's timestamp in milliseconds since the Unix
// epoch, if it has one.
func (r *Record) Timestamp() (int64, bool) {
	if !r.raw.HasTimestamp {
		return 0, false
	}
	return r.raw.Timestamp, true
}

// IsLate reports whether the record is late: its timestamp is at or below
// the shard's [Watermark], so windows that would hold it may have closed.
// A record without a timestamp is never late. The host counts late
// records; nothing drops them but the transform.
func (r *Record) IsLate() bool {
	if !r.raw.HasTimestamp {
		return false
	}
	w, ok := Watermark()
	return ok && r.raw.Timestamp <= w
}

// Topic returns the input topic the record came from.
func (r *Record) Topic() string { return r.raw.Topic }

// Partition returns the record's partition.
func (r *Record) Partition() int32 { return r.raw.Partition }

// Offset returns the record's offset in its partition.
func (r *Record) Offset() int64 { return r.raw.Offset }

// Batch is the records of one call, in input order.
type Batch struct {
	records []Record
}

// newBatch is raw as a batch. A Record is only its InputRecord, so the
// batch's records are raw's own: no second array to clear and copy
// (about 120 bytes of each per record).
func newBatch(raw []hostapi.InputRecord) *Batch {
	return &Batch{records: unsafe.Slice((*Record)(unsafe.Pointer(unsafe.SliceData(raw))), len(raw))}
}

// Records returns the batch's records.
func (b *Batch) Records() []Record { return b.records }

// Len returns the number of records.
func (b *Batch) Len() int { return len(b.records) }

// Keys returns every record's key (empty for records without one), in
// order, e.g. for [ValueState.Prefetch].
func (b *Batch) Keys() [][]byte {
	keys := make([][]byte, len(b.records))
	for i := range b.records {
		keys[i] = b.records[i].KeyOrEmpty()
	}
	return keys
}

// Emitter collects a batch's output records, written as they are emitted
// into the one byte string the host takes them back as (`packed-outputs`).
type Emitter struct {
	out hostapi.Outputs
}

// Emit writes a record with this key and value, no headers, to the job's
// default output topic. It copies both, so they may be reused as soon as
// it returns: a value formatted into a buffer on the stack
// (strconv.AppendUint(digits[:0], n, 10)) costs no allocation.
func (e *Emitter) Emit(key, value []byte) { e.out.AddKeyValue(key, value) }

// EmitJSON writes a record with this key and the compact JSON text of
// value (as serde_json writes it), no headers, to the default output topic.
func (e *Emitter) EmitJSON(key []byte, value any) error {
	v, err := encode(value)
	if err != nil {
		return err
	}
	e.Emit(key, v)
	return nil
}

// EmitOutput writes a record built with [NewOutput] (copied).
func (e *Emitter) EmitOutput(o *Output) { e.out.Add(&o.raw) }

// Forward writes r unchanged (key, value, headers) to the default output
// topic.
func (e *Emitter) Forward(r *Record) {
	e.out.Add(&hostapi.OutputRecord{
		Key:      r.raw.Key,
		HasKey:   r.raw.HasKey,
		Value:    r.raw.Value,
		HasValue: r.raw.HasValue,
		Headers:  r.raw.Headers,
	})
}

// Len returns the number of records emitted so far in this batch.
func (e *Emitter) Len() int { return e.out.Len() }

// Output is an output record under construction: start with [NewOutput]
// (no key, no value, no headers, default topic) and chain the setters.
type Output struct {
	raw hostapi.OutputRecord
}

// NewOutput returns an output with no key, no value (a tombstone), no
// headers, for the default topic.
func NewOutput() *Output {
	return &Output{}
}

// WithKey sets the key.
func (o *Output) WithKey(key []byte) *Output { o.raw.Key, o.raw.HasKey = key, true; return o }

// WithValue sets the value.
func (o *Output) WithValue(value []byte) *Output {
	o.raw.Value, o.raw.HasValue = value, true
	return o
}

// WithHeader adds a header (keeping any of the same name).
func (o *Output) WithHeader(key string, value []byte) *Output {
	o.raw.Headers = append(o.raw.Headers, Header{Key: key, Value: value})
	return o
}

// WithTopic sends the output to topic, which must be one of the job's
// declared output topics (otherwise the host fails the batch).
func (o *Output) WithTopic(topic string) *Output { o.raw.Topic, o.raw.HasTopic = topic, true; return o }
