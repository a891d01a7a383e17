"""Tests of the Python SDK outside a component (plain CPython >= 3.9, where
``sluice`` runs against its in-memory state store). Run::

    python3 -B -m unittest discover -s sdks/python/tests

- the running-count example against its golden testdata, at several batch
  sizes, and the number of host calls per batch;
- the state key and value layout shared with the Rust SDK;
- errors become result strings with the record's position, and a failed
  batch leaves no state behind.
"""

import json
import unittest
from types import SimpleNamespace

from support import ROOT, backend, input_record, load_world, output_line, pack_batch, process, reset

import sluice  # noqa: E402
from sluice import Config, Err, Error, Transform, ValueState, export  # noqa: E402

EXAMPLE = ROOT / "examples" / "python" / "running-count"


def run_example(batch_size, packed=False):
    reset()
    world = load_world(EXAMPLE)
    lines = (EXAMPLE / "testdata" / "input.jsonl").read_text().splitlines()
    world.init([])
    out, batches = [], 0
    for i in range(0, len(lines), batch_size):
        batch = [input_record(l, i + j) for j, l in enumerate(lines[i : i + batch_size])]
        out += [output_line(r) for r in process(world, batch, packed)]
        batches += 1
    return out, batches


SEEN = ValueState("seen")


class Failing(Transform):
    def __init__(self, config):
        self.fail_on = config.get("fail_on")

    def begin_batch(self, batch):
        SEEN.prefetch(batch.keys())

    def process(self, record, out):
        n = SEEN.update(record.key_or_empty(), lambda n: (n or 0) + 1)
        if record.value_str() == self.fail_on:
            raise Error("asked to fail")
        if record.value_str() == "type":
            {}["missing"]
        out.emit_json(record.key, {"n": n, "s": "é\n"}, headers=[("h", "1")], topic="t")


class Forward(Transform):
    """Forwards each record, then emits one naming a topic, with headers."""

    def process(self, record, out):
        out.forward(record)
        out.emit(None, None, headers=[("seen", record.key_or_empty()), ("offset", str(record.offset))], topic="audit")


def shaped(outputs):
    return [(r.key, r.value, [(h.key, h.value) for h in r.headers], r.topic) for r in outputs]


class Tests(unittest.TestCase):
    def test_packed_batches_and_outputs_carry_what_records_do(self):
        reset()
        world = export(Forward)()
        world.init([])
        batch = [
            input_record({"key": "k", "value": "v", "timestamp": 5}, 0),
            input_record({"value": "no key"}, 1),
            input_record({"key": "tomb", "value": None}, 2),
            input_record({"key": "ü", "value": ""}, 3, topic="other"),
        ]
        batch[0].headers = [SimpleNamespace(key="h", value=b"\x00\xff"), SimpleNamespace(key="", value=b"")]
        expected = shaped(world.process(batch))
        self.assertEqual(len(expected), 8)
        self.assertEqual(expected[0], (b"k", b"v", [("h", b"\x00\xff"), ("", b"")], None))
        self.assertEqual(expected[1], (None, None, [("seen", b"k"), ("offset", b"0")], "audit"))
        self.assertEqual(shaped(process(world, batch, packed=True)), expected)
        self.assertEqual(shaped(world.process_packed(pack_batch(batch))), expected)
        self.assertEqual(shaped(process(world, [], packed=True)), [])

    def test_a_malformed_packed_batch_fails_the_batch(self):
        reset()
        world = export(Forward)()
        world.init([])
        good = pack_batch([input_record({"key": "k", "value": "v"}, 0)])
        for bad, why in ((good[:-1], "malformed packed batch"), (good + b"\x00", "1 bytes after the last record")):
            with self.assertRaises(Err) as e:
                world.process_packed_out(bad)
            self.assertIn(why, e.exception.value)
            self.assertTrue(e.exception.value.startswith("host bug: "), e.exception.value)

    def test_running_count_matches_golden_output(self):
        expected = (EXAMPLE / "testdata" / "expected.jsonl").read_text().splitlines()
        for bs, packed in ((1, False), (3, False), (100, False), (1, True), (3, True), (100, True)):
            out, batches = run_example(bs, packed)
            self.assertEqual(out, expected, f"batch size {bs}, packed {packed}")
            # Two host calls per batch, however many records: get-many, write.
            self.assertEqual(backend().calls, {"get": 0, "get_many": batches, "write": batches, "scan_prefix": 0})

    def test_state_layout_is_the_rust_sdks(self):
        run_example(3)
        self.assertEqual(
            sorted(backend().map.items()),
            [(b"count\x00", b"2"), (b"count\x00alice", b"3"), (b"count\x00bob", b"2")],
        )
        s = ValueState("count")
        self.assertEqual(s.key("user-1"), b"count\x00user-1")
        self.assertEqual(s.key(b"\xff"), b"count\x00\xff")
        self.assertRaisesRegex(Error, "must not be empty", ValueState, "")
        self.assertRaisesRegex(Error, "0x00", ValueState, "a\x00b")
        # Values are compact JSON, non-ASCII unescaped (as serde_json writes them).
        self.assertEqual(sluice._json_encode({"a": [1, "é"], "b": None}), '{"a":[1,"é"],"b":null}'.encode())
        self.assertEqual(sluice._json_decode(b"0"), 0)
        self.assertEqual(sluice._json_decode(b"[7]"), [7])

    def test_errors_fail_the_batch_without_state(self):
        reset()
        world = export(Failing)()

        def rec(k, v, offset):
            return input_record(json.dumps({"key": k, "value": v}), offset, topic="events", partition=3)

        with self.assertRaises(Err) as e:
            world.process([])
        self.assertEqual(e.exception.value, "process called before init")
        world.init([("fail_on", "boom")])
        out = world.process([rec("a", "x", 1), rec(None, "y", 2)])
        self.assertEqual(out[0].value, '{"n":1,"s":"é\\n"}'.encode())
        self.assertEqual((out[0].topic, out[0].headers[0].key, out[0].headers[0].value), ("t", "h", b"1"))
        self.assertIsNone(out[1].key)
        with self.assertRaises(Err) as e:
            world.process([rec("a", "x", 40), rec("a", "boom", 41)])
        self.assertEqual(e.exception.value, "record events-3@41: asked to fail")
        with self.assertRaises(Err) as e:
            world.process([rec("a", "type", 7)])
        self.assertEqual(e.exception.value, "record events-3@7: KeyError: 'missing'")
        self.assertEqual(backend().calls["write"], 1, "failed batches write nothing")
        out = world.process([rec("a", "x", 42)])
        self.assertEqual(out[0].value, '{"n":2,"s":"é\\n"}'.encode(), "the replay sees the last good batch")

    def test_unchanged_values_are_not_written_back(self):
        reset()

        class T(Transform):
            def process(self, record, out):
                v = record.value_str()
                if v == "clear":
                    SEEN.clear(record.key)
                elif v == "init":
                    SEEN.set(record.key, 5)
                else:
                    assert SEEN.get(record.key) == 5
                    SEEN.set(record.key, 5)

        world = export(T)()
        world.init([])
        rec = lambda v: input_record(json.dumps({"key": "k", "value": v}), 0)  # noqa: E731
        world.process([rec("init")])
        self.assertEqual(backend().calls["write"], 1)
        world.process([rec("set")])
        self.assertEqual(backend().calls["write"], 1, "same value as the host's: nothing to write")
        world.process([rec("clear")])
        self.assertEqual(backend().map, {})

    def test_config_helpers_name_the_key_and_value(self):
        c = Config([("mode", "keep"), ("n", "12"), ("bad", "x1"), ("mode", "drop")])
        self.assertEqual(c.get("mode"), "drop", "last value wins")
        self.assertEqual(c.parse("n", int), 12)
        self.assertEqual(c.parse("absent", int, 7), 7)
        self.assertRaisesRegex(Error, 'config key `bad`: invalid value "x1"', c.parse, "bad", int)
        self.assertRaisesRegex(Error, "missing required config key `contains`", c.require, "contains")
        self.assertEqual(c.choice("mode", ["keep", "drop"]), "drop")
        self.assertRaisesRegex(Error, "expected one of `keep`, `drop`", c.choice, "n", ["keep", "drop"])

    def test_the_package_version_is_the_modules(self):
        import re

        text = (ROOT / "sdks" / "python" / "pyproject.toml").read_text()
        self.assertEqual(re.search(r'(?m)^name = "(.*)"$', text).group(1), "sluice-guest")
        self.assertEqual(re.search(r'(?m)^version = "(.*)"$', text).group(1), sluice.__version__)
        self.assertRegex(text, r"(?m)^dependencies = \[\]$", "no runtime dependencies")

    def test_init_errors_become_the_result_string(self):
        class Needy(Transform):
            def __init__(self, config):
                config.require("needed")

        with self.assertRaises(Err) as e:
            export(Needy)().init([])
        self.assertEqual(e.exception.value, "missing required config key `needed`")


if __name__ == "__main__":
    unittest.main()
