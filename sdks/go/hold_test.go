package sluice

// Held state (world `cached`): once the host calls `hold-state`, a shard's
// cache stays from one packed batch of the shard to the next, within the
// bytes the host allows, until its `flush-state` for the shard. Checked
// against simulated hosts that scope state to the shard served.

import (
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"sluice.dev/sdk/go/internal/hostapi"
	"sluice.dev/sdk/go/internal/simhost"
)

var (
	holdCounts = NewValueState[uint64]("count")
	holdLast   = NewMapState[string, string]("last")
	holdPushed = NewListState[uint64]("pushed")
)

// counting is a running count that also writes a map entry, pushes to a
// list every third record of a key and scans the map every fourth (a scan
// flushes the call's writes first).
type counting struct{}

func (counting) BeginBatch(b *Batch) error { return holdCounts.Prefetch(b.Keys()) }

func (counting) Process(r *Record, out *Emitter) error {
	key := r.KeyOrEmpty()
	value, _ := r.Value()
	if string(value) == "fail" {
		return errors.New("asked to fail")
	}
	n, err := holdCounts.Update(key, func(n uint64, _ bool) uint64 { return n + 1 })
	if err != nil {
		return err
	}
	if err := holdLast.Set(key, "v", string(value)); err != nil {
		return err
	}
	if n%3 == 0 {
		if err := holdPushed.Push(key, n); err != nil {
			return err
		}
	}
	if n%4 == 0 {
		if entries, err := holdLast.Entries(key); err != nil || len(entries) != 1 {
			return fmt.Errorf("the scan saw %d entries (%v)", len(entries), err)
		}
	}
	out.Emit(key, []byte(strconv.FormatUint(n, 10)))
	return nil
}

// holdingHost drives counting as a host does: packed batches whose state
// calls reach only their shard's store; with hold, hold-state after init
// and flush-state on request.
type holdingHost struct {
	t      *testing.T
	shards map[uint32]*simhost.Host
	held   map[uint32]bool
	hold   bool
	offset int64
}

func newHoldingHost(t *testing.T, holding bool, maxBytes uint64) *holdingHost {
	t.Helper()
	h := &holdingHost{t: t, shards: map[uint32]*simhost.Host{}, held: map[uint32]bool{}, hold: holding}
	previousFactory, previousHost := factory, hostapi.Current
	t.Cleanup(func() {
		factory, hostapi.Current, instance = previousFactory, previousHost, nil
		dropCaches()
		resetHold()
	})
	factory = func(*Config) (Transform, error) { return counting{}, nil }
	h.serve(0)
	if err := initExport(nil); err != nil {
		t.Fatal(err)
	}
	if holding {
		holdState(maxBytes)
	}
	return h
}

// resetHold forgets hold-state, as a new instance starts.
func resetHold() { hold.max = 0 }

func (h *holdingHost) serve(shard uint32) *simhost.Host {
	if h.shards[shard] == nil {
		h.shards[shard] = simhost.New()
	}
	hostapi.Current = h.shards[shard]
	return h.shards[shard]
}

func (h *holdingHost) batch(shard uint32, keys string, value string) string {
	records := make([]hostapi.InputRecord, len(keys))
	for i := range keys {
		records[i] = hostapi.InputRecord{
			Key: []byte{keys[i]}, HasKey: true, Value: []byte(value), HasValue: true,
			Topic: "in", Partition: int32(shard), Offset: h.offset,
		}
		h.offset++
	}
	h.serve(shard)
	h.held[shard] = h.hold
	packed, err := processPacked(records, nil, true)
	if err != nil {
		return "ERR " + err.Error()
	}
	outs, err := hostapi.UnpackOutputs(packed)
	if err != nil {
		h.t.Fatal(err)
	}
	var b strings.Builder
	for _, o := range outs {
		fmt.Fprintf(&b, "%s=%s ", o.Key, o.Value)
	}
	return b.String()
}

func (h *holdingHost) flush(shard uint32) {
	h.serve(shard)
	delete(h.held, shard)
	flushState(shard)
}

func (h *holdingHost) flushAll() {
	for shard := range uint32(3) {
		if h.held[shard] {
			h.flush(shard)
		}
	}
}

// stores is every shard's written-back state, empty shards left out.
func (h *holdingHost) stores() map[uint32]map[string]string {
	out := map[uint32]map[string]string{}
	for shard, sim := range h.shards {
		if len(sim.State) == 0 {
			continue
		}
		out[shard] = map[string]string{}
		for k, v := range sim.State {
			out[shard][k] = string(v)
		}
	}
	return out
}

func (h *holdingHost) writes() int {
	n := 0
	for _, sim := range h.shards {
		n += sim.Calls["write"]
	}
	return n
}

func TestAHeldShardReachesTheHostOnlyWhenAskedFor(t *testing.T) {
	h := newHoldingHost(t, true, 1<<20)
	got := []string{h.batch(0, "aba", "x"), h.batch(0, "ac", "x"), h.batch(0, "bb", "x")}
	if want := []string{"a=1 b=1 a=2 ", "a=3 c=1 ", "b=2 b=3 "}; !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	if len(h.stores()) != 0 || h.writes() != 0 {
		t.Fatalf("written back before flush-state: %v", h.stores())
	}
	if n := h.shards[0].Calls["get-many"]; n != 2 {
		t.Fatalf("%d get-many calls: each key's first batch asks the host, later ones hit the cache", n)
	}
	h.flush(0)
	if h.writes() != 1 {
		t.Fatalf("%d writes for the three batches, want 1", h.writes())
	}
	if s := h.stores()[0]; s["count\x00a"] != "3" || s["count\x00b"] != "3" || s["pushed\x00a"] != "[3]" {
		t.Fatalf("stored %v", s)
	}
}

func TestShardsAreHeldApartAndFlushedAlone(t *testing.T) {
	h := newHoldingHost(t, true, 1<<20)
	for _, step := range []struct {
		shard      uint32
		keys, want string
	}{{0, "k", "k=1 "}, {1, "kk", "k=1 k=2 "}, {0, "k", "k=2 "}} {
		if got := h.batch(step.shard, step.keys, "x"); got != step.want {
			t.Fatalf("shard %d: %q, want %q", step.shard, got, step.want)
		}
	}
	h.flush(1)
	if s := h.stores(); len(s) != 1 || s[1]["count\x00k"] != "2" {
		t.Fatalf("only shard 1 is written, with k=2: %v", s)
	}
	if got := h.batch(1, "k", "x"); got != "k=3 " {
		t.Fatalf("shard 1 read back from the host: %q", got)
	}
	if got := h.batch(0, "k", "x"); got != "k=3 " {
		t.Fatalf("shard 0 still held: %q", got)
	}
	h.flushAll()
	if s := h.stores(); s[0]["count\x00k"] != "3" || s[1]["count\x00k"] != "3" {
		t.Fatalf("stored %v", s)
	}
}

func TestOverItsBytesAShardIsWrittenBackAfterTheBatch(t *testing.T) {
	h := newHoldingHost(t, true, 1)
	h.batch(0, "a", "x")
	if s := h.stores()[0]; s["count\x00a"] != "1" {
		t.Fatalf("not written back at once: %v", s)
	}
	if got := h.batch(0, "a", "x"); got != "a=2 " {
		t.Fatalf("%q", got)
	}
	h.flush(0)
	if h.writes() != 2 {
		t.Fatalf("%d writes, want 2", h.writes())
	}
}

func TestAFailedBatchDropsWhatEveryShardHeld(t *testing.T) {
	h := newHoldingHost(t, true, 1<<20)
	h.batch(0, "a", "x")
	h.batch(1, "a", "x")
	if got := h.batch(1, "ab", "fail"); !strings.Contains(got, "asked to fail") {
		t.Fatalf("%q", got)
	}
	if len(cache.slots) != 0 || len(hold.parked) != 0 || hold.holding {
		t.Fatal("something is still cached")
	}
	h.flushAll()
	if s := h.stores(); len(s) != 0 {
		t.Fatalf("the host rolls the epoch back; nothing held may reach it: %v", s)
	}
}

func TestTimersAndUnheldCallsLeaveAHeldShardAlone(t *testing.T) {
	h := newHoldingHost(t, true, 1<<20)
	h.batch(0, "aa", "x")
	if _, err := onTimersExport(nil); err != nil {
		t.Fatal(err)
	}
	if err := migrateExport("old"); err != nil {
		t.Fatal(err)
	}
	if len(h.stores()) != 0 {
		t.Fatalf("written back: %v", h.stores())
	}
	if got := h.batch(0, "a", "x"); got != "a=3 " {
		t.Fatalf("%q", got)
	}
	h.flush(0)
	if s := h.stores()[0]; s["count\x00a"] != "3" {
		t.Fatalf("stored %v", s)
	}
}

// What is held counts against the budget over all shards: with room for
// one shard's cache and not two, a second shard's batch is written back at
// once while the first stays held.
func TestAShardOverWhatIsLeftIsWrittenBackWhileAnotherStaysHeld(t *testing.T) {
	h := newHoldingHost(t, true, 1<<20)
	h.batch(0, "a", "x")
	holdState(uint64(cache.footprint() + 64))
	if got := h.batch(1, "a", "x"); got != "a=1 " {
		t.Fatalf("%q", got)
	}
	if s := h.stores(); len(s) != 1 || s[1]["count\x00a"] != "1" {
		t.Fatalf("shard 1 must be written back at once, shard 0 stay held: %v", s)
	}
	h.flush(0)
	if s := h.stores(); s[0]["count\x00a"] != "1" {
		t.Fatalf("stored %v", s)
	}
}

// onlyCounting counts its records' keys, prefetched.
type onlyCounting struct{}

func (onlyCounting) BeginBatch(b *Batch) error { return holdCounts.Prefetch(b.Keys()) }

func (onlyCounting) Process(r *Record, _ *Emitter) error {
	_, err := holdCounts.Update(r.KeyOrEmpty(), func(n uint64, _ bool) uint64 { return n + 1 })
	return err
}

// liveHeap is the heap in use after collecting.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// What a held cache keeps alive stays near what it counts, however its
// keys and values came in: a new key per batch (its slice keeps the
// batch's prefetch buffer), a hot key rewritten while cold ones pin the
// space's blocks, and many shards of one key each.
func TestAHeldCacheKeepsNoMoreAliveThanItCounts(t *testing.T) {
	for _, shape := range []string{"a new key per batch", "one hot key and many cold ones", "many shards"} {
		h := newHoldingHost(t, true, 1<<40)
		factory = func(*Config) (Transform, error) { return onlyCounting{}, nil }
		if err := initExport(nil); err != nil {
			t.Fatal(err)
		}
		holdState(1 << 40)
		sim := simhost.New()
		before := liveHeap()
		for b := range 1000 {
			keys := make([]hostapi.InputRecord, 0, 200)
			shard := uint32(0)
			for i := range 200 {
				key := fmt.Sprintf("user-%06d", i)
				switch {
				case shape == "a new key per batch" && i == 199:
					key = fmt.Sprintf("new-%07d", b)
				case shape == "one hot key and many cold ones":
					key = "hot"
					if i == 199 {
						key = fmt.Sprintf("cold-%06d", b)
					}
				case shape == "many shards":
					shard = uint32(b)
					key = "a"
				}
				keys = append(keys, hostapi.InputRecord{
					Key: []byte(key), HasKey: true, Value: []byte("x"), HasValue: true,
					Topic: "in", Partition: int32(shard), Offset: h.offset,
				})
				h.offset++
			}
			hostapi.Current = sim // one store for every shard: nothing is written back here
			if _, err := processPacked(keys, nil, true); err != nil {
				t.Fatal(err)
			}
		}
		grown := int64(liveHeap()) - int64(before)
		counted := int64(cache.footprint() + hold.parkedBytes)
		t.Logf("%s: counted %d bytes, the heap grew by %d", shape, counted, grown)
		// An eighth for the allocator's size classes, which round a
		// buffer up past its capacity; 64 KiB for what is not the
		// cache's (the host, the test's own).
		if grown > counted+counted/8+64<<10 {
			t.Errorf("%s: the heap grew by %d bytes, the cache counts %d", shape, grown, counted)
		}
	}
}

// Random batches and flushes over three shards, held within budgets from
// one byte to all, end with the stores and outputs of a store that holds
// nothing; and the parked shards' sizes add up.
func TestRandomCallsEndAsAStoreThatHoldsNothingDoes(t *testing.T) {
	for round := range 25 {
		budget := []uint64{1, 2_000, 20_000, 1 << 40}[round%4]
		play := func(holding bool) ([]string, map[uint32]map[string]string) {
			rng := rand.New(rand.NewSource(int64(round)))
			h := newHoldingHost(t, holding, budget)
			var outs []string
			for range 60 {
				shard := uint32(rng.Intn(3))
				if rng.Intn(100) < 15 {
					if holding {
						h.flush(shard)
					}
					continue
				}
				keys := make([]byte, 1+rng.Intn(8))
				for i := range keys {
					keys[i] = byte('a' + rng.Intn(8))
				}
				outs = append(outs, h.batch(shard, string(keys), strings.Repeat("v", rng.Intn(50))))
				total := 0
				for _, parked := range parkedCaches() {
					total += parked.footprint()
				}
				if total != hold.parkedBytes {
					t.Fatalf("round %d: the parked shards counted %d bytes, take %d", round, hold.parkedBytes, total)
				}
			}
			h.flushAll()
			return outs, h.stores()
		}
		heldOuts, heldStores := play(true)
		outs, stores := play(false)
		if !reflect.DeepEqual(heldOuts, outs) {
			t.Fatalf("round %d: outputs differ", round)
		}
		if !reflect.DeepEqual(heldStores, stores) {
			t.Fatalf("round %d, budget %d: stores differ:\nheld   %v\nunheld %v", round, budget, heldStores, stores)
		}
	}
}

// parkedCaches is a copy of the parked caches.
func parkedCaches() map[uint32]stateCache { return maps.Clone(hold.parked) }

// rawSetting writes each record's value under "raw 0x00 key" from one
// buffer it reuses from record to record.
type rawSetting struct{ buf []byte }

func (r *rawSetting) Process(rec *Record, _ *Emitter) error {
	v, _ := rec.Value()
	r.buf = append(r.buf[:0], v...)
	RawSet(append([]byte("raw\x00"), rec.KeyOrEmpty()...), r.buf)
	return nil
}

// A value given to RawSet is the caller's again once it returns, though
// the cache may hold the write for batches.
func TestRawSetKeepsACopy(t *testing.T) {
	h := newHoldingHost(t, true, 1<<20)
	factory = func(*Config) (Transform, error) { return &rawSetting{}, nil }
	if err := initExport(nil); err != nil {
		t.Fatal(err)
	}
	holdState(1 << 20)
	h.batch(0, "a", "1")
	h.batch(0, "b", "2")
	h.flush(0)
	if s := h.stores()[0]; s["raw\x00a"] != "1" || s["raw\x00b"] != "2" {
		t.Fatalf("stored %v, want a=1, b=2", s)
	}
}
