package sluice_test

// Unit tests of the SDK against the simulated host of package sluicetest:
// run with sdks/go/test.sh (or `go test ./...` here, natively).

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	sluice "sluice.dev/sdk/go"
	"sluice.dev/sdk/go/sluicetest"
)

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func eq[T any](t *testing.T, got, want T, what string) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: got %#v, want %#v", what, got, want)
	}
}

func values(out []sluicetest.Output) []string {
	var s []string
	for _, o := range out {
		s = append(s, string(o.Key)+"="+string(o.Value))
	}
	return s
}

// funcs is a transform made of closures, each optional but process.
type funcs struct {
	process func(*sluice.Record, *sluice.Emitter) error
	onTimer func(*sluice.Timer, *sluice.Emitter) error
	migrate func(string) error
}

func (f *funcs) Process(r *sluice.Record, out *sluice.Emitter) error { return f.process(r, out) }
func (f *funcs) OnTimer(t *sluice.Timer, out *sluice.Emitter) error {
	if f.onTimer == nil {
		return nil
	}
	return f.onTimer(t, out)
}
func (f *funcs) Migrate(from string) error {
	if f.migrate == nil {
		return nil
	}
	return f.migrate(from)
}

func start(t *testing.T, f *funcs, config ...[2]string) {
	t.Helper()
	sluicetest.Reset()
	check(t, sluicetest.Init(func(*sluice.Config) (sluice.Transform, error) { return f, nil }, config...))
}

func TestTimersFireInOrderAndOnce(t *testing.T) {
	var fired []string
	start(t, &funcs{
		process: func(r *sluice.Record, out *sluice.Emitter) error {
			ts, _ := r.Timestamp()
			sluice.EventTimer(r.KeyOrEmpty(), ts).Set()
			sluice.ProcessingTimer(r.KeyOrEmpty(), ts).Set()
			sluice.EventTimer(r.KeyOrEmpty(), ts).Set() // again: one timer
			return nil
		},
		onTimer: func(tm *sluice.Timer, out *sluice.Emitter) error {
			fired = append(fired, tm.String())
			out.Emit(tm.Key, []byte(fmt.Sprint(tm.At)))
			return nil
		},
	})
	_, err := sluicetest.Process(sluicetest.At("b", "", 20), sluicetest.At("a", "", 20), sluicetest.At("c", "", 10))
	check(t, err)
	eq(t, len(sluicetest.Pending()), 6, "pending timers")
	out, err := sluicetest.FireDue()
	check(t, err)
	eq(t, out, nil, "nothing is due without a watermark and at clock 0")
	sluicetest.SetWatermark(20)
	sluicetest.SetProcessingTime(10)
	out, err = sluicetest.FireDue()
	check(t, err)
	eq(t, fired, []string{`Event "c"@10`, `Event "a"@20`, `Event "b"@20`, `Processing "c"@10`}, "firing order")
	eq(t, values(out), []string{"c=10", "a=20", "b=20", "c=10"}, "outputs")
	fired = nil
	out, err = sluicetest.FireDue()
	check(t, err)
	eq(t, len(out)+len(fired), 0, "a fired timer is gone")
	sluicetest.SetProcessingTime(100)
	_, err = sluicetest.FireDue()
	check(t, err)
	eq(t, fired, []string{`Processing "a"@20`, `Processing "b"@20`}, "processing timers")
	eq(t, len(sluicetest.Pending()), 0, "no timers left")
}

func TestDeleteTimerAndTimerErrors(t *testing.T) {
	start(t, &funcs{
		process: func(r *sluice.Record, out *sluice.Emitter) error {
			sluice.EventTimer([]byte("k\n"), 5).Set()
			sluice.EventTimer([]byte("gone"), 5).Set()
			sluice.EventTimer([]byte("gone"), 5).Delete()
			return nil
		},
		onTimer: func(tm *sluice.Timer, out *sluice.Emitter) error { return errors.New("boom") },
	})
	_, err := sluicetest.Process(sluicetest.Rec("x", "y"))
	check(t, err)
	eq(t, len(sluicetest.Pending()), 1, "the deleted timer is gone")
	sluicetest.SetWatermark(5)
	_, err = sluicetest.FireDue()
	eq(t, fmt.Sprint(err), `timer Event "k\n"@5: boom`, "the error names the timer")
}

func TestWatermarkProcessingTimeAndLateness(t *testing.T) {
	var late []bool
	start(t, &funcs{process: func(r *sluice.Record, out *sluice.Emitter) error {
		late = append(late, r.IsLate())
		sluice.Watermark()
		sluice.ProcessingTime()
		return nil
	}})
	_, err := sluicetest.Process(sluicetest.At("a", "", 5), sluicetest.Rec("a", "no timestamp"))
	check(t, err)
	sluicetest.SetWatermark(10)
	_, err = sluicetest.Process(sluicetest.At("a", "", 10), sluicetest.At("a", "", 11), sluicetest.Rec("a", ""))
	check(t, err)
	eq(t, late, []bool{false, false, true, false, false}, "late records")
	calls := sluicetest.Calls()
	eq(t, calls["watermark"], 2, "one watermark call per call")
	eq(t, calls["processing-time"], 2, "one processing-time call per call")
}

func TestErrorsAndPanicsFailTheBatchAndDropItsWrites(t *testing.T) {
	counts := sluice.NewValueState[int64]("n")
	start(t, &funcs{process: func(r *sluice.Record, out *sluice.Emitter) error {
		if _, err := counts.Update(r.KeyOrEmpty(), func(n int64, _ bool) int64 { return n + 1 }); err != nil {
			return err
		}
		switch string(r.ValueOrEmpty()) {
		case "fail":
			return errors.New("no")
		case "panic":
			panic("oops")
		}
		out.Forward(r)
		return nil
	}})
	_, err := sluicetest.Process(sluicetest.Rec("a", "ok"), sluicetest.Rec("a", "fail"))
	eq(t, fmt.Sprint(err), "record in-0@1: no", "error")
	_, err = sluicetest.Process(sluicetest.Rec("a", "panic"))
	eq(t, fmt.Sprint(err), "record in-0@0: panic: oops", "panic")
	eq(t, len(sluicetest.State()), 0, "nothing written")
	out, err := sluicetest.Process(sluicetest.Rec("a", "ok"))
	check(t, err)
	eq(t, values(out), []string{"a=ok"}, "outputs")
	eq(t, string(sluicetest.State()["n\x00a"]), "1", "the count")
}

func TestValueStateLayoutAndCache(t *testing.T) {
	sluicetest.Reset()
	counts := sluice.NewValueState[uint64]("count")
	type point struct {
		X int    `json:"x"`
		S string `json:"s"`
	}
	points := sluice.NewValueState[point]("p")
	check(t, counts.Prefetch([][]byte{[]byte("a"), []byte("b"), []byte("a")}))
	for range 3 {
		_, err := counts.Update([]byte("a"), func(n uint64, _ bool) uint64 { return n + 1 })
		check(t, err)
	}
	check(t, points.Set([]byte(""), point{1, "<&>"}))
	sluicetest.Finish()
	eq(t, sluicetest.State(), map[string][]byte{"count\x00a": []byte("3"), "p\x00": []byte(`{"x":1,"s":"<&>"}`)}, "state")
	calls := sluicetest.Calls()
	eq(t, [3]int{calls["get"], calls["get-many"], calls["write"]}, [3]int{0, 1, 1}, "calls")
	_, _, err := sluice.NewValueState[int]("a\x00b").Get([]byte("k"))
	eq(t, fmt.Sprint(err), `state name "a\0b" must not contain a 0x00 byte`, "bad name")
}

// Reads after a prefetch find their slots in the prefetch's order without
// the map, and anything else (another order, another state, a key buffer
// changed after the prefetch) still reads the right key: each count below
// would be off if a read got another key's slot.
func TestReadsAfterAPrefetchGetTheirOwnKeys(t *testing.T) {
	sluicetest.Reset()
	counts := sluice.NewValueState[uint64]("count")
	others := sluice.NewValueState[uint64]("other")
	inc := func(s sluice.ValueState[uint64], key []byte) {
		_, err := s.Update(key, func(n uint64, _ bool) uint64 { return n + 1 })
		check(t, err)
	}
	buf := []byte("a")
	keys := [][]byte{buf, []byte("b"), []byte("c"), []byte("b")}
	check(t, counts.Prefetch(keys))
	buf[0] = 'c'             // the first key's buffer now says c
	inc(counts, buf)         // c: not the first slot's key (a)
	inc(others, []byte("b")) // another state
	inc(counts, []byte("a")) // in order: a
	inc(counts, []byte("b")) // in order: b
	inc(counts, []byte("a")) // not the next one (c)
	inc(counts, []byte("b"))
	sluicetest.Finish()
	eq(t, sluicetest.State(), map[string][]byte{
		"count\x00a": []byte("2"), "count\x00b": []byte("2"), "count\x00c": []byte("1"), "other\x00b": []byte("1"),
	}, "state")
	calls := sluicetest.Calls()
	eq(t, [3]int{calls["get"], calls["get-many"], calls["write"]}, [3]int{1, 1, 1}, "calls: other's b is the one get")
}

func TestTTLValueExpiresAndIsRemoved(t *testing.T) {
	sluicetest.Reset()
	seen := sluice.NewValueState[uint32]("seen").WithTTL(100 * time.Millisecond)
	start(t, &funcs{process: func(r *sluice.Record, out *sluice.Emitter) error {
		_, err := seen.Update(r.KeyOrEmpty(), func(n uint32, _ bool) uint32 { return n + 10 })
		return err
	}})
	sluicetest.SetProcessingTime(1_000)
	check(t, seen.Set([]byte("a"), 1))
	v, ok, err := seen.Get([]byte("a"))
	check(t, err)
	eq(t, [2]any{v, ok}, [2]any{uint32(1), true}, "read back")
	sluicetest.Finish()
	eq(t, string(sluicetest.State()["seen\x00a"]), "[1100,1]", "stored with its expiry")
	eq(t, sluicetest.Pending(), []sluice.Timer{sluice.ProcessingTimer([]byte("\x00ttl\x00seen\x00a"), 1100)}, "expiry timer")

	sluicetest.SetProcessingTime(1_099)
	_, err = sluicetest.FireDue()
	check(t, err)
	_, ok, _ = seen.Get([]byte("a"))
	eq(t, ok, true, "not yet expired")
	sluicetest.SetProcessingTime(1_100)
	_, ok, _ = seen.Get([]byte("a"))
	eq(t, ok, false, "expired: not returned, even before its timer fired")
	_, err = sluicetest.Process(sluicetest.Rec("a", "")) // an update starts afresh: 10, expiring at 1200
	check(t, err)
	_, err = sluicetest.FireDue()
	check(t, err)
	eq(t, string(sluicetest.State()["seen\x00a"]), "[1200,10]", "the first timer finds a newer expiry")
	sluicetest.SetProcessingTime(1_200)
	_, err = sluicetest.FireDue()
	check(t, err)
	_, present := sluicetest.State()["seen\x00a"]
	eq(t, present, false, "removed from the store")
	eq(t, len(sluicetest.Pending()), 0, "no timers left")
}

func TestTTLMapEntriesAreLeftOutOfReadsAndScans(t *testing.T) {
	start(t, &funcs{process: func(*sluice.Record, *sluice.Emitter) error { return nil }})
	cart := sluice.NewMapState[string, uint32]("cart").WithTTL(100 * time.Millisecond)
	u := []byte("u")
	sluicetest.SetProcessingTime(0)
	check(t, cart.Set(u, "apple", 1))
	sluicetest.Finish()
	sluicetest.SetProcessingTime(50)
	check(t, cart.Set(u, "pear", 2))
	sluicetest.Finish()
	sluicetest.SetProcessingTime(120)
	_, ok, err := cart.Get(u, "apple")
	check(t, err)
	eq(t, ok, false, "expired entry")
	entries, err := cart.Entries(u)
	check(t, err)
	eq(t, entries, []sluice.MapEntry[string, uint32]{{Key: "pear", Value: 2}}, "entries")
	keys, err := cart.Keys(u)
	check(t, err)
	eq(t, keys, []string{"pear"}, "keys")
	eq(t, len(sluicetest.State()), 2, "both still stored")
	_, err = sluicetest.FireDue()
	check(t, err)
	eq(t, len(sluicetest.State()), 1, "the expired one removed")
	sluicetest.SetProcessingTime(150)
	_, err = sluicetest.FireDue()
	check(t, err)
	eq(t, len(sluicetest.State()), 0, "state bytes go down to nothing")
}

func TestMapStateLayoutOrderAndClear(t *testing.T) {
	sluicetest.Reset()
	m := sluice.NewMapState[int64, string]("m")
	k := []byte("ab")
	for _, n := range []int64{5, -1, 0, -300, 1 << 40} {
		check(t, m.Set(k, n, fmt.Sprint(n)))
	}
	check(t, m.Set([]byte("a"), 7, "other key"))
	key, err := m.Key(k, -1)
	check(t, err)
	eq(t, key, []byte("m\x00\x00\x00\x00\x02ab\x7f\xff\xff\xff\xff\xff\xff\xff"), "key layout (sign bit flipped)")
	keys, err := m.Keys(k)
	check(t, err)
	eq(t, keys, []int64{-300, -1, 0, 5, 1 << 40}, "numeric order")
	check(t, m.Remove(k, 0))
	entries, err := m.Entries(k)
	check(t, err)
	eq(t, len(entries), 4, "after remove")
	eq(t, entries[0], sluice.MapEntry[int64, string]{Key: -300, Value: "-300"}, "first entry")
	check(t, m.Clear(k))
	entries, err = m.Entries(k)
	check(t, err)
	eq(t, len(entries), 0, "cleared")
	sluicetest.Finish()
	eq(t, sluicetest.State(), map[string][]byte{"m\x00\x00\x00\x00\x01a\x80\x00\x00\x00\x00\x00\x00\x07": []byte(`"other key"`)}, "only the other key's map is left")

	b := sluice.NewMapState[[]byte, bool]("seen")
	check(t, b.Set([]byte("order-1"), []byte("paid"), true))
	u := sluice.NewMapState[uint16, int]("u")
	check(t, u.Set(nil, 258, 1))
	sluicetest.Finish()
	st := sluicetest.State()
	eq(t, string(st["seen\x00\x00\x00\x00\x07order-1paid"]), "true", "bytes map key")
	eq(t, string(st["u\x00\x00\x00\x00\x00\x01\x02"]), "1", "u16 map key, empty record key")
}

func TestListState(t *testing.T) {
	sluicetest.Reset()
	type ev struct {
		N int    `json:"n"`
		S string `json:"s"`
	}
	l := sluice.NewListState[ev]("l")
	k := []byte("k")
	check(t, l.Push(k, ev{1, "a"}))
	check(t, l.Push(k, ev{2, "b"}))
	got, err := l.Get(k)
	check(t, err)
	eq(t, got, []ev{{1, "a"}, {2, "b"}}, "pushed")
	sluicetest.Finish()
	eq(t, string(sluicetest.State()["l\x00k"]), `[{"n":1,"s":"a"},{"n":2,"s":"b"}]`, "one JSON array")
	check(t, l.Set(k, nil))
	check(t, l.Push(k, ev{3, "c"}))
	got, _ = l.Get(k)
	eq(t, got, []ev{{3, "c"}}, "set then push")
	check(t, l.Clear(k))
	got, _ = l.Get(k)
	eq(t, len(got), 0, "cleared")
	check(t, sluice.NewValueState[int]("l2").Set(k, 5))
	err = sluice.NewListState[int]("l2").Push(k, 1)
	eq(t, fmt.Sprint(err), "state `l2`: stored value is not a JSON array", "push onto a number")
	sluicetest.Finish()
	sluice.RawSet([]byte("l3\x00k"), []byte(" [ ] \n"))
	check(t, sluice.NewListState[int]("l3").Push(k, 1))
	raw, _ := sluice.RawGet([]byte("l3\x00k"))
	eq(t, string(raw), "[ 1]", "appended as the Rust SDK does")
}

// windowedCount is examples/go/windowed-count.
type windowedCount struct{ windows sluice.Windows[uint64] }

func (w *windowedCount) Process(r *sluice.Record, _ *sluice.Emitter) error {
	_, err := w.windows.AddRecord(r, func(n uint64, _ bool) uint64 { return n + 1 })
	return err
}

func (w *windowedCount) OnTimer(tm *sluice.Timer, out *sluice.Emitter) error {
	wins, err := w.windows.Fire(tm)
	if err != nil {
		return err
	}
	for _, win := range wins {
		if err := out.EmitJSON(win.Key, map[string]any{"start": win.Start, "end": win.End, "count": win.Value}); err != nil {
			return err
		}
	}
	return nil
}

// advance moves the watermark to at and fires what is due through fire, as
// the host would: round after round, each a new call, while firing sets
// timers that are due. It returns the closed windows.
func advance[A any](t *testing.T, at int64, fire func(*sluice.Timer) ([]sluice.Window[A], error)) []sluice.Window[A] {
	t.Helper()
	sluicetest.SetWatermark(at)
	var closed []sluice.Window[A]
	for {
		due := sluicetest.TakeDue()
		if len(due) == 0 {
			return closed
		}
		sluicetest.NewCall()
		for i := range due {
			wins, err := fire(&due[i])
			check(t, err)
			closed = append(closed, wins...)
		}
		sluicetest.Finish()
	}
}

func TestTumblingWindowsAndLateness(t *testing.T) {
	for _, lateness := range []time.Duration{0, 5 * time.Second} {
		w := &windowedCount{sluice.TumblingWindows[uint64]("count", time.Minute).AllowedLateness(lateness)}
		sluicetest.Reset()
		check(t, sluicetest.Init(func(*sluice.Config) (sluice.Transform, error) { return w, nil }))
		_, err := sluicetest.Process(sluicetest.At("alice", "", 1000), sluicetest.At("bob", "", 2000),
			sluicetest.At("alice", "", 59_999), sluicetest.At("alice", "", 60_000))
		check(t, err)
		// (count, start 0 as an int64 map key, alice): count 0x00 u32_be(8)
		// (0 with the sign bit flipped) alice.
		key := "count\x00\x00\x00\x00\x08\x80\x00\x00\x00\x00\x00\x00\x00alice"
		eq(t, string(sluicetest.State()[key]), "2", "window [0, 60000) of alice")
		fires := 59_999 + lateness.Milliseconds()
		eq(t, sluicetest.Pending(), []sluice.Timer{sluice.EventTimer([]byte("count"), fires),
			sluice.EventTimer([]byte("count"), fires+60_000)}, "one timer per window end")

		sluicetest.SetWatermark(60_999)
		out, err := sluicetest.FireDue()
		check(t, err)
		if lateness == 0 {
			eq(t, values(out), []string{`alice={"count":2,"end":60000,"start":0}`, `bob={"count":1,"end":60000,"start":0}`}, "closed windows")
		} else {
			eq(t, len(out), 0, "still open for late records")
		}
		// A late record: 59000 is below the watermark.
		_, err = sluicetest.Process(sluicetest.At("bob", "late", 59_000))
		check(t, err)
		sluicetest.SetWatermark(1 << 62)
		out, err = sluicetest.FireDue()
		check(t, err)
		if lateness == 0 {
			eq(t, values(out), []string{`alice={"count":1,"end":120000,"start":60000}`}, "the late record is not counted")
		} else {
			eq(t, values(out), []string{`alice={"count":2,"end":60000,"start":0}`, `bob={"count":2,"end":60000,"start":0}`,
				`alice={"count":1,"end":120000,"start":60000}`}, "the late record is counted within the lateness")
		}
		eq(t, len(sluicetest.State()), 0, "fired windows leave no state")
		eq(t, len(sluicetest.Pending()), 0, "nor timers")
	}
	w := sluice.TumblingWindows[uint64]("count", time.Minute)
	for _, tm := range []sluice.Timer{
		sluice.EventTimer([]byte("count"), 59_999),          // fired already
		sluice.EventTimer([]byte("count\x01alice"), 59_999), // the rest after alice, fired already
		sluice.EventTimer([]byte("other"), 59_999),          // another window's
		sluice.EventTimer([]byte("count\x00alice"), 59_999), // an earlier SDK's, fired already
		sluice.ProcessingTimer([]byte("count"), 59_999),
	} {
		wins, err := w.Fire(&tm)
		check(t, err)
		eq(t, len(wins), 0, tm.String())
	}
}

func TestHoppingWindows(t *testing.T) {
	sluicetest.Reset()
	w := sluice.HoppingWindows[int]("h", 10*time.Millisecond, 5*time.Millisecond)
	n, err := w.Add([]byte("k"), 12, func(n int, _ bool) int { return n + 1 })
	check(t, err)
	eq(t, n, 2, "a record falls in size/slide windows")
	n, err = w.Add([]byte("k"), -3, func(n int, _ bool) int { return n + 1 })
	check(t, err)
	eq(t, n, 2, "negative timestamps round down")
	var starts []int64
	for _, tm := range sluicetest.Pending() {
		wins, err := w.Fire(&tm)
		check(t, err)
		for _, win := range wins {
			starts = append(starts, win.Start)
		}
	}
	eq(t, starts, []int64{-10, -5, 5, 10}, "window starts")
	sluicetest.SetWatermark(14)
	n, _ = w.Add([]byte("k"), 12, func(n int, _ bool) int { return n + 1 })
	eq(t, n, 1, "the window [10, 20) is still open, [5, 15) (its timer at 14) is not")
	_, err = sluice.HoppingWindows[int]("bad", 5*time.Millisecond, 10*time.Millisecond).Add(nil, 0, func(n int, _ bool) int { return n })
	eq(t, fmt.Sprint(err), "windows `bad`: the size and slide must be positive, and the slide at most the size", "bad slide")
}

func TestOneTimerPerWindowEndClosesEveryKeysWindowInPages(t *testing.T) {
	sluicetest.Reset()
	w := sluice.TumblingWindows[uint64]("w", 10*time.Millisecond)
	inc := func(n uint64, _ bool) uint64 { return n + 1 }
	var keys []string
	for i := range 2*sluice.WindowsPerFiring + 5 {
		keys = append(keys, fmt.Sprintf("key-%04d", i))
	}
	for _, k := range keys {
		_, err := w.Add([]byte(k), 3, inc)
		check(t, err)
		_, err = w.Add([]byte(k), 12, inc)
		check(t, err)
	}
	sluicetest.Finish()
	eq(t, sluicetest.Pending(), []sluice.Timer{sluice.EventTimer([]byte("w"), 9), sluice.EventTimer([]byte("w"), 19)},
		"one timer per window end, not per key")
	eq(t, sluicetest.Calls()["set-timer"], 2, "one set-timer per window end in a call")

	sluicetest.SetWatermark(9)
	due := sluicetest.TakeDue()
	eq(t, due, []sluice.Timer{sluice.EventTimer([]byte("w"), 9)}, "the first window end's timer is due")
	first, err := w.Fire(&due[0])
	check(t, err)
	sluicetest.Finish()
	eq(t, len(first), sluice.WindowsPerFiring, "one page")
	last := keys[sluice.WindowsPerFiring-1]
	eq(t, sluicetest.Pending(), []sluice.Timer{sluice.EventTimer([]byte("w\x01"+last), 9), sluice.EventTimer([]byte("w"), 19)},
		"the rest go on after the last key fired")
	closed := append(first, advance(t, 9, w.Fire)...)
	var want []sluice.Window[uint64]
	for _, k := range keys {
		want = append(want, sluice.Window[uint64]{Key: []byte(k), Start: 0, End: 10, Value: 1})
	}
	eq(t, closed, want, "every key's window once, in key order")
	eq(t, sluicetest.Calls()["scan-prefix"], 3, "over three firings")
	eq(t, sluicetest.Pending(), []sluice.Timer{sluice.EventTimer([]byte("w"), 19)}, "the next window end's timer")
	eq(t, len(advance(t, 19, w.Fire)), len(keys), "the next window end")
	eq(t, len(sluicetest.Pending()), 0, "no timers left")
	eq(t, len(sluicetest.State()), 0, "fired windows leave no state")
}

func TestAWindowStoredPerKeyByAnOlderSDKStillFiresOnce(t *testing.T) {
	sluicetest.Reset()
	w := sluice.TumblingWindows[uint64]("w", 10*time.Millisecond)
	// The layout of earlier SDKs: (w, key, start) and a timer per key.
	old := sluice.NewMapState[int64, uint64]("w")
	check(t, old.Set([]byte("k"), 0, 4))
	timer := sluice.EventTimer([]byte("w\x00k"), 9)
	timer.Set()
	sluicetest.Finish()
	eq(t, advance(t, 9, w.Fire), []sluice.Window[uint64]{{Key: []byte("k"), Start: 0, End: 10, Value: 4}}, "the old window")
	_, found, err := old.Get([]byte("k"), 0)
	check(t, err)
	eq(t, found, false, "its state is removed")
	wins, err := w.Fire(&timer)
	check(t, err)
	eq(t, len(wins), 0, "fires once")
}

func TestSessionWindowsMerge(t *testing.T) {
	sluicetest.Reset()
	s := sluice.NewSessionWindows[[]int]("s", 10*time.Millisecond)
	k := []byte("k")
	add := func(ts int64) bool {
		ok, err := s.Add(k, ts, func(acc []int, _ bool) []int { return append(acc, int(ts)) },
			func(a, b []int) []int { return append(a, b...) })
		check(t, err)
		return ok
	}
	add(0)
	add(25)
	sluicetest.Finish()
	eq(t, string(sluicetest.State()["s\x00k"]), `[{"start":0,"end":10,"value":[0]},{"start":25,"end":35,"value":[25]}]`, "two sessions")
	eq(t, sluicetest.Pending(), []sluice.Timer{sluice.EventTimer([]byte("s\x00k"), 9), sluice.EventTimer([]byte("s\x00k"), 34)}, "their timers")
	add(8)  // extends the first: [0, 18)
	add(17) // bridges both: [0, 35)
	sluicetest.Finish()
	eq(t, string(sluicetest.State()["s\x00k"]), `[{"start":0,"end":35,"value":[0,8,25,17]}]`, "merged")
	eq(t, sluicetest.Pending(), []sluice.Timer{sluice.EventTimer([]byte("s\x00k"), 34)}, "one timer")
	add(100)
	sluicetest.Finish() // a new call forgets unwritten changes
	sluicetest.SetWatermark(40)
	eq(t, add(20), false, "too late: its session would have fired")
	due := sluicetest.TakeDue()
	win, err := s.Fire(&due[0])
	check(t, err)
	eq(t, *win, sluice.Window[[]int]{Key: k, Start: 0, End: 35, Value: []int{0, 8, 25, 17}}, "the closed session")
	sluicetest.Finish()
	eq(t, string(sluicetest.State()["s\x00k"]), `[{"start":100,"end":110,"value":[100]}]`, "the open one stays")
	win, err = s.Fire(&due[0])
	check(t, err)
	eq(t, win == nil, true, "fires once")
	other := sluice.EventTimer([]byte("other\x00k"), 34)
	win, _ = s.Fire(&other)
	eq(t, win == nil, true, "not its timer")
}

func TestSessionLateness(t *testing.T) {
	sluicetest.Reset()
	s := sluice.NewSessionWindows[int]("s", 10*time.Millisecond).AllowedLateness(20 * time.Millisecond)
	sluicetest.SetWatermark(25)
	ok, err := s.Add([]byte("k"), 0, func(n int, _ bool) int { return n + 1 }, func(a, b int) int { return a + b })
	check(t, err)
	eq(t, ok, true, "within the lateness: fires at 10-1+20 = 29")
	eq(t, sluicetest.Pending()[0].At, int64(29), "timer")
}

func TestMigrate(t *testing.T) {
	old := sluice.NewValueState[int]("v1")
	next := sluice.NewMapState[string, int]("v2")
	var from string
	start(t, &funcs{
		process: func(*sluice.Record, *sluice.Emitter) error { return nil },
		migrate: func(module string) error {
			from = module
			return sluice.ScanPrefix([]byte("v1\x00"), func(key, value []byte) error {
				var n int
				if err := json.Unmarshal(value, &n); err != nil {
					return err
				}
				if err := next.Set(key[3:], "count", n); err != nil {
					return err
				}
				sluice.RawDelete(key)
				return nil
			})
		},
	})
	check(t, old.Set([]byte("a"), 1))
	check(t, old.Set([]byte("b"), 2))
	sluicetest.Finish()
	check(t, sluicetest.Migrate("abc123"))
	eq(t, from, "abc123", "from module")
	st := sluicetest.State()
	eq(t, len(st), 2, "old entries gone")
	eq(t, string(st["v2\x00\x00\x00\x00\x01bcount"]), "2", "rewritten")

	// A transform without Migrate keeps the state as it is.
	sluicetest.Reset()
	check(t, sluicetest.Init(func(*sluice.Config) (sluice.Transform, error) { return &windowedCount{}, nil }))
	check(t, sluicetest.Migrate("x"))
	eq(t, sluicetest.Calls()["write"], 0, "nothing written")
}

func TestConfigDurations(t *testing.T) {
	for text, want := range map[string]int64{"10s": 10_000, "1m 30s": 90_000, "500ms": 500, "2h": 7_200_000,
		"1500us": 1, "1d": 86_400_000, " 3m ": 180_000, "1m30s": 90_000} {
		ms, err := sluice.NewConfig([2]string{"d", text}).DurationMs("d", 0)
		check(t, err)
		eq(t, ms, want, text)
	}
	c := sluice.NewConfig([2]string{"d", "10 parsecs"}, [2]string{"x", "1"}, [2]string{"x", "2"})
	_, err := c.Duration("d", 0)
	if err == nil || !strings.HasPrefix(err.Error(), "config key `d`: invalid duration \"10 parsecs\"") {
		t.Fatalf("bad duration error: %v", err)
	}
	d, err := c.Duration("missing", time.Minute)
	check(t, err)
	eq(t, d, time.Minute, "default")
	v, _ := c.Get("x")
	eq(t, v, "2", "the last value wins")
	_, err = c.Require("nope")
	eq(t, fmt.Sprint(err), "missing required config key `nope`", "require")
	_, err = sluice.ParseDurationMs("10")
	if err == nil {
		t.Fatal("a number without a unit parses")
	}
}

func TestHeadersAndOutputs(t *testing.T) {
	start(t, &funcs{process: func(r *sluice.Record, out *sluice.Emitter) error {
		h, _ := r.Header("h")
		out.EmitOutput(sluice.NewOutput().WithValue(h).WithTopic("side").WithHeader("x", []byte("y")))
		return nil
	}})
	in := sluicetest.Rec("k", "v")
	in.Headers = []sluice.Header{{Key: "h", Value: []byte("1")}, {Key: "h", Value: []byte("2")}}
	out, err := sluicetest.Process(in)
	check(t, err)
	eq(t, out, []sluicetest.Output{{Value: []byte("2"), HasValue: true, Topic: "side", HasTopic: true,
		Headers: []sluice.Header{{Key: "x", Value: []byte("y")}}}}, "last header wins; no key")
}

// Emit copies its key and value: a buffer reused for every record (as
// running-count formats its counts) leaves each output as it was emitted,
// also past the emitter's first block of space.
func TestEmitCopiesWhatItIsGiven(t *testing.T) {
	var buf []byte
	start(t, &funcs{process: func(r *sluice.Record, out *sluice.Emitter) error {
		buf = append(buf[:0], r.ValueOrEmpty()...)
		out.Emit(r.KeyOrEmpty(), buf)
		buf[0] = '!'
		return nil
	}})
	var records []sluicetest.Input
	var want []string
	for i := range 1000 {
		v := fmt.Sprintf("value-%04d", i)
		records = append(records, sluicetest.Rec("k", v))
		want = append(want, "k="+v)
	}
	out, err := sluicetest.Process(records...)
	check(t, err)
	eq(t, values(out), want, "outputs")
}
