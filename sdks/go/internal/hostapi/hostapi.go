// Package hostapi is the seam between package sluice and whatever plays the
// host: the `wit-bindgen go` bindings inside a component (sluice's
// host_wasm.go, built only for GOOS=wasip1), or the in-memory simulation of
// internal/simhost natively (unit tests, through package sluicetest).
//
// Its types are plain Go (no WIT option or tuple types), so package sluice
// compiles without the generated bindings, which exist only during
// sdks/go/build.sh and sdks/go/test.sh.
package hostapi

// Header is a Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// InputRecord is the WIT `input-record`; HasX false stands for `none`.
type InputRecord struct {
	Key          []byte
	HasKey       bool
	Value        []byte
	HasValue     bool
	Headers      []Header
	Timestamp    int64
	HasTimestamp bool
	Topic        string
	Partition    int32
	Offset       int64
}

// OutputRecord is the WIT `output-record`.
type OutputRecord struct {
	Key      []byte
	HasKey   bool
	Value    []byte
	HasValue bool
	Headers  []Header
	Topic    string
	HasTopic bool
}

// Clocks of a timer: the WIT enum `time.clock`'s values.
const (
	ClockEvent      uint8 = 0
	ClockProcessing uint8 = 1
)

// Timer is the WIT `time.timer`.
type Timer struct {
	Clock uint8
	Key   []byte
	At    int64
}

// Value is an `option<list<u8>>` state value.
type Value struct {
	Bytes   []byte
	Present bool
}

// Entry is one `state.write` entry (Present false: delete) or one
// `scan-prefix` result (always present).
type Entry struct {
	Key   []byte
	Value []byte
	// Present is false for a delete.
	Present bool
}

// Host is the host's imports: `state`, `log` and `time`.
type Host interface {
	Get(key []byte) Value
	// GetMany is `state.get-many-packed`: the n keys packed (the layout
	// UnpackKeys reads); their values, in order.
	GetMany(packedKeys []byte, n int) []Value
	// Write is `state.write-packed`: the entries packed (a count, then
	// each as AppendEntry writes it).
	Write(packedEntries []byte)
	// ScanPrefix pages through the keys starting with prefix, after
	// startAfter when hasStartAfter.
	ScanPrefix(prefix, startAfter []byte, hasStartAfter bool, limit uint32) []Entry
	Log(level uint8, message string)
	Watermark() (int64, bool)
	ProcessingTime() int64
	SetTimer(t Timer)
	DeleteTimer(t Timer)
}

// Current is the host package sluice calls; read at every call, so tests
// may swap it between calls.
var Current Host

// Guest is the world's exports as package sluice implements them, set by
// sluice's init: what the component's export glue and package sluicetest
// call.
var Guest struct {
	Init     func(config [][2]string) error
	Process  func(batch []InputRecord) ([]OutputRecord, error)
	OnTimers func(fired []Timer) ([]OutputRecord, error)
	Migrate  func(fromModule string) error
	// NewCall forgets the call's cached watermark and clock and its state
	// cache (without writing it back).
	NewCall func()
	// Finish writes the state cache back, as after a successful call.
	Finish func()
}
