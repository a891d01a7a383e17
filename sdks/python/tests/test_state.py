"""MapState and ListState outside a component: the key and value layout of
the Rust SDK (guest-sdk/src/state/keys.rs, map.rs, list.rs), byte for byte,
and the number of host calls."""

import unittest

from support import backend, reset

from sluice import Emitter, Error, ListState, MapKey, MapState, ValueState, testing

U = (1 << 63)


class KeyLayoutTests(unittest.TestCase):
    def test_layouts(self):
        self.assertEqual(ValueState("count").key("user-1"), b"count\x00user-1")
        self.assertEqual(ValueState("c").key(""), b"c\x00")
        self.assertEqual(ListState("l").key("k"), b"l\x00k")
        self.assertEqual(MapState("m").prefix("ab"), b"m\x00\x00\x00\x00\x02ab")
        self.assertEqual(MapState("m").prefix(b""), b"m\x00\x00\x00\x00\x00")
        self.assertEqual(MapState("m").key("ab", "x"), b"m\x00\x00\x00\x00\x02abx")

    def test_an_integer_key_or_value_is_refused_not_made_zero_bytes(self):
        # bytes(5) is five zero bytes: an int passed by mistake must fail,
        # not land under another key.
        reset()
        for call in (
            lambda: ValueState("c").key(5),
            lambda: ValueState("c").set(5, 1),
            lambda: ValueState("c").get(True),
            lambda: ValueState("c").update(5, lambda n: n),
            lambda: ListState("l").push(5, 1),
            lambda: Emitter().emit(5, "v"),
            lambda: Emitter().emit("k", 7),
        ):
            with self.assertRaisesRegex(TypeError, "bytes or str, not (int|bool)"):
                call()
        self.assertEqual(backend().map, {})

    def test_names_are_checked(self):
        self.assertRaisesRegex(Error, "^state name must not be empty$", MapState, "")
        with self.assertRaises(Error) as e:
            ListState("a\0b")
        self.assertEqual(str(e.exception), 'state name "a\\0b" must not contain a 0x00 byte')

    def test_map_prefixes_do_not_overlap(self):
        a, ab = MapState("m").prefix("a"), MapState("m").prefix("ab")
        self.assertFalse(ab.startswith(a) or a.startswith(ab))


class MapKeyTests(unittest.TestCase):
    def test_integer_keys_sort_numerically(self):
        ks = [5, -1, -U, 0, U - 1, -300]
        encoded = sorted(MapKey.I64.encode(k) for k in ks)
        self.assertEqual([MapKey.I64.decode(b) for b in encoded], sorted(ks))
        self.assertEqual(MapKey.I32.encode(-1), bytes([0x7F, 0xFF, 0xFF, 0xFF]))
        self.assertEqual(MapKey.U16.encode(258), bytes([1, 2]))
        self.assertEqual(MapKey.I8.encode(-128), b"\x00")
        self.assertEqual(MapKey.U128.encode(1), b"\x00" * 15 + b"\x01")
        with self.assertRaises(Error) as e:
            MapKey.U32.decode(bytes([1, 2]))
        self.assertEqual(str(e.exception), "map key of 2 bytes is not a u32")
        self.assertRaises(Error, MapKey.STR.decode, b"\xff")
        self.assertRaisesRegex(Error, "out of the range of a u8", MapKey.U8.encode, 256)
        self.assertRaisesRegex(Error, "out of the range of a u8", MapKey.U8.encode, -1)
        self.assertRaisesRegex(Error, "not an integer", MapKey.I64.encode, "1")
        self.assertRaisesRegex(Error, "not a str", MapKey.STR.encode, b"x")
        self.assertEqual(MapKey.BYTES.encode("é"), "é".encode())

    def test_key_types(self):
        self.assertIs(MapState("m").key_type, MapKey.STR)
        self.assertIs(MapState("m", key_type=bytes).key_type, MapKey.BYTES)
        self.assertIs(MapState("m", key_type=int).key_type, MapKey.I64)
        self.assertIs(MapState("m", key_type="u32").key_type, MapKey.U32)
        self.assertIs(MapState("m", key_type=MapKey.I128).key_type, MapKey.I128)
        self.assertRaisesRegex(Error, "unknown map key type", MapState, "m", key_type=float)


class MapStateTests(unittest.TestCase):
    def setUp(self):
        reset()

    def test_layout_and_operations(self):
        m = MapState("m", key_type=str)
        m.set("u", "b", 2)
        m.set("u", "a", 1)
        m.set("uu", "x", 9)
        m.set("u", "c", 3)
        m.remove("u", "c")
        self.assertEqual(m.get("u", "a"), 1)
        self.assertEqual(m.get("u", "c", "none"), "none")
        self.assertEqual(sum(backend().calls.values()), 0, "all served by the cache")
        self.assertEqual(m.entries("u"), [("a", 1), ("b", 2)])
        self.assertEqual(backend().calls["write"], 1, "the scan flushed pending writes first")
        self.assertEqual(m.keys("uu"), ["x"])
        self.assertIn(b"m\x00\x00\x00\x00\x01ua", backend().map)
        self.assertIn(b"m\x00\x00\x00\x00\x02uux", backend().map)
        m.clear("u")
        self.assertEqual(m.entries("u"), [])
        self.assertEqual(len(m.entries("uu")), 1)

    def test_entries_page_through_large_maps(self):
        m = MapState("big", key_type=MapKey.U32)
        n = 1024 * 2 + 7
        for i in range(n):
            m.set("k", i, i)
        entries = m.entries("k")
        self.assertEqual(entries, [(i, i) for i in range(n)])
        self.assertEqual(backend().calls["scan_prefix"], 3)
        m.clear("k")
        self.assertEqual(m.keys("k"), [])

    def test_signed_keys_come_back_in_numeric_order(self):
        m = MapState("w", key_type=int)
        for k in (10, -10, 0, -(1 << 63)):
            m.set(b"\x00", k, str(k))
        self.assertEqual([k for k, _ in m.entries(b"\x00")], [-(1 << 63), -10, 0, 10])
        testing.finish()
        self.assertIn(b"w\x00\x00\x00\x00\x01\x00" + (10 + U).to_bytes(8, "big"), testing.state())
        self.assertEqual(testing.state()[b"w\x00\x00\x00\x00\x01\x00" + U.to_bytes(8, "big")], b'"0"')


class ListStateTests(unittest.TestCase):
    def setUp(self):
        reset()

    def test_append_keeps_valid_json(self):
        from sluice import _append

        a = lambda l, i: _append("l", None if l is None else l.encode(), i.encode()).decode()  # noqa: E731
        self.assertEqual(a(None, "1"), "[1]")
        self.assertEqual(a("[]", "1"), "[1]")
        self.assertEqual(a(" [ ] \n", "1"), "[ 1]")
        self.assertEqual(a("[1,2]", '{"a":[3]}'), '[1,2,{"a":[3]}]')
        self.assertEqual(a('["x"] ', '"y"'), '["x","y"]')
        for bad in ("{}", "", "]", "\x0b[1]"):
            self.assertRaises(Error, a, bad, "1")

    def test_push_get_set_clear(self):
        lst = ListState("l")
        lst.push("k", [1, "a"])
        lst.push("k", [2, "b"])
        self.assertEqual(lst.get("k"), [[1, "a"], [2, "b"]])
        self.assertEqual(backend().calls["get"], 1)
        lst.set("k", [[9, "z"]])
        lst.push("k", [10, "y"])
        self.assertEqual(len(lst.get("k")), 2)
        testing.finish()
        self.assertEqual(testing.state(), {b"l\x00k": b'[[9,"z"],[10,"y"]]'})
        lst.clear("k")
        self.assertEqual(lst.get("k"), [])
        self.assertEqual(lst.get("other"), [])
        lst.prefetch(["a", "b"])
        self.assertEqual(backend().calls["get_many"], 1)

    def test_push_onto_a_non_array_is_an_error(self):
        ValueState("l2").set("k", 5)
        with self.assertRaises(Error) as e:
            ListState("l2").push("k", 1)
        self.assertEqual(str(e.exception), "state `l2`: stored value is not a JSON array")


if __name__ == "__main__":
    unittest.main()
