// Package simhost is the sluice host simulated in memory, for native unit
// tests: a state store, a watermark, a clock and the timers set. Package
// sluicetest drives it; package sluice uses it natively by default.
package simhost

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"strings"

	"sluice.dev/sdk/go/internal/hostapi"
)

// Host is the simulated host.
type Host struct {
	// State is the store as the host holds it (written-back state only).
	State map[string][]byte
	// WatermarkAt is the watermark when HasWatermark.
	WatermarkAt  int64
	HasWatermark bool
	// Now is the host's clock.
	Now int64
	// Calls counts the calls by WIT function name (get, get-many, write,
	// scan-prefix, log, watermark, processing-time, set-timer, delete-timer).
	Calls map[string]int
	// Logs holds the log lines as "level: message".
	Logs   []string
	timers map[timerID]struct{}
}

type timerID struct {
	clock uint8
	at    int64
	key   string
}

// New returns an empty host: no state, no timers, no watermark, clock 0.
func New() *Host {
	return &Host{State: map[string][]byte{}, Calls: map[string]int{}, timers: map[timerID]struct{}{}}
}

func (h *Host) Get(key []byte) hostapi.Value {
	h.Calls["get"]++
	v, ok := h.State[string(key)]
	return hostapi.Value{Bytes: clone(v), Present: ok}
}

func (h *Host) GetMany(packedKeys []byte, n int) []hostapi.Value {
	h.Calls["get-many"]++
	keys, err := hostapi.UnpackKeys(packedKeys)
	if err != nil || len(keys) != n {
		panic(fmt.Sprintf("simhost: state.get-many-packed of %d keys: %d keys, %v", n, len(keys), err))
	}
	out := make([]hostapi.Value, len(keys))
	for i, k := range keys {
		v, ok := h.State[string(k)]
		out[i] = hostapi.Value{Bytes: clone(v), Present: ok}
	}
	return out
}

func (h *Host) Write(packedEntries []byte) {
	h.Calls["write"]++
	entries, err := hostapi.UnpackEntries(packedEntries)
	if err != nil {
		panic(fmt.Sprintf("simhost: state.write-packed: %v", err))
	}
	for _, e := range entries {
		if e.Present {
			h.State[string(e.Key)] = clone(e.Value)
		} else {
			delete(h.State, string(e.Key))
		}
	}
}

func (h *Host) ScanPrefix(prefix, startAfter []byte, hasStartAfter bool, limit uint32) []hostapi.Entry {
	h.Calls["scan-prefix"]++
	var keys []string
	for k := range h.State {
		if strings.HasPrefix(k, string(prefix)) && (!hasStartAfter || k > string(startAfter)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if uint32(len(keys)) > limit {
		keys = keys[:limit]
	}
	out := make([]hostapi.Entry, len(keys))
	for i, k := range keys {
		out[i] = hostapi.Entry{Key: []byte(k), Value: clone(h.State[k]), Present: true}
	}
	return out
}

var levels = [...]string{"trace", "debug", "info", "warn", "error"}

func (h *Host) Log(level uint8, message string) {
	h.Calls["log"]++
	name := fmt.Sprint(level)
	if int(level) < len(levels) {
		name = levels[level]
	}
	h.Logs = append(h.Logs, name+": "+message)
	fmt.Fprintf(os.Stderr, "[%s] %s\n", name, message)
}

func (h *Host) Watermark() (int64, bool) {
	h.Calls["watermark"]++
	return h.WatermarkAt, h.HasWatermark
}

func (h *Host) ProcessingTime() int64 {
	h.Calls["processing-time"]++
	return h.Now
}

func (h *Host) SetTimer(t hostapi.Timer) {
	h.Calls["set-timer"]++
	h.timers[timerID{t.Clock, t.At, string(t.Key)}] = struct{}{}
}

func (h *Host) DeleteTimer(t hostapi.Timer) {
	h.Calls["delete-timer"]++
	delete(h.timers, timerID{t.Clock, t.At, string(t.Key)})
}

// sorted returns the timers by clock (event first), time, key.
func (h *Host) sorted() []timerID {
	ids := make([]timerID, 0, len(h.timers))
	for id := range h.timers {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, b := ids[i], ids[j]
		if a.clock != b.clock {
			return a.clock < b.clock
		}
		if a.at != b.at {
			return a.at < b.at
		}
		return a.key < b.key
	})
	return ids
}

func (id timerID) timer() hostapi.Timer {
	return hostapi.Timer{Clock: id.clock, Key: []byte(id.key), At: id.at}
}

// Pending returns the timers set, in firing order.
func (h *Host) Pending() []hostapi.Timer {
	var out []hostapi.Timer
	for _, id := range h.sorted() {
		out = append(out, id.timer())
	}
	return out
}

// TakeDue removes and returns the due timers in the order the host fires
// them: event-time timers at or below the watermark, then processing-time
// timers at or below the clock, each by time, then key.
func (h *Host) TakeDue() []hostapi.Timer {
	var out []hostapi.Timer
	for _, id := range h.sorted() {
		due := id.at <= h.Now
		if id.clock == hostapi.ClockEvent {
			due = h.HasWatermark && id.at <= h.WatermarkAt
		}
		if due {
			delete(h.timers, id)
			out = append(out, id.timer())
		}
	}
	return out
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return bytes.Clone(b)
}
