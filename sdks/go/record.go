package sluice

// Records: the input side ([Record], [Batch]) and the output side
// ([Emitter], [Output]). Emitting never crosses the component boundary: the
// records go to the host when the batch returns, or not at all if it fails.

import (
	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"sluice/internal/wit/imports/sluice_transform_types"
)

// Header is a Kafka record header: a UTF-8 key and raw bytes.
type Header = sluice_transform_types.Header

// Record is an input record. Its byte slices stay valid after the batch, but
// must not be modified.
type Record struct {
	raw inputRecord
}

// Key returns the key, and false for records produced without one.
func (r *Record) Key() ([]byte, bool) { return r.raw.Key.SomeOr(nil), r.raw.Key.IsSome() }

// KeyOrEmpty returns the key, or an empty slice for records without one.
func (r *Record) KeyOrEmpty() []byte { return r.raw.Key.SomeOr([]byte{}) }

// Value returns the value, and false for tombstones.
func (r *Record) Value() ([]byte, bool) { return r.raw.Value.SomeOr(nil), r.raw.Value.IsSome() }

// ValueOrEmpty returns the value, or an empty slice for tombstones.
func (r *Record) ValueOrEmpty() []byte { return r.raw.Value.SomeOr([]byte{}) }

// IsTombstone reports whether the record has no value.
func (r *Record) IsTombstone() bool { return r.raw.Value.IsNone() }

// Headers returns the record's headers, in order.
func (r *Record) Headers() []Header { return r.raw.Headers }

// Header returns the value of the first header called name.
func (r *Record) Header(name string) ([]byte, bool) {
	for _, h := range r.raw.Headers {
		if h.Key == name {
			return h.Value, true
		}
	}
	return nil, false
}

// Timestamp returns the record's timestamp in milliseconds since the Unix
// epoch, if it has one.
func (r *Record) Timestamp() (int64, bool) {
	return r.raw.Timestamp.SomeOr(0), r.raw.Timestamp.IsSome()
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

func newBatch(raw []inputRecord) *Batch {
	records := make([]Record, len(raw))
	for i := range raw {
		records[i].raw = raw[i]
	}
	return &Batch{records: records}
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

// Emitter collects a batch's output records.
type Emitter struct {
	records []outputRecord
}

// Emit writes a record with this key and value, no headers, to the job's
// default output topic. The emitter keeps the slices: do not modify them
// afterwards.
func (e *Emitter) Emit(key, value []byte) {
	e.records = append(e.records, outputRecord{
		Key:   witTypes.Some(key),
		Value: witTypes.Some(value),
		Topic: witTypes.None[string](),
	})
}

// EmitOutput writes a record built with [NewOutput].
func (e *Emitter) EmitOutput(o *Output) { e.records = append(e.records, o.raw) }

// Forward writes r unchanged (key, value, headers) to the default output
// topic.
func (e *Emitter) Forward(r *Record) {
	e.records = append(e.records, outputRecord{
		Key:     r.raw.Key,
		Value:   r.raw.Value,
		Headers: r.raw.Headers,
		Topic:   witTypes.None[string](),
	})
}

// Len returns the number of records emitted so far in this batch.
func (e *Emitter) Len() int { return len(e.records) }

// Output is an output record under construction: start with [NewOutput]
// (no key, no value, no headers, default topic) and chain the setters.
type Output struct {
	raw outputRecord
}

// NewOutput returns an output with no key, no value (a tombstone), no
// headers, for the default topic.
func NewOutput() *Output {
	return &Output{raw: outputRecord{
		Key:   witTypes.None[[]byte](),
		Value: witTypes.None[[]byte](),
		Topic: witTypes.None[string](),
	}}
}

// WithKey sets the key.
func (o *Output) WithKey(key []byte) *Output { o.raw.Key = witTypes.Some(key); return o }

// WithValue sets the value.
func (o *Output) WithValue(value []byte) *Output { o.raw.Value = witTypes.Some(value); return o }

// WithHeader adds a header (keeping any of the same name).
func (o *Output) WithHeader(key string, value []byte) *Output {
	o.raw.Headers = append(o.raw.Headers, Header{Key: key, Value: value})
	return o
}

// WithTopic sends the output to topic, which must be one of the job's
// declared output topics (otherwise the host fails the batch).
func (o *Output) WithTopic(topic string) *Output { o.raw.Topic = witTypes.Some(topic); return o }
