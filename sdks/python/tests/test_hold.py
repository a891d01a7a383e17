"""Held state (world `cached`): once the host calls ``hold-state``, a shard's
cache stays from one batch of the shard to the next, within the bytes the host
allows, until the host's ``flush-state`` for the shard. Checked against a
host simulation that scopes state calls to the shard being served, as
host/src/runtime/instance.rs does."""

import random
import unittest
from types import SimpleNamespace

from support import pack_batch, reset, unpack_outputs  # first: it puts the SDK under test on the path

import sluice
from sluice import Err, ListState, MapState, Transform, ValueState, export, testing

COUNTS = ValueState("count")  # update: the C core's writes when it runs
LAST = MapState("last")  # set: the Python store's writes on both paths
SEEN = ListState("seen")


class Counting(Transform):
    def begin_batch(self, batch):
        COUNTS.prefetch(batch.keys())

    def process(self, record, out):
        key = record.key_or_empty()
        if record.value == b"fail":
            raise ValueError("asked to fail")
        n = COUNTS.update(key, lambda n: (n or 0) + 1)
        LAST.set(key, "v", record.value.decode())
        if n % 3 == 0:
            SEEN.push(key, n)
        if n % 4 == 0:  # a scan: the call's writes go to the host first
            assert LAST.entries(key) == [("v", record.value.decode())]
        out.emit(key, str(n))


World = export(Counting)


class ShardedMemory:
    """The host's state: one store per shard, the calls going to the shard
    the host serves (``shard``), as the host scopes a call's state calls."""

    def __init__(self):
        self.shards = {}
        self.shard = None

    def _scoped(self):
        assert self.shard is not None, "a state call outside a shard's call"
        return self.shards.setdefault(self.shard, sluice._Memory())

    def __getattr__(self, name):
        return getattr(self._scoped(), name)

    def maps(self):
        return {s: dict(m.map) for s, m in self.shards.items() if m.map}

    def writes(self):
        return sum(m.calls["write"] for m in self.shards.values())


def record(key, value, partition, offset):
    return SimpleNamespace(key=key, value=value, headers=[], timestamp=None, topic="in", partition=partition, offset=offset)


class Host:
    """Drives ``World`` as a host does: packed batches scoped to their shard;
    with ``max_bytes``, hold-state after init and flush-state on request."""

    def __init__(self, max_bytes=None):
        reset()
        self.memory = ShardedMemory()
        sluice._store.backend = self.memory
        self.world = World()
        self.world.init([])
        self.held = set()
        if max_bytes is not None:
            self.world.hold_state(max_bytes)
        self.holding = max_bytes is not None
        self.offset = 0

    def batch(self, shard, pairs):
        records = [record(k, v, shard, self.offset + i) for i, (k, v) in enumerate(pairs)]
        self.offset += len(records)
        self.memory.shard = shard
        if self.holding:
            self.held.add(shard)
        try:
            return [(r.key, r.value) for r in unpack_outputs(self.world.process_packed_out(pack_batch(records)))]
        finally:
            self.memory.shard = None

    def flush(self, shard):
        self.held.discard(shard)
        self.memory.shard = shard
        try:
            self.world.flush_state(shard)
        finally:
            self.memory.shard = None

    def flush_all(self):
        for shard in sorted(self.held):
            self.flush(shard)


def pairs(keys, value=b"x"):
    return [(k, value) for k in keys]


def play(max_bytes, script):
    """Runs ``script`` (``("batch", shard, pairs)`` and ``("flush", shard)``
    steps, then a flush of every held shard) on a new host; returns the
    host and each batch's outputs. The SDK's store is one per process, so
    hosts run one after another."""
    h = Host(max_bytes)
    outputs = []
    for step in script:
        if step[0] == "batch":
            outputs.append(h.batch(step[1], step[2]))
        else:
            h.flush(step[1])
    h.flush_all()
    return h, outputs


class HoldTests(unittest.TestCase):
    def test_a_held_shard_reaches_the_host_only_when_asked_for(self):
        h = Host(1 << 20)
        batches = [pairs([b"a", b"b", b"a"]), pairs([b"a", b"c"]), pairs([b"b", b"b"])]
        out_held = [h.batch(0, b) for b in batches]
        self.assertEqual(h.memory.maps(), {}, "nothing written back before flush-state")
        self.assertEqual(h.memory.writes(), 0)
        h.flush(0)
        self.assertEqual(h.memory.writes(), 1, "one state.write for the three batches")
        self.assertEqual(sluice._store.values, {}, "a flushed shard is forgotten")
        # Fetched once: each key's first batch asks the host, later ones hit the cache.
        self.assertEqual(h.memory.shards[0].calls["get_many"], 2)
        self.assertEqual(out_held[2], [(b"b", b"2"), (b"b", b"3")])
        unheld, out_unheld = play(None, [("batch", 0, b) for b in batches])
        self.assertEqual(out_held, out_unheld)
        self.assertEqual(h.memory.maps(), unheld.memory.maps())

    def test_shards_are_held_apart_and_flushed_alone(self):
        h = Host(1 << 20)
        self.assertEqual(h.batch(0, pairs([b"k"])), [(b"k", b"1")])
        self.assertEqual(h.batch(1, pairs([b"k", b"k"])), [(b"k", b"1"), (b"k", b"2")])
        self.assertEqual(h.batch(0, pairs([b"k"])), [(b"k", b"2")])
        h.flush(1)
        self.assertEqual(set(h.memory.maps()), {1}, "only shard 1 is written")
        self.assertEqual(h.memory.maps()[1][b"count\x00k"], b"2")
        self.assertEqual(h.batch(1, pairs([b"k"])), [(b"k", b"3")], "read back from the host")
        self.assertEqual(h.batch(0, pairs([b"k"])), [(b"k", b"3")], "still held")
        h.flush_all()
        self.assertEqual({s: m[b"count\x00k"] for s, m in h.memory.maps().items()}, {0: b"3", 1: b"3"})

    def test_over_its_bytes_a_shard_is_written_back_after_the_batch(self):
        h = Host(1)
        h.batch(0, pairs([b"a"]))
        self.assertEqual(h.memory.maps()[0][b"count\x00a"], b"1", "written back at once")
        self.assertEqual(sluice._store.values, {})
        self.assertEqual(h.batch(0, pairs([b"a"])), [(b"a", b"2")])
        h.flush(0)  # nothing held: a flush-state writes nothing more
        self.assertEqual(h.memory.writes(), 2)

    def test_a_shard_over_what_is_left_is_written_back_while_another_stays_held(self):
        # With room for one shard's cache and not two, the second shard's
        # batch is written back at once and the first stays held.
        h = Host(1 << 20)
        h.batch(0, pairs([b"a"]))
        sluice._store._count_c_writes()
        h.world.hold_state(sluice._store.bytes + 2 * sluice._CACHE_BYTES + 64)
        self.assertEqual(h.batch(1, pairs([b"a"])), [(b"a", b"1")])
        self.assertEqual(set(h.memory.maps()), {1}, "shard 1 at once; shard 0 still held")
        h.flush(0)
        self.assertEqual(h.memory.maps()[0][b"count\x00a"], b"1")

    def test_a_failed_batch_drops_what_every_shard_held(self):
        h = Host(1 << 20)
        h.batch(0, pairs([b"a"]))
        h.batch(1, pairs([b"a"]))
        with self.assertRaisesRegex(Err, "asked to fail"):
            h.batch(1, [(b"a", b"x"), (b"b", b"fail")])
        self.assertEqual((sluice._store.values, sluice._store.parked, sluice._store.holding), ({}, {}, None))
        h.flush_all()
        self.assertEqual(h.memory.maps(), {}, "the host rolls the epoch back; nothing held reaches it")

    def test_timers_and_unheld_calls_leave_a_held_shard_alone(self):
        h = Host(1 << 20)
        h.batch(0, pairs([b"a", b"a"]))
        h.memory.shard = 0  # the host flushed shard 0 before; another call of it
        self.assertEqual(h.world.on_timers([]), [])
        h.memory.shard = None
        self.assertEqual(h.memory.maps(), {})
        self.assertEqual(h.batch(0, pairs([b"a"])), [(b"a", b"3")])
        h.flush(0)
        self.assertEqual(h.memory.maps()[0][b"count\x00a"], b"3")

    def test_the_cache_counts_the_bytes_it_holds(self):
        h = Host(1 << 20)
        store = sluice._store
        h.batch(0, pairs([b"a", b"bb", b"a"], b"12345"))
        h.batch(1, pairs([b"a" * 40], b"v" * 300))
        h.batch(0, pairs([b"ccc"] * 12, b""))  # values shrink and grow

        def size(values):
            return sum(sluice._ENTRY_BYTES + len(k) + len(v or b"") for k, v in values.items())

        store._count_c_writes()
        self.assertEqual(store.bytes, size(store.values))
        self.assertEqual(store.parked[1][2], size(store.parked[1][0]))
        if sluice.SPEEDUPS:
            self.assertEqual(sluice._speedups.ENTRY_BYTES, sluice._ENTRY_BYTES)

    def test_random_calls_end_as_a_store_that_holds_nothing_does(self):
        for seed in range(25):
            rng = random.Random(seed)
            budget = rng.choice([1, 2_000, 20_000, 1 << 30])
            script = []
            for _ in range(60):
                shard = rng.randrange(3)
                if rng.random() < 0.15:
                    script.append(("flush", shard))
                    continue
                keys = [bytes([97 + rng.randrange(8)]) for _ in range(rng.randrange(1, 9))]
                script.append(("batch", shard, pairs(keys, b"v" * rng.randrange(50))))
            held, out_held = play(budget, script)
            unheld, out_unheld = play(None, script)
            self.assertEqual(out_held, out_unheld, f"seed {seed}")
            self.assertEqual(held.memory.maps(), unheld.memory.maps(), f"seed {seed}, budget {budget}")

    def tearDown(self):
        testing.reset_state()


if __name__ == "__main__":
    unittest.main()
