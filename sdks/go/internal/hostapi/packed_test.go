package hostapi

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
)

// packBatch packs records as the host does (host/src/runtime/packed.rs).
func packBatch(partition int32, records []InputRecord) []byte {
	var topics []string
	index := map[string]int{}
	for _, r := range records {
		if _, ok := index[r.Topic]; !ok {
			index[r.Topic] = len(topics)
			topics = append(topics, r.Topic)
		}
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(partition))
	b = appendU32(b, len(topics))
	for _, t := range topics {
		b = append(appendU32(b, len(t)), t...)
	}
	b = appendU32(b, len(records))
	for _, r := range records {
		var flags byte
		if r.HasKey {
			flags |= 1
		}
		if r.HasValue {
			flags |= 2
		}
		if r.HasTimestamp {
			flags |= 4
		}
		b = append(b, flags)
		b = appendU32(b, index[r.Topic])
		b = binary.LittleEndian.AppendUint64(b, uint64(r.Offset))
		if r.HasTimestamp {
			b = binary.LittleEndian.AppendUint64(b, uint64(r.Timestamp))
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

// onlyWhole fails the test unless unpack refuses every cut of whole and
// whole with a byte after it.
func onlyWhole(t *testing.T, what string, whole []byte, unpack func([]byte) error) {
	t.Helper()
	for cut := range len(whole) {
		if unpack(whole[:cut]) == nil {
			t.Fatalf("%d of %d bytes of %s unpacked", cut, len(whole), what)
		}
	}
	if unpack(append(bytes.Clone(whole), 0)) == nil {
		t.Fatalf("%s with a trailing byte unpacked", what)
	}
}

func TestABatchUnpacksToTheRecordsPackedIntoIt(t *testing.T) {
	records := []InputRecord{
		{Key: []byte("a"), HasKey: true, Value: []byte("one"), HasValue: true, Timestamp: 5, HasTimestamp: true,
			Topic: "in", Partition: 3, Offset: 0, Headers: []Header{{Key: "h", Value: []byte("x")}}},
		{Value: []byte("keyless"), HasValue: true, Topic: "in", Partition: 3, Offset: 1},
		{Key: []byte("b"), HasKey: true, Timestamp: -3, HasTimestamp: true, Topic: "other", Partition: 3, Offset: 2,
			Headers: []Header{{Key: "h", Value: []byte{}}, {Key: "g", Value: []byte("y")}}},
		{Key: []byte{}, HasKey: true, Value: []byte{}, HasValue: true, Topic: "in", Partition: 3, Offset: 1 << 40},
	}
	got, err := UnpackBatch(packBatch(3, records))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, records) {
		t.Fatalf("got %+v\nwant %+v", got, records)
	}
	if empty, err := UnpackBatch(packBatch(0, nil)); err != nil || len(empty) != 0 {
		t.Fatalf("an empty batch: %v, %v", empty, err)
	}
}

func TestAMalformedBatchIsAnErrorNotAPanic(t *testing.T) {
	// Every part a record can have, so that a cut lands in each.
	whole := packBatch(1, []InputRecord{
		{Key: []byte("k"), HasKey: true, Topic: "in"},
		{Key: []byte("key"), HasKey: true, Value: []byte("value"), HasValue: true, Timestamp: 9, HasTimestamp: true,
			Topic: "in", Headers: []Header{{Key: "h", Value: []byte("x")}, {Key: "g", Value: []byte{}}}},
	})
	onlyWhole(t, "a batch", whole, func(b []byte) error { _, err := UnpackBatch(b); return err })
	huge := bytes.Clone(whole)
	binary.LittleEndian.PutUint32(huge[4:], 1<<31) // a topic count past the bytes there are
	if _, err := UnpackBatch(huge); err == nil {
		t.Fatal("a huge topic count unpacked")
	}
}

func TestKeysAndValuesOfGetManyPacked(t *testing.T) {
	keys := [][]byte{[]byte("a"), {}, []byte("ccc")}
	want := []byte{3, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 0, 0, 0, 3, 0, 0, 0, 'c', 'c', 'c'}
	// As the (simulated) host reads them. (The state cache writes them;
	// its tests go through the simulated host.)
	if got, err := UnpackKeys(want); err != nil || !reflect.DeepEqual(got, keys) {
		t.Fatalf("keys read back as %q, %v", got, err)
	}
	onlyWhole(t, "packed keys", want, func(b []byte) error { _, err := UnpackKeys(b); return err })
	answer := []byte{3, 0, 0, 0, 1, 2, 0, 0, 0, '4', '2', 0, 1, 0, 0, 0, 0}
	values, err := UnpackValues(answer, 3)
	if err != nil {
		t.Fatal(err)
	}
	wantValues := []Value{{Bytes: []byte("42"), Present: true}, {}, {Bytes: []byte{}, Present: true}}
	if !reflect.DeepEqual(values, wantValues) {
		t.Fatalf("values %+v", values)
	}
	if _, err := UnpackValues(answer, 2); err == nil {
		t.Fatal("an answer for 3 keys taken for 2")
	}
	onlyWhole(t, "an answer", answer, func(b []byte) error { _, err := UnpackValues(b, 3); return err })
}

func TestEntriesOfWritePacked(t *testing.T) {
	entries := []Entry{{Key: []byte("k"), Value: []byte("v1"), Present: true}, {Key: []byte("gone")}}
	want := []byte{2, 0, 0, 0, 1, 0, 0, 0, 'k', 1, 2, 0, 0, 0, 'v', '1', 4, 0, 0, 0, 'g', 'o', 'n', 'e', 0}
	// As the state cache's flush writes them.
	got := make([]byte, 4)
	PutU32(got, len(entries))
	for _, e := range entries {
		got = AppendEntry(got, e.Key, e.Value, e.Present)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("entries packed as %v", got)
	}
	// As the (simulated) host reads them.
	if got, err := UnpackEntries(want); err != nil || !reflect.DeepEqual(got, entries) {
		t.Fatalf("entries read back as %+v, %v", got, err)
	}
	onlyWhole(t, "packed entries", want, func(b []byte) error { _, err := UnpackEntries(b); return err })
	badFlag := bytes.Clone(want)
	badFlag[9] = 2
	if _, err := UnpackEntries(badFlag); err == nil {
		t.Fatal("an entry flagged 2 read")
	}
}

// The layout of `packed-outputs`, byte by byte, as wit/sluice.wit documents
// it and host/src/runtime/packed.rs reads it.
func TestOutputsPackToTheDocumentedLayout(t *testing.T) {
	records := []OutputRecord{
		{Key: []byte("k"), HasKey: true, Value: []byte("vv"), HasValue: true,
			Headers: []Header{{Key: "h", Value: []byte("x")}}},
		{Key: []byte{}, HasKey: true, Topic: "other", HasTopic: true},
		{},
	}
	var want []byte
	want = appendU32(want, 3)
	want = append(want, 1|2)
	want = append(appendU32(want, 1), "k"...)
	want = append(appendU32(want, 2), "vv"...)
	want = appendU32(want, 1)
	want = append(appendU32(want, 1), "h"...)
	want = append(appendU32(want, 1), "x"...)
	want = append(want, 1|4)
	want = append(appendU32(want, 5), "other"...)
	want = appendU32(want, 0)
	want = appendU32(want, 0)
	want = append(want, 0)
	want = appendU32(want, 0)
	var packed Outputs
	packed.Reset(nil)
	for i := range records {
		packed.Add(&records[i])
	}
	if got := packed.Bytes(); !bytes.Equal(got, want) {
		t.Fatalf("packed\n%v, want\n%v", got, want)
	}
	// The common case, written without an OutputRecord, is the same bytes.
	var kv Outputs
	kv.Reset(nil)
	kv.AddKeyValue([]byte("k"), []byte("vv"))
	one := append(appendU32(nil, 1), 1|2)
	one = append(appendU32(one, 1), "k"...)
	one = append(appendU32(one, 2), "vv"...)
	one = appendU32(one, 0)
	if got := kv.Bytes(); !bytes.Equal(got, one) || kv.Len() != 1 {
		t.Fatalf("key and value: %v, want %v", got, one)
	}
	// Reset reuses the storage, and an Outputs never reset is empty.
	kv.Reset(kv.Bytes())
	if got := kv.Bytes(); !bytes.Equal(got, []byte{0, 0, 0, 0}) {
		t.Fatalf("after a reset: %v", got)
	}
	var never Outputs
	if got := never.Bytes(); !bytes.Equal(got, []byte{0, 0, 0, 0}) || never.Len() != 0 {
		t.Fatalf("never reset: %v", got)
	}
	var zero Outputs // records added to a zero Outputs, never reset
	zero.AddKeyValue([]byte("k"), []byte("vv"))
	if got := zero.Bytes(); !bytes.Equal(got, one) {
		t.Fatalf("a zero Outputs: %v, want %v", got, one)
	}
	// And they read back as the records they were.
	back, err := UnpackOutputs(want)
	if err != nil {
		t.Fatal(err)
	}
	records[2] = OutputRecord{} // no key, value, topic or headers: none read back
	if !reflect.DeepEqual(back, records) {
		t.Fatalf("read back %+v\nwant %+v", back, records)
	}
}

func TestMalformedOutputsAreAnErrorNotAPanic(t *testing.T) {
	var packed Outputs
	packed.Reset(nil)
	packed.Add(&OutputRecord{Key: []byte("key"), HasKey: true, Value: []byte("value"), HasValue: true,
		Topic: "side", HasTopic: true, Headers: []Header{{Key: "h", Value: []byte("x")}}})
	packed.AddKeyValue([]byte("k"), nil)
	whole := packed.Bytes()
	if _, err := UnpackOutputs(whole); err != nil {
		t.Fatal(err)
	}
	onlyWhole(t, "outputs", whole, func(b []byte) error { _, err := UnpackOutputs(b); return err })
	bad := bytes.Clone(whole)
	bad[4] = 8 // an unknown flag
	if _, err := UnpackOutputs(bad); err == nil {
		t.Fatal("an unknown flag unpacked")
	}
}
