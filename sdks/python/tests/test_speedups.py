"""The C core (native/_speedups.c) against the pure-Python reference.

test.sh runs the SDK's tests twice: with ``SLUICE_PY_SPEEDUPS=0`` (pure
Python) and with the C core built for this machine's python3 and required
(``SLUICE_PY_SPEEDUPS=1``). The first test checks that each run is what it
says; the others compare the C core with the Python twins it replaces on
random and hostile input, and need the C core (they are skipped, and say
so, in the pure-Python run).
"""

import json
import os
import random
import struct
import unittest
from types import SimpleNamespace

from support import pack_batch, reset

import sluice  # noqa: E402
from sluice import Emitter, Error, Record, ValueState, testing  # noqa: E402

NEEDS_C = unittest.skipUnless(sluice.SPEEDUPS, "needs the C core (test.sh's second run builds it)")


def fields(r):
    return (r.key, r.value, list(r._headers), r.timestamp, r.topic, r.partition, r.offset)


def random_bytes(rng, text=False):
    pool = "ab\u00e9\u4e2d\U0001f600\x00" if text else None
    n = rng.choice((0, 1, 3, 40))
    if text:
        return "".join(rng.choice(pool) for _ in range(n))
    return bytes(rng.randrange(256) for _ in range(n))


def random_input(rng, i):
    headers = [SimpleNamespace(key=random_bytes(rng, True), value=random_bytes(rng)) for _ in range(rng.choice((0, 0, 1, 3)))]
    return SimpleNamespace(
        key=rng.choice((None, random_bytes(rng))),
        value=rng.choice((None, random_bytes(rng))),
        headers=headers,
        timestamp=rng.choice((None, 0, -1, 2**63 - 1, -(2**63), 1_700_000_000_000)),
        topic=rng.choice(("in", "other-\u00e9", "")),
        partition=7,
        offset=rng.choice((0, i, 2**63 - 1)),
    )


class CoreInUse(unittest.TestCase):
    def test_each_run_uses_the_core_it_says(self):
        wanted = os.environ.get("SLUICE_PY_SPEEDUPS")
        if wanted == "1":
            self.assertTrue(sluice.SPEEDUPS)
        elif wanted == "0":
            self.assertFalse(sluice.SPEEDUPS)
        bases = (Record.__bases__[0], Emitter.__bases__[0], ValueState.__bases__[0])
        if sluice.SPEEDUPS:
            c = sluice._speedups
            self.assertEqual(bases, (c.RecordBase, c.EmitterBase, c.ValueStateBase))
        else:
            self.assertEqual(bases, (sluice._RecordFields, sluice._EmitterFields, sluice._ValueStateFields))


class Records(unittest.TestCase):
    def test_a_record_copies_and_pickles_whole_on_either_base(self):
        import copy
        import pickle

        r = Record(b"k", None, [("h", b"1")], 5, "t", 3, 9)
        for twin in (copy.copy(r), copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
            self.assertEqual(fields(twin), fields(r))
        r.value = b"v"  # fields stay writable
        self.assertEqual((r.value, r.key_or_empty(), Record(None, None).key_or_empty()), (b"v", b"k", b""))


class Twins(unittest.TestCase):
    """What a user can do with the SDK's objects, the same on either base."""

    def test_emitters_and_states_copy(self):
        import copy

        out = Emitter()
        out.emit("k", "v")
        twin = copy.deepcopy(out)
        self.assertEqual((twin.records, type(twin)), (out.records, Emitter))
        self.assertIsNot(twin.records, out.records)
        state = copy.deepcopy(ValueState("s", ttl_ms=5))
        self.assertEqual((state.name, state.ttl_ms, state.key("k")), ("s", 5, b"s\x00k"))

    def test_emitter_arguments_and_records_behave_as_attributes(self):
        self.assertRaises(TypeError, Emitter, 1, 2)

        class Tagged(Emitter):
            def __init__(self, tag):
                super().__init__()
                self.records.append(tag)

        self.assertEqual(Tagged("t").records, ["t"], "a subclass's __init__ takes its own arguments")
        out = Emitter()
        del out.records
        self.assertRaises(AttributeError, out.emit, b"k", b"v")
        seen = []
        out.records = SimpleNamespace(append=seen.append)
        out.emit(b"k", "v")
        self.assertEqual(seen, [(b"k", b"v", (), None)])

    def test_update_takes_keywords(self):
        reset()
        state = ValueState("u")
        self.assertEqual(state.update(key="k", f=lambda n: 7), 7)
        self.assertEqual(state.update("k", f=lambda n: n + 1), 8)
        self.assertRaises(TypeError, state.update, "k")
        self.assertRaises(TypeError, state.update, "k", lambda n: n, g=1)

    def test_a_stored_integer_too_long_for_int_is_invalid_json_state(self):
        reset()
        sluice._store.backend.map[b"u\x00k"] = b"9" * 5000
        with self.assertRaisesRegex(Error, "state `u`: invalid JSON"):
            ValueState("u").update("k", lambda n: n)

    def test_a_topic_or_header_name_that_is_not_text_fails_the_emit(self):
        out = Emitter()
        self.assertRaisesRegex(TypeError, "topic must be str or None, not bytes", out.emit, b"k", b"v", topic=b"t")
        self.assertRaisesRegex(TypeError, "topic must be str or None, not int", out.forward, Record(b"k", b"v"), 5)
        self.assertRaisesRegex(TypeError, "header name must be str", out.emit, b"k", b"v", [(b"h", b"1")])
        self.assertEqual(out.records, [])

    def test_outputs_that_cannot_be_packed_fail_the_batch_and_write_no_state(self):
        reset()

        class Sneaky(sluice.Transform):
            def process(self, record, out):
                ValueState("s").set(record.key_or_empty(), 1)
                out.records.append((b"k", b"v", (), 5))  # past emit's checks

        world = sluice.export(Sneaky)()
        world.init([])
        with self.assertRaises(sluice.Err) as e:
            world.process_packed_out(pack_batch([SimpleNamespace(key=b"a", value=b"v", headers=[], timestamp=None, topic="t", partition=0, offset=0)]))
        self.assertTrue(e.exception.value.startswith("outputs: "), e.exception.value)
        self.assertEqual(testing.state(), {}, "nothing written")

    def test_keys_and_values_must_be_bytes_like_not_any_iterable(self):
        for bad in ([1, 2], iter([1])):
            with self.assertRaises(TypeError):
                sluice._pack_outputs([(bad, b"v", (), None)])

    def test_forwarded_headers_may_be_lists_and_bytes_like(self):
        out = Emitter()
        out.forward(Record(b"k", bytearray(b"v"), [["h", bytearray(b"1")], ("i", memoryview(b"2"))]))
        self.assertEqual(sluice._pack_outputs(out.records), sluice._pack_outputs_py(out.records))


@NEEDS_C
class Hostile(unittest.TestCase):
    """Python code the C core calls back into changes what it is reading."""

    def test_headers_that_empty_the_output_list_fail_cleanly(self):
        out = Emitter()

        class Sneaky(list):
            def __bool__(self):
                out.records.clear()
                return True

        out.records.append((b"k", b"v", Sneaky([("h", b"1")]), None))
        out.records.append((b"k", b"v", (), None))
        with self.assertRaises((RuntimeError, IndexError)):
            sluice._pack_outputs(out.records)

    def test_keys_that_empty_the_batch_fail_cleanly(self):
        records = []

        class Sneaky:
            @property
            def key(self):
                records.clear()
                return b"k"

        records += [Sneaky(), Sneaky()]
        with self.assertRaises(IndexError):
            sluice._speedups.batch_keys(records)

    def test_a_key_whose_conversion_deletes_the_prefix_fails_cleanly(self):
        state = ValueState("v")

        class Key:
            def __bytes__(self):
                del state._prefix
                return b"k"

        reset()
        with self.assertRaises((TypeError, AttributeError)):
            state.update(Key(), lambda n: 1)

    def test_a_prefix_that_is_not_bytes_is_refused(self):
        state = ValueState("p")
        state._prefix = "p\x00"
        self.assertRaises(TypeError, state.update, "k", lambda n: 1)


@NEEDS_C
class UnpackBatch(unittest.TestCase):
    def test_records_come_out_as_the_python_reference_reads_them(self):
        rng = random.Random(1)
        for n in (0, 1, 2, 17, 200):
            buf = pack_batch([random_input(rng, i) for i in range(n)])
            c, py = sluice._unpack_batch(buf), sluice._unpack_batch_py(buf)
            self.assertEqual([fields(r) for r in c], [fields(r) for r in py])
            self.assertTrue(all(type(r) is Record for r in c))

    def test_every_cut_and_every_trailing_byte_is_a_host_bug_error(self):
        rng = random.Random(2)
        buf = pack_batch([random_input(rng, i) for i in range(6)])
        for end in range(len(buf)):
            with self.assertRaises(Error, msg=f"cut at {end}") as e:
                sluice._unpack_batch(buf[:end])
            self.assertTrue(str(e.exception).startswith("host bug: malformed packed batch: "), str(e.exception))
            with self.assertRaises(Error):
                sluice._unpack_batch_py(buf[:end])
        with self.assertRaisesRegex(Error, "3 bytes after the last record"):
            sluice._unpack_batch(buf + b"abc")

    def test_hostile_counts_and_text_fail_without_allocating_for_them(self):
        bad_utf8 = struct.pack("<iI", 0, 1) + struct.pack("<I", 1) + b"\xff" + struct.pack("<I", 0)
        huge_records = struct.pack("<iII", 0, 0, 0xFFFFFFFF)
        huge_topics = struct.pack("<iI", 0, 0xFFFFFFFF)
        rec = struct.pack("<BIq", 0, 5, 0) + struct.pack("<I", 0)  # topic index 5 of 1
        bad_topic = struct.pack("<iI", 0, 1) + struct.pack("<I", 1) + b"t" + struct.pack("<I", 1) + rec
        huge_headers = struct.pack("<iI", 0, 1) + struct.pack("<I", 1) + b"t" + struct.pack("<I", 1)
        huge_headers += struct.pack("<BIq", 0, 0, 0) + struct.pack("<I", 0xFFFFFFFF)
        for buf in (bad_utf8, huge_records, huge_topics, bad_topic, huge_headers):
            with self.assertRaises(Error, msg=buf):
                sluice._unpack_batch(buf)
            with self.assertRaises(Error, msg=buf):
                sluice._unpack_batch_py(buf)


@NEEDS_C
class PackOutputs(unittest.TestCase):
    def test_outputs_pack_byte_for_byte_as_the_python_reference(self):
        rng = random.Random(3)
        out = Emitter()
        for i in range(300):
            kind = rng.randrange(5)
            key, value = rng.choice((None, random_bytes(rng), "k\u00e9", bytearray(b"ba"))), rng.choice((None, random_bytes(rng), "v"))
            if kind == 0:
                out.emit(key, value)
            elif kind == 1:
                out.emit(key, value, [(random_bytes(rng, True), rng.choice((b"x", "y", memoryview(b"z"))))], topic="t\u00e9")
            elif kind == 2:
                out.emit(value=value, key=key, topic=None, headers=())
            elif kind == 3:
                out.emit_json(key, {"i": i, "s": "\u00e9"})
            else:
                r = Record(b"k", None, [("h", b"1")], None, "in", 0, i)
                out.forward(r, topic=rng.choice((None, "out")))
        self.assertEqual(sluice._pack_outputs(out.records), sluice._pack_outputs_py(out.records))
        self.assertEqual(sluice._pack_outputs([]), sluice._pack_outputs_py([]))

    def test_emit_refuses_bad_arguments_as_python_does(self):
        out = Emitter()
        for call in (
            lambda: out.emit(b"k"),
            lambda: out.emit(b"k", b"v", (), None, 5),
            lambda: out.emit(b"k", b"v", key=b"again"),
            lambda: out.emit(b"k", b"v", colour="red"),
            lambda: out.emit(b"k", 5.0),
        ):
            self.assertRaises(TypeError, call)
        self.assertEqual(out.records, [], "a refused emit writes nothing")

    def test_malformed_outputs_fail_with_a_message_not_a_crash(self):
        for records in ([(b"k",)], [(1, b"v", (), None)], [(b"k", b"v", [("h", 1)], None)], [(b"k", b"v", (), b"t")], ["x"]):
            self.assertRaises(TypeError, sluice._pack_outputs, records)


@NEEDS_C
class PackedStateCalls(unittest.TestCase):
    """The cache reads and writes the host through get-many-packed and
    write-packed; the in-memory host reads those in Python."""

    def test_prefetch_and_write_back_go_packed_and_arrive_whole(self):
        reset()
        backend = sluice._store.backend
        backend.map.update({b"v\x00a": b"1", b"v\x00\xff": b"", b"v\x00": b'"e"'})
        state, calls = ValueState("v"), []
        for name in ("get_many_packed", "write_packed"):
            real = getattr(backend, name)
            setattr(backend, name, lambda packed, real=real, name=name: (calls.append(name), real(packed))[1])
        state.prefetch([b"a", b"\xff", "", "missing"])
        cached = [sluice._store.read(b"v\x00" + k) for k in (b"a", b"\xff", b"", b"missing")]
        self.assertEqual(cached, [b"1", b"", b'"e"', None], "an empty value is not an absent one")
        self.assertEqual(backend.calls["get"], 0, "everything came from the one prefetch")
        state.set("a", 2)
        state.clear("")
        state.set("new", [1])
        testing.finish()
        self.assertEqual(calls, ["get_many_packed", "write_packed"])
        self.assertEqual(backend.map, {b"v\x00a": b"2", b"v\x00\xff": b"", b"v\x00new": b"[1]"})

    def test_a_malformed_answer_is_a_host_bug_error(self):
        u32 = struct.Struct("<I").pack
        for answer in (u32(1), u32(2) + b"\x00", u32(1) + b"\x02", u32(1) + b"\x01" + u32(5) + b"abc", u32(1) + b"\x00!"):
            reset()
            sluice._store.backend.get_many_packed = lambda packed, a=answer: a
            with self.assertRaisesRegex(Error, "host bug: malformed state.get-many-packed answer", msg=answer):
                ValueState("v").prefetch(["k"])


@NEEDS_C
class CacheMisses(unittest.TestCase):
    """What a prefetch asks for, and what it caches, in C against the twins."""

    def test_missing_and_fill_match_the_python_reference(self):
        rng = random.Random(7)
        pool = [b"", b"a", b"b", b"\x00", b"k" * 40, b"\xff\xfe"]
        for _ in range(300):
            keys = [rng.choice(pool) for _ in range(rng.randrange(12))]
            values = {k: rng.choice((None, b"1")) for k in pool if rng.random() < 0.4}
            want = sluice._missing_py(keys, dict(values))
            self.assertEqual(sluice._speedups.missing(keys, dict(values)), want)
            got = [rng.choice((None, b"", b"12345")) for _ in want]
            py, c = dict(values), dict(values)
            self.assertEqual(sluice._speedups.fill(c, want, got), sluice._fill_py(py, want, got))
            self.assertEqual(c, py)

    def test_bad_arguments_fail_cleanly(self):
        c = sluice._speedups
        self.assertRaises(TypeError, c.missing, (b"a",), {})
        self.assertRaises(TypeError, c.missing, [b"a"], [])
        self.assertRaises(TypeError, c.missing, [[1]], {})  # unhashable
        self.assertRaisesRegex(ValueError, "1 values for 2 keys", c.fill, {}, [b"a", b"b"], [None])
        for keys, got in (([b"a"], ["text"]), (["a"], [b"1"]), ([b"a"], [1])):
            values = {}
            self.assertRaises(TypeError, c.fill, values, keys, got)
            self.assertEqual(values, {}, "nothing cached from a refused entry")

    def test_a_key_that_empties_the_list_ends_the_scan_as_in_python(self):
        def sneaky_keys():
            keys = []

            class Sneaky(bytes):
                def __hash__(self):
                    keys.clear()
                    return 1

            keys.extend([Sneaky(b"a"), b"b", b"c"])
            return keys

        self.assertEqual(sluice._speedups.missing(sneaky_keys(), {}), [b"a"])
        self.assertEqual(sluice._missing_py(sneaky_keys(), {}), [b"a"])


@NEEDS_C
class Update(unittest.TestCase):
    """``ValueState``'s ``get``, ``set`` and ``update`` in C against
    ``_ValueStateFields``': the same operations from the same state leave
    the same cache, the same dirty list and return the same values."""

    VALUES = (None, 0, 1, 41, 2**70, -3, True, "s\u00e9", [1, {"a": None}], 1.5)

    def run_ops(self, update, seed):
        reset()
        rng = random.Random(seed)
        state = ValueState("v")
        store = sluice._store
        backend = store.backend
        for k in range(6):  # some keys stored before the call, some odd
            backend.map[b"v\x00" + str(k).encode()] = rng.choice((b"7", b"0", b"12345678901234567890123", b'"x"', b"[1]"))
        returned = []
        for _ in range(200):
            key = rng.choice((str(rng.randrange(8)), str(rng.randrange(8)).encode()))
            target = rng.choice(self.VALUES)
            f = (lambda n: n + 1 if type(n) is int else 1) if rng.random() < 0.5 else (lambda n, t=target: t)
            returned.append(update(state, key, f))
            if rng.random() < 0.1:
                store.flush()
        snapshot = (dict(store.values), list(store.dirty), returned)
        store.finish()
        return snapshot, dict(backend.map)

    def test_update_matches_the_python_reference(self):
        for seed in range(20):
            c = self.run_ops(lambda s, k, f: s.update(k, f), seed)
            py = self.run_ops(sluice._ValueStateFields.update, seed)
            self.assertEqual(c, py, f"seed {seed}")

    @staticmethod
    def get_and_set(get, set_):
        """An update made of ``get`` and ``set``; returns both results."""

        def update(state, key, f):
            current = get(state, key, "absent")
            new = f(None if current == "absent" else current)
            return (current, new, set_(state, key, new))

        return update

    def test_get_and_set_match_the_python_reference(self):
        twin = sluice._ValueStateFields
        for seed in range(20):
            c = self.run_ops(self.get_and_set(lambda s, k, d: s.get(k, d), lambda s, k, v: s.set(k, v)), seed)
            py = self.run_ops(self.get_and_set(twin.get, twin.set), seed)
            self.assertEqual(c, py, f"seed {seed}")

    def test_get_and_set_take_keywords_and_check_their_arguments(self):
        reset()
        state = ValueState("v")
        state.set(key="k", value=[1])
        self.assertEqual((state.get(key="k"), state.get("none", default=5), state.get("none")), ([1], 5, None))
        self.assertRaises(TypeError, state.get)
        self.assertRaises(TypeError, state.set, "k")
        self.assertRaises(TypeError, state.get, "k", 1, 2)
        self.assertRaises(TypeError, state.set, "k", 1, value=2)
        self.assertRaises(TypeError, state.get, "k", other=1)
        self.assertRaises(TypeError, state.set, 5, 1)  # a key must be bytes or str
        self.assertRaises(TypeError, state.set, "k", object())  # not JSON
        self.assertEqual(list(sluice._store.dirty), [b"v\x00k"], "a refused set writes nothing")

    def test_stored_text_that_is_not_json_fails_alike(self):
        for raw in (b"007", b"{", b"\xff"):
            for update in (lambda s, k, f: s.update(k, f), sluice._ValueStateFields.update):
                reset()
                sluice._store.backend.map[b"v\x00k"] = raw
                with self.assertRaisesRegex(Error, "state `v`: invalid JSON"):
                    update(ValueState("v"), "k", lambda n: n)
            for get in (lambda s, k: s.get(k), sluice._ValueStateFields.get):
                reset()
                sluice._store.backend.map[b"v\x00k"] = raw
                with self.assertRaisesRegex(Error, "state `v`: invalid JSON"):
                    get(ValueState("v"), "k")

    def test_an_exception_in_f_leaves_the_cache_unwritten(self):
        reset()
        state = ValueState("v")
        state.set("k", 1)
        testing.finish()

        def boom(n):
            raise ValueError("no")

        self.assertRaises(ValueError, state.update, "k", boom)
        self.assertEqual(list(sluice._store.dirty), [])
        self.assertEqual(state.get("k"), 1)

    def test_a_time_to_live_takes_the_python_path(self):
        reset()
        state = ValueState("t", ttl_ms=1000)
        calls = []
        real = ValueState._update_ttl
        ValueState._update_ttl = lambda self, key, f: (calls.append(key), real(self, key, f))[1]
        try:
            self.assertEqual(state.update("k", lambda n: (n or 0) + 1), 1)
            self.assertEqual(state.update("k", lambda n: (n or 0) + 1), 2)
        finally:
            ValueState._update_ttl = real
        self.assertEqual((calls, state.get("k")), (["k", "k"], 2))

    def test_a_time_to_live_takes_the_python_path_for_get_and_set_too(self):
        reset()
        state = ValueState("t", ttl_ms=1000)
        calls = []
        real = (ValueState._get_ttl, ValueState._set_ttl)
        ValueState._get_ttl = lambda self, key, default: (calls.append("get"), real[0](self, key, default))[1]
        ValueState._set_ttl = lambda self, key, value: (calls.append("set"), real[1](self, key, value))[1]
        try:
            self.assertEqual(state.get("k", "none"), "none")
            state.set("k", 3)
            self.assertEqual(state.get("k"), 3)
        finally:
            ValueState._get_ttl, ValueState._set_ttl = real
        self.assertEqual(calls, ["get", "set", "get"])
        self.assertEqual(json.loads(sluice._store.values[b"t\x00k"])[1], 3, "stored as [expires_at_ms, value]")


if __name__ == "__main__":
    unittest.main()
