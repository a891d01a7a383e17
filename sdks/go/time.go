package sluice

// Event time, the watermark and timers (WIT interface `time`).

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"sluice.dev/sdk/go/internal/hostapi"
)

// Clock is the clock a timer follows.
type Clock uint8

const (
	// ClockEvent is the shard's watermark.
	ClockEvent Clock = Clock(hostapi.ClockEvent)
	// ClockProcessing is the host's wall clock (the guest's own clock
	// stays frozen).
	ClockProcessing Clock = Clock(hostapi.ClockProcessing)
)

// String returns "Event" or "Processing" (as the Rust SDK's Debug does).
func (c Clock) String() string {
	switch c {
	case ClockEvent:
		return "Event"
	case ClockProcessing:
		return "Processing"
	}
	return fmt.Sprintf("Clock(%d)", uint8(c))
}

// Timer is a key at a time At (ms since the Unix epoch) on a Clock.
//
// Timers are state of the shard: setting one in a call that fails sets
// nothing, and a firing commits exactly once with its epoch. A shard holds
// at most one timer per clock, key and time. Timers order by clock (event
// before processing), time, key ([Timer.Compare]), which is the order the
// host fires them in.
type Timer struct {
	Clock Clock
	Key   []byte
	At    int64
}

// EventTimer is a timer that fires once the watermark reaches at.
func EventTimer(key []byte, at int64) Timer { return Timer{Clock: ClockEvent, Key: key, At: at} }

// ProcessingTimer is a timer that fires once the host's clock reaches at.
func ProcessingTimer(key []byte, at int64) Timer {
	return Timer{Clock: ClockProcessing, Key: key, At: at}
}

// Set sets the timer (setting a timer that is set already does nothing).
// An event-time timer at or below the watermark fires right after this
// call.
func (t Timer) Set() { host().SetTimer(t.toHost()) }

// Delete deletes the timer; deleting a timer that is not set does nothing.
func (t Timer) Delete() { host().DeleteTimer(t.toHost()) }

// KeyString returns the key as UTF-8 text, or an error if it is not.
func (t Timer) KeyString() (string, error) {
	if !utf8.Valid(t.Key) {
		return "", fmt.Errorf("timer key is not valid UTF-8")
	}
	return string(t.Key), nil
}

// Compare orders timers by clock, time, key: -1, 0 or +1.
func (t Timer) Compare(u Timer) int {
	switch {
	case t.Clock != u.Clock:
		if t.Clock < u.Clock {
			return -1
		}
		return 1
	case t.At != u.At:
		if t.At < u.At {
			return -1
		}
		return 1
	}
	return bytes.Compare(t.Key, u.Key)
}

// String shows the timer as the error messages do: `Event "key"@123`.
func (t Timer) String() string { return fmt.Sprintf("%s %s@%d", t.Clock, debugString(t.Key), t.At) }

func (t Timer) toHost() hostapi.Timer {
	return hostapi.Timer{Clock: uint8(t.Clock), Key: t.Key, At: t.At}
}

func timerFromHost(t hostapi.Timer) Timer { return Timer{Clock: Clock(t.Clock), Key: t.Key, At: t.At} }

// The watermark and the clock of the running call, once asked for.
var (
	callWatermark    int64
	callHasWatermark bool
	callWatermarkSet bool
	callNow          int64
	callNowSet       bool
)

// callTimers are the timers setOncePerCall has set in the running call.
var callTimers = map[timerID]struct{}{}

// timerID is a Timer as a map key.
type timerID struct {
	clock Clock
	at    int64
	key   string
}

// newCall forgets the cached watermark and clock and the timers set once
// per call: called as every export call begins.
func newCall() {
	callWatermarkSet, callNowSet = false, false
	clear(callTimers)
}

// setOncePerCall sets t unless the running call has set it through here
// already: windows set the same timer for every key's first record, and
// one crossing per call does (setting a set timer does nothing).
func setOncePerCall(t Timer) {
	id := timerID{t.Clock, t.At, string(t.Key)}
	if _, ok := callTimers[id]; ok {
		return
	}
	callTimers[id] = struct{}{}
	t.Set()
}

// Watermark returns the shard's watermark (ms since the Unix epoch) as of
// the start of this call; false until every input partition of the shard
// has sent a record or gone idle. One host call per call into the
// transform, however often it is asked (it does not change during a call).
func Watermark() (int64, bool) {
	if !callWatermarkSet {
		callWatermark, callHasWatermark = host().Watermark()
		callWatermarkSet = true
	}
	return callWatermark, callHasWatermark
}

// ProcessingTime returns the host's clock (ms since the Unix epoch) as of
// the start of this call, what processing-time timers are compared with
// (one host call per call).
func ProcessingTime() int64 {
	if !callNowSet {
		callNow = host().ProcessingTime()
		callNowSet = true
	}
	return callNow
}

// debugString is key as Rust's {:?} shows String::from_utf8_lossy(key)
// (what the Rust and Python SDKs put in timer error messages).
func debugString(key []byte) string {
	var b strings.Builder
	b.WriteByte('"')
	for len(key) > 0 {
		r, size := utf8.DecodeRune(key)
		key = key[size:]
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == 0:
			b.WriteString(`\0`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\n':
			b.WriteString(`\n`)
		case r < 0x20 || r >= 0x7f && r < 0xa0:
			fmt.Fprintf(&b, `\u{%x}`, r)
		default:
			b.WriteRune(r) // an invalid byte is utf8.RuneError: U+FFFD, as from_utf8_lossy
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Saturating s64 arithmetic, as the Rust SDK's.
func satAdd(a, b int64) int64 {
	c := a + b
	if (c > a) == (b > 0) {
		return c
	}
	if b > 0 {
		return 1<<63 - 1
	}
	return -1 << 63
}

func satSub(a, b int64) int64 {
	if b == -1<<63 {
		if a >= 0 {
			return 1<<63 - 1
		}
		return a - b
	}
	return satAdd(a, -b)
}
