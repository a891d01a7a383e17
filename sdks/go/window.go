package sluice

// Event-time windows, built on state and timers (the Rust SDK's window.rs).
//
// Each window of a key keeps one accumulator, which the transform folds
// each record into (Add). Each window end has one event-time timer at
// `end - 1 + allowed lateness`, whatever the number of keys (Flink and
// Kafka Streams keep one per key and window: here a window's keys cost no
// timer each, to set, checkpoint, log and fire). When the watermark
// reaches it the host calls OnTimer, where Fire turns the timer into the
// closed [Window]s of that end (removing their state) for the transform to
// emit, [WindowsPerFiring] at a time. So each window's result is emitted
// once, with every record at most the allowed lateness behind the
// watermark; a record for windows that have all fired already is not added
// (Add says so, and the host has counted it late), never silently.
//
// State layout (shared with the other SDKs): a [Windows] named `name` keeps
// window `start` of key `k` as the [MapState] entry (`name`, `start` as an
// int64 map key's 8 bytes, `k` as the map key), that is
// `name 0x00 00 00 00 08 start k`, so one window's keys are one key range;
// its timers are event-time timers with the key `name`, one per window end,
// at `end - 1 + allowed lateness`. A firing takes the range's first
// [WindowsPerFiring] entries in key order and, if more remain, sets an
// event-time timer `name 0x01 last-key` at the same time, whose firing goes
// on after that key. (Earlier SDKs stored (`name`, `k`, `start`) with a timer
// `name 0x00 k` per key; Fire still closes such a window.) A
// [SessionWindows] keeps a key's open sessions as one [ValueState] JSON
// array of {"start","end","value"}, with an event-time timer `name 0x00 k`
// at each session's `end - 1 + allowed lateness`.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"
)

// Window is a window that closed: its record key, its bounds and its
// accumulator.
type Window[A any] struct {
	Key []byte
	// Start is its first millisecond.
	Start int64
	// End is its end, exclusive.
	End   int64
	Value A
}

// KeyString returns the key as UTF-8 text, or an error if it is not.
func (w *Window[A]) KeyString() (string, error) {
	if !utf8.Valid(w.Key) {
		return "", fmt.Errorf("window key is not valid UTF-8")
	}
	return string(w.Key), nil
}

// millis is d in whole ms; negative stays negative (an error on use).
func millis(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// windowTimerKey is the timer key of windows named name for key: sessions,
// and tumbling or hopping windows stored by an earlier SDK.
func windowTimerKey(name string, key []byte) []byte {
	out := make([]byte, 0, len(name)+1+len(key))
	out = append(out, name...)
	out = append(out, 0)
	return append(out, key...)
}

// timerRecordKey is the record key a timer of windows named name is for,
// if it is one of theirs.
func timerRecordKey(name string, timer *Timer) ([]byte, bool) {
	if timer.Clock != ClockEvent || len(timer.Key) <= len(name) ||
		!bytes.HasPrefix(timer.Key, []byte(name)) || timer.Key[len(name)] != 0 {
		return nil, false
	}
	return timer.Key[len(name)+1:], true
}

// WindowsPerFiring is how many windows one firing of a window end's timer
// closes at most ([Windows.Fire]); it sets a timer for the rest
// (`name 0x01 last-key`, at the same time), which fire in the host's next
// round. Below the host's default limit of 100 outputs per fired timer.
const WindowsPerFiring = 64

// continued is the byte after the name in the key of the timer that goes
// on with a window end's windows after the last key a firing closed
// (`name 0x01 key`); distinct from the `name 0x00 key` of per-key timers.
const continued = 0x01

func timestampOf(r *Record) (int64, error) {
	ts, ok := r.Timestamp()
	if !ok {
		return 0, fmt.Errorf("record %s-%d@%d has no timestamp, so it falls in no event-time window",
			r.Topic(), r.Partition(), r.Offset())
	}
	return ts, nil
}

// floorDiv is a / b rounded towards negative infinity (Rust's div_euclid
// for b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	c := a * b
	if c/b != a || (a == -1 && b == -1<<63) || (b == -1 && a == -1<<63) {
		if (a < 0) != (b < 0) {
			return -1 << 63
		}
		return 1<<63 - 1
	}
	return c
}

// Windows are tumbling or hopping event-time windows per record key, each
// with an accumulator A (stored as JSON). A value type: declare it once
// (e.g. in the transform's constructor) and use it everywhere.
//
// Each window end has one event-time timer (key: the name), not one per
// key and window: [Windows.Fire] closes every key's window of that end,
// [WindowsPerFiring] per firing.
type Windows[A any] struct {
	// state keeps, per window start (an int64 map key's 8 bytes, see
	// windowID), the accumulator of each record key (the map key).
	state MapState[[]byte, A]
	// perKey is the layout of earlier SDKs: (name, record key, start).
	perKey   MapState[int64, A]
	name     string
	size     int64
	slide    int64
	lateness int64
}

// TumblingWindows returns windows [k*size, (k+1)*size) named name (unique
// among the transform's states and windows). Sizes are whole milliseconds.
func TumblingWindows[A any](name string, size time.Duration) Windows[A] {
	return HoppingWindows[A](name, size, size)
}

// HoppingWindows returns windows of size starting every slide: a record
// falls in size/slide of them (rounded up). The slide must be positive and
// at most the size (checked by Add, or [Windows.Check]).
func HoppingWindows[A any](name string, size, slide time.Duration) Windows[A] {
	return Windows[A]{
		state:  NewMapState[[]byte, A](name),
		perKey: NewMapState[int64, A](name),
		name:   name,
		size:   millis(size),
		slide:  millis(slide),
	}
}

// AllowedLateness returns the same windows, staying open d after the
// watermark passes their end (default 0) for late records; each still
// fires once.
func (w Windows[A]) AllowedLateness(d time.Duration) Windows[A] {
	w.lateness = millis(d)
	return w
}

// Name returns the windows' name.
func (w Windows[A]) Name() string { return w.name }

// Check returns an error if the size, slide or lateness is invalid.
func (w Windows[A]) Check() error {
	if err := checkName(w.name); err != nil {
		return err
	}
	if w.size <= 0 || w.slide <= 0 || w.slide > w.size {
		return fmt.Errorf("windows `%s`: the size and slide must be positive, and the slide at most the size", w.name)
	}
	if w.lateness < 0 {
		return fmt.Errorf("windows `%s`: the allowed lateness must not be negative", w.name)
	}
	return nil
}

func (w Windows[A]) firesAt(start int64) int64 {
	return satAdd(satSub(satAdd(start, w.size), 1), w.lateness)
}

// startOf is the start of the window whose timer is set for at.
func (w Windows[A]) startOf(at int64) int64 {
	return satSub(satAdd(satSub(at, w.lateness), 1), w.size)
}

// windowID is the "record key" of the window starting at start in state:
// start as an int64 map key, so that its accumulators are the entries
// `name 0x00 u32_be(8) windowID(start) key`, one key range.
func windowID(start int64) []byte { return encodeMapKey(make([]byte, 0, 8), start) }

// Add folds a record at timestamp of key into every open window that holds
// it (fold gets the window's accumulator, and false for a new one, and
// returns the new one); it returns how many took it: 0 when all of them
// have fired already (the record is too late for them).
func (w Windows[A]) Add(key []byte, timestamp int64, fold func(acc A, found bool) A) (int, error) {
	if err := w.Check(); err != nil {
		return 0, err
	}
	watermark, hasWatermark := Watermark()
	start := satMul(floorDiv(timestamp, w.slide), w.slide)
	floor := satSub(timestamp, w.size)
	added := 0
	for start > floor {
		firesAt := w.firesAt(start)
		if !hasWatermark || firesAt > watermark {
			window := windowID(start)
			acc, found, err := w.state.Get(window, key)
			if err != nil {
				return added, err
			}
			if err := w.state.Set(window, key, fold(acc, found)); err != nil {
				return added, err
			}
			// One timer per window end, whatever the keys: set with a
			// window's first accumulator (once per call), and firing it
			// closes every key's window of that start.
			if !found {
				setOncePerCall(EventTimer([]byte(w.name), firesAt))
			}
			added++
		}
		start = satSub(start, w.slide)
	}
	return added, nil
}

// AddRecord is [Windows.Add] for a record: its key ([Record.KeyOrEmpty])
// and its timestamp (an error if it has none).
func (w Windows[A]) AddRecord(r *Record, fold func(acc A, found bool) A) (int, error) {
	ts, err := timestampOf(r)
	if err != nil {
		return 0, err
	}
	return w.Add(r.KeyOrEmpty(), ts, fold)
}

// Fire returns, if timer is one of these windows' timers, the windows it
// closes, whose state is removed, in key byte order: at most
// [WindowsPerFiring]; the rest come from a timer this sets at the same
// time (`name 0x01 last-key`), in the host's next round. Empty for any
// other timer (another window's, or one the transform set itself).
func (w Windows[A]) Fire(timer *Timer) ([]Window[A], error) {
	if timer.Clock != ClockEvent {
		return nil, nil
	}
	// The window end's timer, or the one that goes on after the key the
	// previous firing of that end stopped at.
	rest, ok := bytes.CutPrefix(timer.Key, []byte(w.name))
	resume := false
	switch {
	case !ok:
		return w.firePerKey(timer)
	case len(rest) == 0:
	case rest[0] == continued:
		resume = true
	default:
		return w.firePerKey(timer)
	}
	start := w.startOf(timer.At)
	end := satAdd(start, w.size)
	prefix, err := w.state.Prefix(windowID(start))
	if err != nil {
		return nil, err
	}
	// From after the last key fired, not from the range's start: the
	// windows fired before are deletions there until the checkpoint folds
	// them, and passing over them again, page after page, would cost a
	// window end with n keys O(n^2 / 64).
	var after []byte
	if resume {
		after = append(bytes.Clone(prefix), rest[1:]...)
	}
	page := cache.scan(prefix, after, resume, WindowsPerFiring+1)
	more := len(page) > WindowsPerFiring
	if more {
		page = page[:WindowsPerFiring]
	}
	closed := make([]Window[A], 0, len(page))
	for _, e := range page {
		if !bytes.HasPrefix(e.Key, prefix) {
			return nil, fmt.Errorf("host bug: state.scan-prefix returned a key outside the prefix (windows `%s`)", w.name)
		}
		value, _, err := w.state.decode(e.Value)
		if err != nil {
			return nil, err
		}
		cache.write(string(e.Key), nil, false)
		closed = append(closed, Window[A]{Key: bytes.Clone(e.Key[len(prefix):]), Start: start, End: end, Value: value})
	}
	if more && len(closed) > 0 {
		last := closed[len(closed)-1].Key
		key := make([]byte, 0, len(w.name)+1+len(last))
		key = append(append(append(key, w.name...), continued), last...)
		EventTimer(key, timer.At).Set()
	}
	return closed, nil
}

// firePerKey closes the window of a timer `name 0x00 key` that an earlier
// SDK stored per key (name, key, start), alone, so that windows open
// across an upgrade are not lost.
func (w Windows[A]) firePerKey(timer *Timer) ([]Window[A], error) {
	key, ok := timerRecordKey(w.name, timer)
	if !ok {
		return nil, nil
	}
	start := w.startOf(timer.At)
	value, found, err := w.perKey.Get(key, start)
	if err != nil || !found {
		return nil, err
	}
	if err := w.perKey.Remove(key, start); err != nil {
		return nil, err
	}
	return []Window[A]{{Key: bytes.Clone(key), Start: start, End: satAdd(start, w.size), Value: value}}, nil
}

// session is one open session of a key, as stored.
type session[A any] struct {
	Start int64 `json:"start"`
	// End is the last record's time plus the gap (exclusive).
	End   int64 `json:"end"`
	Value A     `json:"value"`
}

// SessionWindows are session windows per record key: records less than
// gap apart form one session [first, last+gap), closed when the watermark
// passes its end (plus the allowed lateness); a record that bridges two
// sessions merges them. The accumulator A is stored as JSON.
type SessionWindows[A any] struct {
	state    ValueState[json.RawMessage]
	name     string
	gap      int64
	lateness int64
}

// NewSessionWindows returns sessions named name (unique among the
// transform's states and windows) that close after gap without a record.
func NewSessionWindows[A any](name string, gap time.Duration) SessionWindows[A] {
	return SessionWindows[A]{state: NewValueState[json.RawMessage](name), name: name, gap: millis(gap)}
}

// AllowedLateness returns the same sessions, staying open d after the
// watermark passes their end (default 0).
func (s SessionWindows[A]) AllowedLateness(d time.Duration) SessionWindows[A] {
	s.lateness = millis(d)
	return s
}

// Name returns the sessions' name.
func (s SessionWindows[A]) Name() string { return s.name }

// Check returns an error if the gap or lateness is invalid.
func (s SessionWindows[A]) Check() error {
	if err := checkName(s.name); err != nil {
		return err
	}
	if s.gap <= 0 {
		return fmt.Errorf("sessions `%s`: the gap must be positive", s.name)
	}
	if s.lateness < 0 {
		return fmt.Errorf("sessions `%s`: the allowed lateness must not be negative", s.name)
	}
	return nil
}

func (s SessionWindows[A]) firesAt(end int64) int64 { return satAdd(satSub(end, 1), s.lateness) }

// sessions returns key's open sessions.
func (s SessionWindows[A]) sessions(key []byte) ([]session[A], error) {
	raw, found, err := s.state.Get(key)
	if err != nil || !found {
		return nil, err
	}
	var stored []struct {
		Start *int64          `json:"start"`
		End   *int64          `json:"end"`
		Value json.RawMessage `json:"value"`
	}
	bad := fmt.Errorf(`state `+"`%s`"+`: invalid JSON: expected an array of {"start", "end", "value"}`, s.name)
	if json.Unmarshal(raw, &stored) != nil || stored == nil {
		return nil, bad
	}
	out := make([]session[A], len(stored))
	for i, st := range stored {
		if st.Start == nil || st.End == nil || st.Value == nil {
			return nil, bad
		}
		out[i].Start, out[i].End = *st.Start, *st.End
		if err := decode([]byte(st.Value), &out[i].Value); err != nil {
			return nil, invalidJSON(s.name, out[i].Value, err)
		}
	}
	return out, nil
}

func (s SessionWindows[A]) store(key []byte, sessions []session[A]) error {
	if len(sessions) == 0 {
		return s.state.Clear(key)
	}
	v, err := encode(sessions)
	if err != nil {
		return fmt.Errorf("state `%s`: %w", s.name, err)
	}
	return s.state.Set(key, json.RawMessage(v))
}

// Add folds a record at timestamp of key into its session: a new one
// (fold(zero, false)), the one it extends, or (when it bridges several)
// their merge, combined pairwise with merge(a, b). It returns false if the
// session it would open has fired already (the record is too late).
func (s SessionWindows[A]) Add(key []byte, timestamp int64, fold func(acc A, found bool) A, merge func(a, b A) A) (bool, error) {
	if err := s.Check(); err != nil {
		return false, err
	}
	start, end := timestamp, satAdd(timestamp, s.gap)
	if w, ok := Watermark(); ok && s.firesAt(end) <= w {
		return false, nil
	}
	all, err := s.sessions(key)
	if err != nil {
		return false, err
	}
	var touching, rest []session[A]
	for _, ss := range all {
		if ss.Start < end && start < ss.End {
			touching = append(touching, ss)
		} else {
			rest = append(rest, ss)
		}
	}
	timerKey := windowTimerKey(s.name, key)
	var merged *session[A]
	for i := range touching {
		ss := touching[i]
		EventTimer(timerKey, s.firesAt(ss.End)).Delete()
		if merged == nil {
			merged = &ss
		} else {
			merged = &session[A]{Start: min(merged.Start, ss.Start), End: max(merged.End, ss.End), Value: merge(merged.Value, ss.Value)}
		}
	}
	var next session[A]
	if merged == nil {
		var zero A
		next = session[A]{Start: start, End: end, Value: fold(zero, false)}
	} else {
		next = session[A]{Start: min(merged.Start, start), End: max(merged.End, end), Value: fold(merged.Value, true)}
	}
	EventTimer(timerKey, s.firesAt(next.End)).Set()
	rest = append(rest, next)
	slices.SortStableFunc(rest, func(a, b session[A]) int {
		switch {
		case a.Start < b.Start:
			return -1
		case a.Start > b.Start:
			return 1
		}
		return 0
	})
	return true, s.store(key, rest)
}

// AddRecord is [SessionWindows.Add] for a record: its key
// ([Record.KeyOrEmpty]) and its timestamp (an error if it has none).
func (s SessionWindows[A]) AddRecord(r *Record, fold func(acc A, found bool) A, merge func(a, b A) A) (bool, error) {
	ts, err := timestampOf(r)
	if err != nil {
		return false, err
	}
	return s.Add(r.KeyOrEmpty(), ts, fold, merge)
}

// Fire returns, if timer is one of these sessions' timers, the session it
// closes, whose state is removed; nil for any other timer.
func (s SessionWindows[A]) Fire(timer *Timer) (*Window[A], error) {
	key, ok := timerRecordKey(s.name, timer)
	if !ok {
		return nil, nil
	}
	all, err := s.sessions(key)
	if err != nil {
		return nil, err
	}
	var closed, open []session[A]
	for _, ss := range all {
		if s.firesAt(ss.End) == timer.At {
			closed = append(closed, ss)
		} else {
			open = append(open, ss)
		}
	}
	if len(closed) == 0 {
		return nil, nil
	}
	if err := s.store(key, open); err != nil {
		return nil, err
	}
	c := closed[0]
	return &Window[A]{Key: bytes.Clone(key), Start: c.Start, End: c.End, Value: c.Value}, nil
}
