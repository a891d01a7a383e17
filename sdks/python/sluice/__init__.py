"""Write sluice transforms in Python.

A sluice transform is a WebAssembly component (world ``sluice:transform/packed-out``,
``wit/sluice.wit``) that the host feeds batches of Kafka records; it returns the
records to write and keeps keyed state that the host checkpoints exactly once.
This module is the Python counterpart of the Rust crate ``sluice-guest``: it hides
the generated componentize-py bindings behind a small API.

- :class:`Transform`: subclass it (``__init__(config)``, ``begin_batch``,
  ``process``, ``end_batch``, ``on_timer``, ``migrate``), then
  ``WitWorld = export(MyTransform)``.
- :class:`Record` and :class:`Batch` to read input, :class:`Emitter` to write.
- :class:`Config` for the job's settings.
- :class:`ValueState`, :class:`MapState` and :class:`ListState`: keyed state
  (JSON values), cached per batch; ``ttl_ms=`` makes entries expire.
- :func:`watermark`, :func:`processing_time`, :class:`Timer` and
  :meth:`Record.is_late`: event time and timers (``Transform.on_timer`` is
  called when one is due).
- :class:`Windows` (tumbling, hopping) and :class:`SessionWindows`: event-time
  windows built on state and timers.
- :class:`Error`: raise it to fail the batch with a plain message.
- :func:`log` (and :func:`info`, :func:`warn`, ...) into the host's log.
  ``print`` works too: stdout and stderr become host log lines.

Example, a running count per key::

    from sluice import Transform, ValueState, export

    COUNTS = ValueState("count")

    class RunningCount(Transform):
        def begin_batch(self, batch):
            COUNTS.prefetch(batch.keys())       # one state.get-many per batch

        def process(self, record, out):
            n = COUNTS.update(record.key_or_empty(), lambda n: (n or 0) + 1)
            out.emit(record.key_or_empty(), str(n))

    WitWorld = export(RunningCount)

Batch lifecycle (as in the Rust SDK): for every batch, ``begin_batch``, then
``process`` for each record in input order, then ``end_batch``; then all state
changes of the batch go to the host with one ``state.write`` and the emitted
records are returned. Any exception fails the whole batch: outputs and
unflushed state writes are dropped and the host replays the batch from the
last checkpoint. An exception never traps the instance; its message becomes
the batch's error (``record <topic>-<partition>@<offset>: <message>`` when
raised from ``process``; an :class:`Error` gives its message alone, any other
exception ``<Type>: <message>``). When timers are due the host calls
``on-timers``: the SDK first handles its own time-to-live timers, then calls
``on_timer`` for each other timer in order, then writes the state back as
after a batch.

State and key layout: identical to the Rust SDK, so a job can switch language
and keep its state ("Key layout" in ``guest-sdk/src/lib.rs``):

- :class:`ValueState` and :class:`ListState` ``name``, record key ``k``:
  host key ``name + b"\\x00" + k``;
- :class:`MapState` ``name``, record key ``k``, map key ``m``:
  ``name + b"\\x00" + u32_be(len(k)) + k + m``, where ``m`` is UTF-8 for
  ``str``, raw for ``bytes``, big-endian for unsigned and big-endian with the
  sign bit flipped for signed integers (:class:`MapKey`);
- :class:`Windows` ``name``, window ``start`` of record key ``k``: the
  :class:`MapState` entry (``name``, ``i64_key(start)``, ``k``), that is
  ``name + b"\\x00\\x00\\x00\\x00\\x08" + i64_key(start) + k``, with one
  event-time timer ``name`` per window end; :class:`SessionWindows` ``name``:
  a :class:`ValueState` per record key, with timers ``name + b"\\x00" + k``.

Values are compact JSON text (``json.dumps(v, separators=(",", ":"),
ensure_ascii=False)``, which is also what serde_json writes for integers,
strings, lists and objects); with a time-to-live, ``[expires_at_ms, value]``.
A write-back cache sits in front of the host for the length of one call:
reads hit the host at most once per key (``prefetch`` loads many keys with
one ``state.get-many``), writes stay in the guest until the call ends, and
nothing is cached across calls because the host may roll state back between
them.

Outside a component (plain CPython, e.g. unit tests) the module runs against
an in-memory state store and a simulated clock and timers
(:mod:`sluice.testing`), and prints log lines to stderr; see
``sdks/python/tests``.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
import sys
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

try:  # Inside the component: the bindings componentize-py generates.
    from componentize_py_types import Err
    from wit_world.imports import log as _wit_log
    from wit_world.imports import state as _wit_state
    from wit_world.imports.types import Header as _Header
    from wit_world.imports.types import OutputRecord as _OutputRecord

    IN_COMPONENT = True
except ImportError:  # Plain CPython: stand-ins with the same shapes.
    IN_COMPONENT = False

    class Err(Exception):  # type: ignore[no-redef]
        """The error case of a WIT ``result``."""

        def __init__(self, value: Any) -> None:
            super().__init__(value)
            self.value = value

    @dataclass
    class _Header:  # type: ignore[no-redef]
        key: str
        value: bytes

    @dataclass
    class _OutputRecord:  # type: ignore[no-redef]
        key: Optional[bytes]
        value: Optional[bytes]
        headers: List[Any]
        topic: Optional[str]

    _wit_log = None
    _wit_state = None

_wit_time: Any = None
if IN_COMPONENT:
    try:  # World `packed-out` (build.sh's) has it; a `transform`-world build has no `time`.
        from wit_world.imports import time as _wit_time
    except ImportError:
        _wit_time = None

__version__ = "0.1.0"
"""The SDK's version: the ``sluice-guest`` distribution's (sdks/python/pyproject.toml)."""

__all__ = [
    "Batch",
    "Clock",
    "Config",
    "Emitter",
    "Error",
    "ListState",
    "MapKey",
    "MapState",
    "Record",
    "SessionWindows",
    "Timer",
    "Transform",
    "ValueState",
    "WINDOWS_PER_FIRING",
    "Window",
    "Windows",
    "debug",
    "error",
    "export",
    "info",
    "log",
    "processing_time",
    "trace",
    "warn",
    "watermark",
]

Bytes = Union[bytes, bytearray, memoryview, str]
"""Keys and values the helpers accept: ``str`` is encoded as UTF-8."""


def _bytes(b: Bytes) -> bytes:
    t = type(b)
    if t is bytes:
        return b
    if t is str:
        return b.encode()  # type: ignore[union-attr]
    if isinstance(b, int):  # bytes(5) would be five zero bytes
        raise TypeError(f"expected bytes or str, not {t.__name__}")
    return bytes(b)  # type: ignore[arg-type]


def _header_list(headers: Iterable[Tuple[str, Bytes]]) -> List[Tuple[str, bytes]]:
    """Emitted headers as ``(name, bytes)`` pairs."""
    out = [(k, _bytes(v)) for k, v in headers]
    for k, _ in out:
        if not isinstance(k, str):
            raise TypeError(f"a header name must be str, not {type(k).__name__}")
    return out


def _check_topic(topic: Any) -> None:
    if topic is not None and not isinstance(topic, str):
        raise TypeError(f"an output topic must be str or None, not {type(topic).__name__}")


# The per-record path in C (native/_speedups.c), when it was built: build.sh
# always builds it into a component; plain CPython runs the pure-Python twins
# below unless the extension was built for it (sdks/python/test.sh does, to
# test both). SLUICE_PY_SPEEDUPS=0 forces pure Python, =1 requires the C core.
def _load_speedups() -> Any:
    wanted = os.environ.get("SLUICE_PY_SPEEDUPS", "")
    if wanted == "0":
        return None
    try:
        # Not `from . import _speedups`: that takes any module-level name
        # `_speedups` for the submodule without importing it.
        return importlib.import_module("._speedups", __name__)
    except ImportError:
        if wanted == "1":
            raise
        return None


_speedups: Any = _load_speedups()

SPEEDUPS = _speedups is not None
"""Whether the SDK's per-record path runs in C (``sluice._speedups``)."""


class Error(Exception):
    """A failure whose message is reported as is (no exception type prefix)."""



I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


def _sat(x: int) -> int:
    """``x`` clamped to the ``s64`` range: Rust's saturating arithmetic."""
    return I64_MIN if x < I64_MIN else I64_MAX if x > I64_MAX else x


def _millis(what: str, ms: Any) -> int:
    """A non-negative whole number of milliseconds, at most ``I64_MAX``."""
    if type(ms) is not int:
        if isinstance(ms, bool) or not isinstance(ms, int):
            raise Error(f"{what} must be a whole number of milliseconds, not {ms!r}")
        ms = int(ms)
    if ms < 0:
        raise Error(f"{what} must not be negative (got {ms})")
    return min(ms, I64_MAX)


# ---------------------------------------------------------------- time

if _wit_time is not None:
    Clock = _wit_time.Clock
else:

    class Clock(Enum):  # type: ignore[no-redef]
        """The clock a timer follows (the WIT enum ``time.clock``)."""

        EVENT = 0
        """The shard's watermark."""
        PROCESSING = 1
        """The host's wall clock (the guest's own clock stays frozen)."""


_CLOCK_NAMES = {0: "Event", 1: "Processing"}


class Timer:
    """A timer: ``key`` at ``at`` (ms since the Unix epoch) on ``clock``.

    Timers are state of the shard: setting one in a call that fails sets
    nothing, and a firing commits exactly once with its epoch. A shard holds
    at most one timer per clock, key and time. Timers order (and compare) by
    clock (event before processing), time, key, as the Rust SDK's do.
    """

    __slots__ = ("clock", "key", "at")

    def __init__(self, clock: Any, key: Bytes, at: int) -> None:
        if type(at) is not int and (isinstance(at, bool) or not isinstance(at, int)):
            raise Error(f"timer time must be an integer (ms since the Unix epoch), not {at!r}")
        if not I64_MIN <= at <= I64_MAX:
            raise Error(f"timer time {at} is out of the s64 range")
        self.clock = clock
        self.key: bytes = _bytes(key)
        self.at: int = int(at)

    @classmethod
    def event(cls, key: Bytes, at: int) -> "Timer":
        """An event-time timer: fires once the watermark reaches ``at``."""
        return cls(Clock.EVENT, key, at)

    @classmethod
    def processing(cls, key: Bytes, at: int) -> "Timer":
        """A processing-time timer: fires once the host's clock reaches ``at``."""
        return cls(Clock.PROCESSING, key, at)

    def set(self) -> None:
        """Sets it (setting a timer that is set already does nothing). An
        event-time timer at or below the watermark fires right after this
        call."""
        _time.set_timer(self)

    def delete(self) -> None:
        """Deletes it; deleting a timer that is not set does nothing."""
        _time.delete_timer(self)

    def key_str(self) -> str:
        """The key as UTF-8 text."""
        try:
            return self.key.decode()
        except UnicodeDecodeError as e:
            raise Error(f"invalid UTF-8: {e}") from None

    def _order(self) -> Tuple[int, int, bytes]:
        return (self.clock.value, self.at, self.key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timer):
            return NotImplemented
        return self._order() == other._order()

    def __lt__(self, other: "Timer") -> bool:
        return self._order() < other._order()

    def __hash__(self) -> int:
        return hash(self._order())

    def __repr__(self) -> str:
        kind = "event" if self.clock.value == 0 else "processing"
        return f"Timer.{kind}({self.key!r}, {self.at})"


def _timer_from_wit(t: Any) -> Timer:
    """The SDK's :class:`Timer` for a ``time.timer`` record of the bindings."""
    if type(t) is Timer:
        return t
    return Timer(Clock(t.clock.value), t.key, t.at)


class _HostTime:
    """The host's ``time`` interface (inside a component)."""

    def _time(self) -> Any:
        if _wit_time is None:
            raise Error("time and timers need a component built for world `timed` (sdks/python/build.sh does that)")
        return _wit_time

    def watermark(self) -> Optional[int]:
        return self._time().watermark()

    def processing_time(self) -> int:
        return self._time().processing_time()

    def set_timer(self, timer: Timer) -> None:
        t = self._time()
        t.set_timer(t.Timer(timer.clock, timer.key, timer.at))

    def delete_timer(self, timer: Timer) -> None:
        t = self._time()
        t.delete_timer(t.Timer(timer.clock, timer.key, timer.at))


class _SimulatedTime:
    """The host's ``time`` interface, simulated in memory (plain CPython);
    driven by :mod:`sluice.testing`."""

    def __init__(self) -> None:
        self.watermark_at: Optional[int] = None
        self.now = 0
        self.timers: Dict[Tuple[int, int, bytes], None] = {}
        self.calls = {"watermark": 0, "processing_time": 0, "set_timer": 0, "delete_timer": 0}

    def watermark(self) -> Optional[int]:
        self.calls["watermark"] += 1
        return self.watermark_at

    def processing_time(self) -> int:
        self.calls["processing_time"] += 1
        return self.now

    def set_timer(self, timer: Timer) -> None:
        self.calls["set_timer"] += 1
        self.timers[timer._order()] = None

    def delete_timer(self, timer: Timer) -> None:
        self.calls["delete_timer"] += 1
        self.timers.pop(timer._order(), None)

    def pending(self) -> List[Timer]:
        return [Timer(Clock(c), k, at) for c, at, k in sorted(self.timers)]

    def take_due(self) -> List[Timer]:
        w, now = self.watermark_at, self.now
        due = [
            (c, at, k)
            for c, at, k in sorted(self.timers)
            if (at <= now if c == 1 else w is not None and at <= w)
        ]
        for t in due:
            del self.timers[t]
        return [Timer(Clock(c), k, at) for c, at, k in due]


_time: Any = _HostTime() if IN_COMPONENT else _SimulatedTime()

_UNSET: Any = object()
_call_watermark: Any = _UNSET
_call_now: Optional[int] = None
_call_timers: Set[Timer] = set()
"""The timers :func:`_set_once_per_call` has set in the running call."""


def _new_call() -> None:
    """Forgets the cached watermark and clock and the timers set once per
    call: called as every export call begins."""
    global _call_watermark, _call_now
    _call_watermark = _UNSET
    _call_now = None
    _call_timers.clear()


def _set_once_per_call(timer: Timer) -> None:
    """Sets ``timer`` unless the running call has set it through here
    already: windows set the same timer for every key's first record, and
    one crossing per call does (setting a set timer does nothing)."""
    if timer not in _call_timers:
        timer.set()
        _call_timers.add(timer)


def watermark() -> Optional[int]:
    """The shard's watermark (ms since the Unix epoch) as of the start of this
    call; ``None`` until every input partition of the shard has sent a record
    or gone idle. One host call per call into the transform, however often
    it is asked (it does not change during a call)."""
    global _call_watermark
    w = _call_watermark
    if w is _UNSET:
        w = _call_watermark = _time.watermark()
    return w


def processing_time() -> int:
    """The host's clock (ms since the Unix epoch) as of the start of this call,
    what processing-time timers are compared with (one host call per call)."""
    global _call_now
    now = _call_now
    if now is None:
        now = _call_now = _time.processing_time()
    return now


# ---------------------------------------------------------------- records


class _RecordFields:
    """A record's fields and its hot method: the pure-Python twin of
    ``_speedups.RecordBase``."""

    __slots__ = ("key", "value", "_headers", "timestamp", "topic", "partition", "offset")

    def key_or_empty(self) -> bytes:
        """The key, or ``b""`` for records without one."""
        k = self.key
        return b"" if k is None else k


class Record(_speedups.RecordBase if _speedups else _RecordFields):  # type: ignore[misc]
    """One input record.

    ``key`` and ``value`` are ``bytes`` or ``None`` (no key / tombstone);
    ``timestamp`` is milliseconds since the Unix epoch or ``None``;
    ``topic``, ``partition`` and ``offset`` say where it came from.
    """

    __slots__ = ()

    def __init__(
        self,
        key: Optional[bytes],
        value: Optional[bytes],
        headers: Sequence[Tuple[str, bytes]] = (),
        timestamp: Optional[int] = None,
        topic: str = "",
        partition: int = 0,
        offset: int = 0,
    ) -> None:
        self.key = key
        self.value = value
        self._headers = headers
        self.timestamp = timestamp
        self.topic = topic
        self.partition = partition
        self.offset = offset

    @classmethod
    def _from_wit(cls, r: Any) -> "Record":
        """From the WIT ``input-record`` the bindings hand over."""
        headers = [(h.key, h.value) for h in r.headers] if r.headers else ()
        return cls(r.key, r.value, headers, r.timestamp, r.topic, r.partition, r.offset)

    def key_str(self) -> str:
        """The key as UTF-8 text; :class:`Error` if there is none."""
        if self.key is None:
            raise Error("record has no key")
        return self.key.decode()

    def is_tombstone(self) -> bool:
        """Whether the record has no value."""
        return self.value is None

    def value_str(self) -> str:
        """The value as UTF-8 text; :class:`Error` for a tombstone."""
        if self.value is None:
            raise Error("record has no value (tombstone)")
        return self.value.decode()

    def json(self) -> Any:
        """The value decoded from JSON; :class:`Error` for a tombstone or bad JSON."""
        if self.value is None:
            raise Error("record has no value (tombstone)")
        try:
            return json.loads(self.value)
        except ValueError as e:
            raise Error(f"invalid JSON: {e}") from None

    @property
    def headers(self) -> List[Tuple[str, bytes]]:
        """The headers in record order, as ``(key, value)`` pairs."""
        return list(self._headers)

    def header(self, name: str) -> Optional[bytes]:
        """The value of the last header called ``name`` (as Kafka's ``lastHeader``)."""
        for k, v in reversed(self._headers):
            if k == name:
                return v
        return None

    def is_late(self) -> bool:
        """Whether the record is late: its timestamp is at or below the shard's
        :func:`watermark`, so windows that would hold it may have closed. A
        record without a timestamp is never late. The host counts late
        records; nothing drops them but the transform."""
        ts = self.timestamp
        if ts is None:
            return False
        w = watermark()
        return w is not None and ts <= w

    def __repr__(self) -> str:
        return f"Record({self.topic}-{self.partition}@{self.offset}, key={self.key!r}, value={self.value!r})"

    def __reduce__(self) -> Tuple[Any, ...]:
        # For copy and pickle, whichever base holds the fields.
        fields = (self.key, self.value, list(self._headers), self.timestamp, self.topic, self.partition, self.offset)
        return (type(self), fields)


class Batch:
    """The records of one ``process`` call, in input order (iterable, indexable)."""

    __slots__ = ("records",)

    def __init__(self, records: List[Record]) -> None:
        self.records = records

    def keys(self) -> List[bytes]:
        """Every record's :meth:`Record.key_or_empty`, repeats included: what
        :meth:`ValueState.prefetch` expects."""
        records = self.records
        if _speedups and type(records) is list:
            return _speedups.batch_keys(records)
        return [b"" if r.key is None else r.key for r in records]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> Record:
        return self.records[i]


class _EmitterFields:
    """An emitter's output list and ``emit``: the pure-Python twin of
    ``_speedups.EmitterBase``."""

    __slots__ = ("records",)

    def __init__(self) -> None:
        # (key, value, headers as (key, value) pairs, topic): packed or
        # turned into the bindings' records once the call ends.
        self.records: List[_Output] = []

    def emit(
        self,
        key: Optional[Bytes],
        value: Optional[Bytes],
        headers: Iterable[Tuple[str, Bytes]] = (),
        topic: Optional[str] = None,
    ) -> None:
        """Writes a record. ``str`` is encoded as UTF-8; a ``None`` key means no
        key, a ``None`` value a tombstone; ``topic=None`` is the job's default
        output topic (any other must be one of the job's output topics)."""
        _check_topic(topic)
        if type(key) is not bytes and key is not None:
            key = key.encode() if type(key) is str else _bytes(key)
        if type(value) is not bytes and value is not None:
            value = value.encode() if type(value) is str else _bytes(value)
        self.records.append((key, value, _header_list(headers) if headers else (), topic))


class Emitter(_speedups.EmitterBase if _speedups else _EmitterFields):  # type: ignore[misc]
    """Collects a batch's output records; emitting never crosses into the host.

    ``emit(key, value, headers=(), topic=None)`` writes a record: ``str`` is
    encoded as UTF-8; a ``None`` key means no key, a ``None`` value a
    tombstone; ``topic=None`` is the job's default output topic (any other
    must be one of the job's output topics)."""

    __slots__ = ()

    def __reduce__(self) -> Tuple[Any, ...]:
        # For copy and pickle, whichever base holds the list.
        return (_emitter_with, (list(self.records),))

    def emit_json(self, key: Optional[Bytes], value: Any, **kwargs: Any) -> None:
        """Like :meth:`emit`, with the value encoded as compact JSON."""
        self.emit(key, _json_encode(value), **kwargs)

    def forward(self, record: Record, topic: Optional[str] = None) -> None:
        """Writes ``record``'s key, value and headers unchanged."""
        _check_topic(topic)
        self.records.append((record.key, record.value, record._headers, topic))

    def __len__(self) -> int:
        return len(self.records)


def _emitter_with(records: List[Any]) -> Emitter:
    out = Emitter()
    out.records = records
    return out


_Output = Tuple[Optional[bytes], Optional[bytes], Sequence[Tuple[str, bytes]], Optional[str]]
"""An emitted record: key, value, headers, topic."""


def _to_wit(records: List[_Output]) -> List[Any]:
    """The emitted records as the bindings' ``output-record``s."""
    return [_OutputRecord(k, v, [_Header(hk, hv) for hk, hv in h], t) for k, v, h, t in records]


# ---------------------------------------------------------------- packed strings
#
# The byte layouts of ``packed-batch`` and ``packed-outputs`` (wit/sluice.wit;
# little-endian, u32 lengths and counts): one byte string per call each way,
# which the bindings copy whole, instead of an object per field of every
# record.

_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<BIq")  # flags, topic index, offset
_FULL_HEAD = struct.Struct("<BIqqI")  # and the timestamp and the key's length
_KEYED = struct.Struct("<BI")  # an output's flags and its key's length
_I64 = struct.Struct("<q")
_HAS_KEY, _HAS_VALUE, _HAS_TIMESTAMP = 1, 2, 4
_NO_HEADERS = b"\x00\x00\x00\x00"


def _unpack_batch(buf: bytes) -> List[Record]:
    """The records of a ``packed-batch``; :class:`Error` if it is cut short."""
    if _speedups:
        try:
            return _speedups.unpack_batch(buf, Record)  # type: ignore[no-any-return]
        except ValueError as e:  # UnicodeDecodeError is one too
            raise Error(f"host bug: malformed packed batch: {e}") from None
    return _unpack_batch_py(buf)


def _unpack_batch_py(buf: bytes) -> List[Record]:
    """``_unpack_batch`` in pure Python."""
    try:
        partition, n = struct.unpack_from("<iI", buf, 0)
        at = 8
        topics = []
        for _ in range(n):
            (size,) = _U32.unpack_from(buf, at)
            at += 4
            topics.append(buf[at : at + size].decode())
            at += size
        (n,) = _U32.unpack_from(buf, at)
        at += 4
        records = []
        append = records.append
        head, u32, i64 = _HEAD.unpack_from, _U32.unpack_from, _I64.unpack_from
        full, full_size = _FULL_HEAD.unpack_from, _FULL_HEAD.size
        for _ in range(n):
            if buf[at] == _HAS_KEY | _HAS_VALUE | _HAS_TIMESTAMP:
                # The usual record: one call reads up to the key's bytes.
                _, topic, offset, timestamp, size = full(buf, at)
                at += full_size
                key = buf[at : at + size]
                at += size
                (size,) = u32(buf, at)
                value = buf[at + 4 : at + 4 + size]
                at += 4 + size
            else:
                flags, topic, offset = head(buf, at)
                at += 13
                timestamp = key = value = None
                if flags & _HAS_TIMESTAMP:
                    (timestamp,) = i64(buf, at)
                    at += 8
                if flags & _HAS_KEY:
                    (size,) = u32(buf, at)
                    at += 4
                    key = buf[at : at + size]
                    at += size
                if flags & _HAS_VALUE:
                    (size,) = u32(buf, at)
                    at += 4
                    value = buf[at : at + size]
                    at += size
            (count,) = u32(buf, at)
            at += 4
            headers: Sequence[Tuple[str, bytes]] = ()
            if count:
                headers = []
                for _ in range(count):
                    (size,) = u32(buf, at)
                    name = buf[at + 4 : at + 4 + size].decode()
                    at += 4 + size
                    (size,) = u32(buf, at)
                    headers.append((name, buf[at + 4 : at + 4 + size]))
                    at += 4 + size
            append(Record(key, value, headers, timestamp, topics[topic], partition, offset))
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise Error(f"host bug: malformed packed batch: {e}") from None
    if at > len(buf):
        raise Error(f"host bug: malformed packed batch: cut short, {at - len(buf)} bytes missing")
    if at < len(buf):
        raise Error(f"host bug: malformed packed batch: {len(buf) - at} bytes after the last record")
    return records


def _pack_outputs(records: List[_Output]) -> bytes:
    """The emitted records as ``packed-outputs``."""
    if _speedups:
        return _speedups.pack_outputs(records)  # type: ignore[no-any-return]
    return _pack_outputs_py(records)


def _pack_outputs_py(records: List[_Output]) -> bytes:
    """``_pack_outputs`` in pure Python."""
    u32 = _U32.pack
    parts = [u32(len(records))]
    append = parts.append
    for key, value, headers, topic in records:
        if topic is None and not headers and key is not None and value is not None:
            parts += (_KEYED.pack(_HAS_KEY | _HAS_VALUE, len(key)), key, u32(len(value)), value, _NO_HEADERS)
            continue
        flags = (key is not None) | (value is not None) << 1 | (topic is not None) << 2
        append(bytes((flags,)))
        if topic is not None:
            t = topic.encode()
            append(u32(len(t)))
            append(t)
        if key is not None:
            append(u32(len(key)))
            append(key)
        if value is not None:
            append(u32(len(value)))
            append(value)
        if headers:
            append(u32(len(headers)))
            for name, v in headers:
                n = name.encode()
                append(u32(len(n)))
                append(n)
                append(u32(len(v)))
                append(v)
        else:
            append(_NO_HEADERS)
    return b"".join(parts)


# ---------------------------------------------------------------- config


class Config:
    """The job's transform configuration; a repeated key keeps its last value."""

    def __init__(self, pairs: Iterable[Tuple[str, str]] = ()) -> None:
        self._map: Dict[str, str] = {}
        for k, v in pairs:
            self._map[k] = v

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        """The value of ``name``, or ``default``."""
        return self._map.get(name, default)

    def require(self, name: str) -> str:
        """The value of ``name``; :class:`Error` if it is not set."""
        if name not in self._map:
            raise Error(f"missing required config key `{name}`")
        return self._map[name]

    def parse(self, name: str, convert: Callable[[str], Any], default: Any = None) -> Any:
        """``convert(value)`` (e.g. ``int``), ``default`` when not set, and an
        :class:`Error` naming the key and the value when ``convert`` fails."""
        if name not in self._map:
            return default
        raw = self._map[name]
        try:
            return convert(raw)
        except (ValueError, TypeError) as e:
            raise Error(f'config key `{name}`: invalid value "{raw}": {e}') from None

    def duration_ms(self, name: str, default: Optional[int] = None) -> Optional[int]:
        """The value of ``name`` as a duration such as ``10s``, ``1m 30s``,
        ``500ms`` or ``2h`` (the job files' notation, as the Rust SDK's
        ``Config::duration`` reads it), in whole milliseconds; ``default``
        when not set, an :class:`Error` naming the key and the value when it
        does not parse."""
        raw = self._map.get(name)
        if raw is None:
            return default
        try:
            return _parse_duration_ms(raw.strip())
        except ValueError as e:
            raise Error(f'config key `{name}`: invalid duration "{raw}" (e.g. 10s, 1m, 500ms): {e}') from None

    def choice(self, name: str, allowed: Iterable[str], default: Optional[str] = None) -> Optional[str]:
        """The value of ``name`` if it is one of ``allowed``; ``default`` when not set."""
        allowed = list(allowed)
        value = self._map.get(name)
        if value is None:
            return default
        if value not in allowed:
            names = ", ".join(f"`{a}`" for a in allowed)
            raise Error(f'config key `{name}`: unknown value "{value}"; expected one of {names}')
        return value

    def items(self) -> List[Tuple[str, str]]:
        return list(self._map.items())

    def __contains__(self, name: object) -> bool:
        return name in self._map

    def __len__(self) -> int:
        return len(self._map)

    def __repr__(self) -> str:
        return f"Config({self._map!r})"


_DURATION_UNITS_NS = {}
for _names, _ns in (
    (("nanos", "nsec", "ns"), 1),
    (("usec", "us", "\u00b5s"), 1_000),
    (("millis", "msec", "ms"), 1_000_000),
    (("seconds", "second", "secs", "sec", "s"), 1_000_000_000),
    (("minutes", "minute", "mins", "min", "m"), 60 * 1_000_000_000),
    (("hours", "hour", "hrs", "hr", "h"), 3_600 * 1_000_000_000),
    (("days", "day", "d"), 86_400 * 1_000_000_000),
    (("weeks", "week", "w"), 7 * 86_400 * 1_000_000_000),
    (("months", "month", "M"), 2_630_016 * 1_000_000_000),  # 30.44 days, as humantime
    (("years", "year", "y"), 31_557_600 * 1_000_000_000),  # 365.25 days
):
    for _n in _names:
        _DURATION_UNITS_NS[_n] = _ns
del _names, _ns, _n


def _parse_duration_ms(text: str) -> int:
    """Milliseconds (rounded down) of a duration in humantime's notation:
    one or more ``<digits><unit>``, optionally separated by whitespace."""
    if not text:
        raise ValueError("empty duration")
    total_ns, i, n = 0, 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        j = i
        while j < n and "0" <= text[j] <= "9":
            j += 1
        if j == i:
            raise ValueError(f"expected a number at {i}")
        number = int(text[i:j])
        while j < n and text[j].isspace():
            j += 1
        k = j
        while k < n and (text[k].isascii() and text[k].isalpha() or text[k] == "\u00b5"):
            k += 1
        unit = text[j:k]
        if not unit and k < n:
            raise ValueError(f"invalid character at {k}")
        if unit not in _DURATION_UNITS_NS:
            raise ValueError(f'unknown time unit "{unit}", supported units: ns, us, ms, s, m, h, d, w, M, y')
        total_ns += number * _DURATION_UNITS_NS[unit]
        if k < n and not text[k].isspace() and not "0" <= text[k] <= "9":
            raise ValueError(f"invalid character at {k}")
        i = k
    if total_ns // 1_000_000_000 >= 1 << 64:
        raise ValueError("number is too large")
    return total_ns // 1_000_000


# ---------------------------------------------------------------- state


def _parse_sized_list(packed: bytes) -> List[bytes]:
    """A ``u32`` count, then per item its ``u32`` length and bytes."""
    (n,) = _U32.unpack_from(packed, 0)
    at, items = 4, []
    for _ in range(n):
        (size,) = _U32.unpack_from(packed, at)
        items.append(packed[at + 4 : at + 4 + size])
        at += 4 + size
    if at != len(packed):
        raise ValueError(f"packed list: {len(packed) - at} bytes after the last item")
    return items


class _Memory:
    """In-memory stand-in for the host's ``state`` interface (plain CPython)."""

    def __init__(self) -> None:
        self.map: Dict[bytes, bytes] = {}
        self.calls = {"get": 0, "get_many": 0, "write": 0, "scan_prefix": 0}

    def get(self, key: bytes) -> Optional[bytes]:
        self.calls["get"] += 1
        return self.map.get(key)

    def get_many(self, keys: List[bytes]) -> List[Optional[bytes]]:
        self.calls["get_many"] += 1
        return [self.map.get(k) for k in keys]

    def write(self, entries: List[Tuple[bytes, Optional[bytes]]]) -> None:
        self.calls["write"] += 1
        for k, v in entries:
            if v is None:
                self.map.pop(k, None)
            else:
                self.map[k] = v

    # The packed forms the C core uses (wit/sluice.wit), read and written
    # here in Python: an independent reading of the layout. Counted as the
    # calls they stand for.

    def get_many_packed(self, packed: bytes) -> bytes:
        keys = _parse_sized_list(packed)
        out = [_U32.pack(len(keys))]
        for v in self.get_many(keys):
            out.append(b"\x00" if v is None else b"\x01" + _U32.pack(len(v)) + v)
        return b"".join(out)

    def write_packed(self, packed: bytes) -> None:
        (n,) = _U32.unpack_from(packed, 0)
        at, entries = 4, []
        for _ in range(n):
            (size,) = _U32.unpack_from(packed, at)
            key, present = packed[at + 4 : at + 4 + size], packed[at + 4 + size]
            at += 5 + size
            value = None
            if present:
                (size,) = _U32.unpack_from(packed, at)
                value = packed[at + 4 : at + 4 + size]
                at += 4 + size
            entries.append((key, value))
        if at != len(packed):
            raise ValueError(f"write-packed: {len(packed) - at} bytes after the last entry")
        self.write(entries)

    def scan_prefix(self, prefix: bytes, start_after: Optional[bytes], limit: int) -> List[Tuple[bytes, bytes]]:
        self.calls["scan_prefix"] += 1
        after = start_after if start_after is not None and start_after >= prefix else None
        keys = sorted(k for k in self.map if k.startswith(prefix) and (after is None or k > after))
        return [(k, self.map[k]) for k in keys[:limit]]


_ENTRY_BYTES = 96
"""What a cached entry costs besides its key and value: its dict slot and the
two bytes objects' headers, rounded up (as the C core counts them)."""

_CACHE_BYTES = 1024
"""What a shard's cache costs besides its entries: its two dicts, empty, and
its place among the parked."""

_Cache = Tuple[Dict[bytes, Optional[bytes]], Dict[bytes, None], int]
"""A shard's parked cache: its ``values``, ``dirty`` and ``bytes``."""


class _Store:
    """The write-back cache in front of the host's ``state``.

    ``values`` holds every key read or written (``None``: absent or
    deleted); ``dirty`` (insertion-ordered, so writes are deterministic) the
    keys the host has yet to hear about; ``bytes`` what both hold, by
    ``_ENTRY_BYTES`` per entry plus its key and value. The C core holds the
    two dicts too: they are swapped only through ``_use``.

    A call's cache ends with the call (written back, then forgotten), unless
    the host has said it will ask for held state back (``hold``): then the
    cache of a batch's shard stays from one batch of the shard to the next,
    within ``max_held`` bytes over all shards, until ``give_back`` (the
    host's ``flush-state``). The shard being served is ``holding``; other
    held shards wait in ``parked``. This is the Rust SDK's store.
    """

    __slots__ = ("backend", "values", "dirty", "bytes", "max_held", "holding", "parked")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.values: Dict[bytes, Optional[bytes]] = {}
        self.dirty: Dict[bytes, None] = {}
        self.bytes = 0
        self.max_held = 0
        self.holding: Optional[int] = None
        self.parked: Dict[int, _Cache] = {}

    def _use(self, values: Dict[bytes, Optional[bytes]], dirty: Dict[bytes, None], size: int) -> None:
        self.values, self.dirty, self.bytes = values, dirty, size
        if _speedups:
            _speedups.use_cache(values, dirty)

    def _count_c_writes(self) -> None:
        """Adds what the C core's writes did to the cache's size."""
        if _speedups:
            self.bytes += _speedups.take_grown()

    def hold(self, max_bytes: int) -> None:
        """The host's ``hold-state``: batches' caches may stay, up to ``max_bytes``."""
        self.max_held = max(0, max_bytes)

    def begin(self, shard: Optional[int]) -> None:
        """Starts a call for ``shard`` (``None``: a call without one, or
        nothing may be held): the shard's held cache, if any, becomes the
        cache, and the one held before is parked. What an unheld call left
        (only state used outside any call does) is dropped."""
        if not self.max_held:
            shard = None
        if shard is not None and shard == self.holding:
            return
        self._count_c_writes()
        if self.holding is not None and self.values:
            self.parked[self.holding] = (self.values, self.dirty, self.bytes)
            self._use({}, {}, 0)
        else:
            self.values.clear()
            self.dirty.clear()
            self.bytes = 0
        cache = self.parked.pop(shard, None) if shard is not None else None
        if cache is not None:
            self._use(*cache)
        self.holding = shard

    def end(self) -> None:
        """Ends a call that succeeded: a shard's cache stays while everything
        held is within ``max_held``; anything else is written back."""
        self._count_c_writes()
        if self.holding is not None:
            held = self.bytes + sum(size for _, _, size in self.parked.values())
            if held + _CACHE_BYTES * (1 + len(self.parked)) <= self.max_held:
                return
        self.holding = None
        self.finish()

    def give_back(self, shard: int) -> None:
        """The host's ``flush-state``: writes back what is held of ``shard``
        and forgets it."""
        self.begin(shard)
        self.holding = None
        self.finish()

    def read(self, key: bytes) -> Optional[bytes]:
        values = self.values
        if key in values:
            return values[key]
        v = self.backend.get(key)
        values[key] = v
        self.bytes += _ENTRY_BYTES + len(key) + (len(v) if v else 0)
        return v

    def prefetch(self, keys: Iterable[bytes]) -> None:
        values = self.values
        missing = _missing(keys if type(keys) is list else list(keys), values)
        if not missing:
            return
        backend = self.backend
        if _speedups and hasattr(backend, "get_many_packed"):
            answer = backend.get_many_packed(_speedups.pack_keys(missing))
            try:
                got = _speedups.unpack_values(answer, len(missing))
            except ValueError as e:
                raise Error(f"host bug: malformed state.get-many-packed answer: {e}") from None
        else:
            got = list(backend.get_many(missing))
        if len(got) != len(missing):
            raise Error(f"host bug: state.get-many returned {len(got)} values for {len(missing)} keys")
        self.bytes += _fill(values, missing, got)

    def write(self, key: bytes, value: Optional[bytes]) -> None:
        """Caches ``value`` (``None``: delete) for ``key``, to be written
        back; a write of what the cache has already changes nothing."""
        values = self.values
        if key in values:
            old = values[key]
            if old == value:
                return  # the host has it, or will
            self.bytes += (len(value) if value else 0) - (len(old) if old else 0)
        else:
            self.bytes += _ENTRY_BYTES + len(key) + (len(value) if value else 0)
        self.dirty[key] = None
        values[key] = value

    def _send(self) -> None:
        """One ``state.write`` (packed, with the C core) of the dirty keys,
        which are then clean."""
        keys, values, backend = list(self.dirty), self.values, self.backend
        self.dirty.clear()
        if _speedups and hasattr(backend, "write_packed"):
            backend.write_packed(_speedups.pack_entries(keys, values))
        else:
            backend.write([(k, values[k]) for k in keys])

    def flush(self) -> None:
        """Sends pending writes with one ``state.write`` and keeps the cache."""
        if self.dirty:
            self._send()

    def scan(self, prefix: bytes, start_after: Optional[bytes], limit: int) -> List[Tuple[bytes, bytes]]:
        """One page of ``state.scan-prefix``, after flushing pending writes so
        the host sees them."""
        self.flush()
        return list(self.backend.scan_prefix(prefix, start_after, limit))

    def finish(self) -> None:
        """Ends the cache: one ``state.write`` with every dirty entry, then forgets all."""
        try:
            if self.dirty:
                self._send()
        finally:
            self.values.clear()
            self._count_c_writes()
            self.bytes = 0

    def discard(self) -> None:
        """Ends a failed call: drops every cache, held ones too, with their
        unsent writes (the host ends the instance and rolls its epoch back)."""
        self._count_c_writes()
        self.values.clear()
        self.dirty.clear()
        self.bytes = 0
        self.parked.clear()
        self.holding = None


_store = _Store(_wit_state if IN_COMPONENT else _Memory())


_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_decode = json.JSONDecoder().decode


def _json_encode(value: Any) -> bytes:
    """Compact JSON, as serde_json writes it (ints take a fast path)."""
    if type(value) is int:
        return str(value).encode()
    return _encode(value).encode()


def _json_decode(raw: bytes) -> Any:
    """Parses JSON text; plain non-negative integers (counters) take a fast path."""
    if raw.isdigit() and (raw[0] != 0x30 or len(raw) == 1):
        return int(raw)
    return _decode(raw.decode())


def _check_name(name: str) -> bytes:
    """Checks a state name (non-empty, no 0x00 byte) and returns its UTF-8 bytes."""
    if not isinstance(name, str) or not name:
        raise Error("state name must not be empty")
    if "\0" in name:
        raise Error(f'state name "{name}" must not contain a 0x00 byte'.replace("\0", "\\0"))
    return name.encode()


def _decode_value(name: str, raw: bytes) -> Any:
    try:
        return _json_decode(raw)
    except ValueError as e:  # UnicodeDecodeError is one too
        raise Error(f"state `{name}`: invalid JSON: {e}") from None


def _missing_py(keys: List[bytes], values: Dict[bytes, Optional[bytes]]) -> List[bytes]:
    """The keys ``values`` lacks, each once, in order: what a prefetch asks for."""
    return [k for k in dict.fromkeys(keys) if k not in values]


def _fill_py(values: Dict[bytes, Optional[bytes]], keys: List[bytes], got: List[Optional[bytes]]) -> int:
    """Caches ``got[i]`` under ``keys[i]``; the bytes the cache grew by."""
    values.update(zip(keys, got))
    return _ENTRY_BYTES * len(keys) + sum(map(len, keys)) + sum(len(v) for v in got if v)


_missing = _speedups.missing if _speedups else _missing_py
_fill = _speedups.fill if _speedups else _fill_py


def _prefixed(prefix: bytes, keys: Iterable[Bytes]) -> List[bytes]:
    """``prefix + key`` for each of ``keys``: the host keys ``prefetch`` asks for."""
    return _speedups.prefix_keys(prefix, keys) if _speedups else [prefix + _bytes(k) for k in keys]  # type: ignore[no-any-return]


if _speedups:
    _speedups.bind(_bytes, _header_list, _store, _decode_value, _json_encode)


# -- time-to-live

_TTL_TIMER_PREFIX = b"\x00ttl\x00"
"""The first bytes of every expiry timer's key, followed by the entry's state
key (no state name is empty, so window timers never begin with them)."""

_EXPIRED: Any = object()


def _ttl_ms(name: str, ttl_ms: Optional[int]) -> int:
    return 0 if ttl_ms is None else _millis(f"state `{name}`: the time-to-live", ttl_ms)


def _ttl_encode(ttl: int, state_key: bytes, value: Any) -> bytes:
    """The stored form of ``value`` with a time-to-live: ``[expires_at, value]``,
    and its expiry timer set."""
    expires_at = _sat(processing_time() + ttl)
    Timer(Clock.PROCESSING, _TTL_TIMER_PREFIX + state_key, expires_at).set()
    return b"[" + str(expires_at).encode() + b"," + _json_encode(value) + b"]"


def _ttl_parse(raw: bytes) -> Optional[Tuple[int, Any]]:
    """``(expires_at, value)`` from ``[expires_at, value]``; ``None`` if it is not that."""
    try:
        pair = _decode(raw.decode())
    except ValueError:
        return None
    if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not int or not I64_MIN <= pair[0] <= I64_MAX:
        return None
    return pair[0], pair[1]


def _ttl_decode(name: str, raw: bytes) -> Any:
    """The value stored as ``raw`` with a time-to-live; ``_EXPIRED`` once it has expired."""
    pair = _ttl_parse(raw)
    if pair is None:
        _decode_value(name, raw)  # raises for text that is not JSON at all
        raise Error(f"state `{name}`: invalid JSON: expected [expires_at, value], a state with a time-to-live")
    return pair[1] if pair[0] > processing_time() else _EXPIRED


def _expire(timer: Timer) -> bool:
    """If ``timer`` is an expiry timer, deletes its entry unless it was written
    again with a later expiry, and returns ``True``; ``False`` for any other timer."""
    if timer.clock.value != 1 or not timer.key.startswith(_TTL_TIMER_PREFIX):
        return False
    key = timer.key[len(_TTL_TIMER_PREFIX) :]
    raw = _store.read(key)
    if raw is not None:
        pair = _ttl_parse(raw)
        if pair is not None and pair[0] <= timer.at:
            _store.write(key, None)
    return True


# -- value state


class _ValueStateFields:
    """A value state's fields, ``get``, ``set`` and ``update`` (the
    per-record read-modify-write): the pure-Python twin of
    ``_speedups.ValueStateBase``. A state with a time-to-live takes
    ``ValueState``'s ``_get_ttl``, ``_set_ttl`` and ``_update_ttl``."""

    __slots__ = ("name", "ttl_ms", "_prefix")

    def get(self, key: Bytes, default: Any = None) -> Any:
        """The value for ``key``, or ``default`` when there is none (or it expired)."""
        if self.ttl_ms:
            return self._get_ttl(key, default)  # type: ignore[attr-defined]
        raw = _store.read(self._prefix + _bytes(key))
        return default if raw is None else _decode_value(self.name, raw)

    def set(self, key: Bytes, value: Any) -> None:
        """Stores ``value`` for ``key``."""
        if self.ttl_ms:
            self._set_ttl(key, value)  # type: ignore[attr-defined]
        else:
            _store.write(self._prefix + _bytes(key), _json_encode(value))

    def update(self, key: Bytes, f: Callable[[Any], Any]) -> Any:
        """Replaces the value for ``key`` with ``f(current)`` (``current`` is
        ``None`` when absent or expired) and returns the new value."""
        if self.ttl_ms:
            return self._update_ttl(key, f)  # type: ignore[attr-defined]
        k = self._prefix + (key if type(key) is bytes else _bytes(key))
        values = _store.values  # the hot path: inlined cache hit
        raw = values[k] if k in values else _store.read(k)
        new = f(None if raw is None else _decode_value(self.name, raw))
        _store.write(k, _json_encode(new))
        return new


class ValueState(_speedups.ValueStateBase if _speedups else _ValueStateFields):  # type: ignore[misc]
    """One JSON value per record key, stored under ``name 0x00 key``.

    Create it once at module level (it is only a name). Keys may be ``bytes``
    or ``str`` (UTF-8); values anything ``json`` can encode. Every call goes
    through the per-call cache, so only ``prefetch`` and cache misses cross
    into the host.

    With ``ttl_ms`` (or :meth:`with_ttl`), a value expires that many ms of
    processing time after it was last written: an expired value is never
    returned, and an expiry timer removes it from the store. The stored form
    is then ``[expires_at_ms, value]``, so add or remove a TTL only with a
    ``migrate`` hook.
    """

    __slots__ = ()

    def __init__(self, name: str, ttl_ms: Optional[int] = None) -> None:
        self._prefix = _check_name(name) + b"\x00"
        self.name = name
        self.ttl_ms = _ttl_ms(name, ttl_ms)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self.name, self.ttl_ms or None))

    def with_ttl(self, ttl_ms: int) -> "ValueState":
        """The same state with a time-to-live of ``ttl_ms`` (0: none)."""
        return type(self)(self.name, ttl_ms)

    def key(self, key: Bytes) -> bytes:
        """The host key for record key ``key``: ``name 0x00 key``."""
        return self._prefix + _bytes(key)

    def _decode(self, raw: Optional[bytes]) -> Any:
        """The value stored as ``raw``; ``_EXPIRED`` for none or an expired one."""
        if raw is None:
            return _EXPIRED
        if self.ttl_ms:
            return _ttl_decode(self.name, raw)
        return _decode_value(self.name, raw)

    def _get_ttl(self, key: Bytes, default: Any) -> Any:
        """``get`` for a state with a time-to-live."""
        v = self._decode(_store.read(self._prefix + _bytes(key)))
        return default if v is _EXPIRED else v

    def _set_ttl(self, key: Bytes, value: Any) -> None:
        """``set`` for a state with a time-to-live."""
        k = self._prefix + _bytes(key)
        _store.write(k, _ttl_encode(self.ttl_ms, k, value))

    def _update_ttl(self, key: Bytes, f: Callable[[Any], Any]) -> Any:
        """``update`` for a state with a time-to-live."""
        k = self._prefix + _bytes(key)
        current = self._decode(_store.read(k))
        new = f(None if current is _EXPIRED else current)
        _store.write(k, _ttl_encode(self.ttl_ms, k, new))
        return new

    def clear(self, key: Bytes) -> None:
        """Removes the value for ``key``."""
        _store.write(self._prefix + _bytes(key), None)

    def prefetch(self, keys: Iterable[Bytes]) -> None:
        """Loads the values of all ``keys`` into the call's cache with one
        ``state.get-many``; call it from ``begin_batch`` with ``batch.keys()``."""
        _store.prefetch(_prefixed(self._prefix, keys))

    def __repr__(self) -> str:
        ttl = f", ttl_ms={self.ttl_ms}" if self.ttl_ms else ""
        return f"ValueState({self.name!r}{ttl})"


# -- list state

_WS = b" \t\n\x0c\r"  # what Rust's trim_ascii trims (not \x0b, unlike bytes.strip())


def _append(name: str, current: Optional[bytes], item: bytes) -> bytes:
    """Appends the JSON ``item`` to the JSON array ``current`` without parsing
    the array's elements (byte for byte what the Rust SDK writes)."""
    if current is None:
        return b"[" + item + b"]"
    trimmed = current.strip(_WS)
    if len(trimmed) < 2 or trimmed[:1] != b"[" or trimmed[-1:] != b"]":
        raise Error(f"state `{name}`: stored value is not a JSON array")
    inner = trimmed[1:-1]
    return trimmed[:-1] + (b"," if inner.strip(_WS) else b"") + item + b"]"


class ListState:
    """A list per record key, stored as one JSON array under ``name 0x00 key``.

    :meth:`push` appends to the encoded array without decoding it, but every
    push still copies the whole value: keep lists short, or use
    :class:`MapState`.
    """

    __slots__ = ("name", "_prefix")

    def __init__(self, name: str) -> None:
        self._prefix = _check_name(name) + b"\x00"
        self.name = name

    def key(self, key: Bytes) -> bytes:
        """The host key for record key ``key``: ``name 0x00 key``."""
        return self._prefix + _bytes(key)

    def push(self, key: Bytes, item: Any) -> None:
        """Appends ``item`` to the list for ``key``."""
        k = self._prefix + _bytes(key)
        _store.write(k, _append(self.name, _store.read(k), _json_encode(item)))

    def get(self, key: Bytes) -> List[Any]:
        """The list for ``key``; empty if there is none."""
        raw = _store.read(self._prefix + _bytes(key))
        if raw is None:
            return []
        v = _decode_value(self.name, raw)
        if type(v) is not list:
            raise Error(f"state `{self.name}`: invalid JSON: expected a JSON array")
        return v

    def set(self, key: Bytes, items: Iterable[Any]) -> None:
        """Replaces the list for ``key``."""
        _store.write(self._prefix + _bytes(key), _json_encode(list(items)))

    def clear(self, key: Bytes) -> None:
        """Removes the list for ``key``."""
        _store.write(self._prefix + _bytes(key), None)

    def prefetch(self, keys: Iterable[Bytes]) -> None:
        """Loads the lists for all of ``keys`` with one ``state.get-many``."""
        _store.prefetch(_prefixed(self._prefix, keys))

    def __repr__(self) -> str:
        return f"ListState({self.name!r})"


# -- map state


class MapKey:
    """How a :class:`MapState`'s map keys become bytes (part of the
    cross-language key layout): :attr:`STR` UTF-8, :attr:`BYTES` as is, the
    unsigned integers :attr:`U8` .. :attr:`U128` big-endian, the signed
    :attr:`I8` .. :attr:`I128` big-endian with the sign bit flipped. So a
    map's entries come back in key order, numerically for integers.

    ``MapState(name, key_type=...)`` takes one of these, or ``str``,
    ``bytes`` or ``int`` (:attr:`I64`), or a name such as ``"u32"``.
    """

    __slots__ = ("name", "_kind", "_width", "_offset")

    STR: "MapKey"
    BYTES: "MapKey"
    U8: "MapKey"
    U16: "MapKey"
    U32: "MapKey"
    U64: "MapKey"
    U128: "MapKey"
    I8: "MapKey"
    I16: "MapKey"
    I32: "MapKey"
    I64: "MapKey"
    I128: "MapKey"

    def __init__(self, name: str, kind: str, bits: int = 0, signed: bool = False) -> None:
        self.name = name
        self._kind = kind
        self._width = bits // 8
        self._offset = (1 << (bits - 1)) if signed else 0

    def encode(self, value: Any) -> bytes:
        """The bytes of map key ``value``."""
        kind = self._kind
        if kind == "str":
            if type(value) is not str:
                raise Error(f"map key {value!r} is not a str")
            return value.encode()
        if kind == "bytes":
            if not isinstance(value, (bytes, bytearray, memoryview, str)):
                raise Error(f"map key {value!r} is not bytes")
            return _bytes(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise Error(f"map key {value!r} is not an integer ({self.name})")
        u = int(value) + self._offset
        if not 0 <= u < 1 << (8 * self._width):
            raise Error(f"map key {value} is out of the range of a {self.name}")
        return u.to_bytes(self._width, "big")

    def decode(self, raw: bytes) -> Any:
        """The map key whose bytes are ``raw``."""
        kind = self._kind
        if kind == "str":
            try:
                return raw.decode()
            except UnicodeDecodeError as e:
                raise Error(f"invalid UTF-8: {e}") from None
        if kind == "bytes":
            return bytes(raw)
        if len(raw) != self._width:
            raise Error(f"map key of {len(raw)} bytes is not a {self.name}")
        return int.from_bytes(raw, "big") - self._offset

    @classmethod
    def of(cls, key_type: Any) -> "MapKey":
        """The :class:`MapKey` for ``key_type`` (see the class docs)."""
        if isinstance(key_type, MapKey):
            return key_type
        found = _MAP_KEY_TYPES.get(key_type) if isinstance(key_type, (type, str)) else None
        if found is None:
            raise Error(f"unknown map key type {key_type!r}: use str, bytes, int or a MapKey such as MapKey.U32")
        return found

    def __repr__(self) -> str:
        return f"MapKey.{self.name.upper()}"


MapKey.STR = MapKey("str", "str")
MapKey.BYTES = MapKey("bytes", "bytes")
for _bits in (8, 16, 32, 64, 128):
    setattr(MapKey, f"U{_bits}", MapKey(f"u{_bits}", "int", _bits))
    setattr(MapKey, f"I{_bits}", MapKey(f"i{_bits}", "int", _bits, signed=True))
del _bits
_MAP_KEY_TYPES: Dict[Any, MapKey] = {str: MapKey.STR, bytes: MapKey.BYTES, int: MapKey.I64}
_MAP_KEY_TYPES.update(
    {k.name: k for k in (getattr(MapKey, a) for a in dir(MapKey) if a.isupper()) if isinstance(k, MapKey)}
)

_PAGE = 1024
"""Entries asked for per ``state.scan-prefix`` call."""


class MapState:
    """A map per record key, each entry its own state entry under
    ``name 0x00 u32_be(len(key)) key map_key``, the value as JSON.

    ``key_type`` says how map keys are encoded (:class:`MapKey`; default
    ``str``). Point reads and writes go through the per-call cache like
    :class:`ValueState`; :meth:`entries`, :meth:`keys` and :meth:`clear`
    page through the host's ``scan-prefix`` (1024 entries a call) after
    flushing the call's pending writes. ``ttl_ms`` (or :meth:`with_ttl`)
    gives each entry a time-to-live, as for :class:`ValueState`.
    """

    __slots__ = ("name", "key_type", "ttl_ms", "_name")

    def __init__(self, name: str, key_type: Any = str, ttl_ms: Optional[int] = None) -> None:
        self._name = _check_name(name)
        self.name = name
        self.key_type = MapKey.of(key_type)
        self.ttl_ms = _ttl_ms(name, ttl_ms)

    def with_ttl(self, ttl_ms: int) -> "MapState":
        """The same state with a time-to-live of ``ttl_ms`` per entry (0: none)."""
        return type(self)(self.name, self.key_type, ttl_ms)

    def prefix(self, key: Bytes) -> bytes:
        """``name 0x00 u32_be(len(key)) key``: what all of ``key``'s entries' host keys begin with."""
        k = _bytes(key)
        if len(k) >= 1 << 32:
            raise Error(f"state `{self.name}`: key of {len(k)} bytes is too long for a map key")
        return self._name + b"\x00" + len(k).to_bytes(4, "big") + k

    def key(self, key: Bytes, map_key: Any) -> bytes:
        """The host key of ``map_key`` in ``key``'s map."""
        try:
            return self.prefix(key) + self.key_type.encode(map_key)
        except Error as e:
            if str(e).startswith("state `"):
                raise
            raise Error(f"state `{self.name}`: {e}") from None

    def _decode(self, raw: bytes) -> Any:
        if self.ttl_ms:
            return _ttl_decode(self.name, raw)
        return _decode_value(self.name, raw)

    def get(self, key: Bytes, map_key: Any, default: Any = None) -> Any:
        """The value under ``map_key`` in ``key``'s map, or ``default``."""
        raw = _store.read(self.key(key, map_key))
        if raw is None:
            return default
        v = self._decode(raw)
        return default if v is _EXPIRED else v

    def set(self, key: Bytes, map_key: Any, value: Any) -> None:
        """Stores ``value`` under ``map_key`` in ``key``'s map."""
        k = self.key(key, map_key)
        _store.write(k, _ttl_encode(self.ttl_ms, k, value) if self.ttl_ms else _json_encode(value))

    def remove(self, key: Bytes, map_key: Any) -> None:
        """Removes ``map_key`` from ``key``'s map."""
        _store.write(self.key(key, map_key), None)

    def entries(self, key: Bytes) -> List[Tuple[Any, Any]]:
        """All live entries of ``key``'s map as ``(map_key, value)``, in map-key byte order."""
        out = []
        for map_key, raw in self._scan(key):
            v = self._decode(raw)
            if v is not _EXPIRED:
                out.append((self._decode_key(map_key), v))
        return out

    def keys(self, key: Bytes) -> List[Any]:
        """The map keys of ``key``'s live entries, in byte order."""
        out = []
        for map_key, raw in self._scan(key):
            if not self.ttl_ms or self._decode(raw) is not _EXPIRED:
                out.append(self._decode_key(map_key))
        return out

    def clear(self, key: Bytes) -> None:
        """Removes every entry of ``key``'s map."""
        prefix = self.prefix(key)
        doomed = [prefix + map_key for map_key, _ in self._scan(key)]
        for k in doomed:
            _store.write(k, None)

    def _decode_key(self, raw: bytes) -> Any:
        try:
            return self.key_type.decode(raw)
        except Error as e:
            raise Error(f"state `{self.name}`: {e}") from None

    def _scan(self, key: Bytes) -> Iterator[Tuple[bytes, bytes]]:
        """``(map_key, value)`` of every entry of ``key``'s map, paging through ``scan-prefix``."""
        prefix = self.prefix(key)
        n = len(prefix)
        after: Optional[bytes] = None
        while True:
            page = _store.scan(prefix, after, _PAGE)
            for k, v in page:
                if not k.startswith(prefix) or (after is not None and k <= after):
                    raise Error(
                        "host bug: state.scan-prefix returned a key out of order or outside the prefix "
                        f"(state `{self.name}`)"
                    )
                yield k[n:], v
                after = k
            if len(page) < _PAGE:
                return

    def __repr__(self) -> str:
        ttl = f", ttl_ms={self.ttl_ms}" if self.ttl_ms else ""
        return f"MapState({self.name!r}, key_type={self.key_type!r}{ttl})"


# ---------------------------------------------------------------- windows


@dataclass
class Window:
    """A window that closed: its record key, its bounds and its accumulator."""

    key: bytes
    start: int
    """Its first millisecond."""
    end: int
    """Its end, exclusive."""
    value: Any

    def key_str(self) -> str:
        """The key as UTF-8 text."""
        try:
            return self.key.decode()
        except UnicodeDecodeError as e:
            raise Error(f"invalid UTF-8: {e}") from None


def _timer_record_key(prefix: bytes, timer: Timer) -> Optional[bytes]:
    """The record key a timer of windows whose timer keys begin ``prefix``
    (``name 0x00``) is for, if it is one of theirs: sessions' timers, and
    those of tumbling or hopping windows stored per key by an earlier SDK."""
    if timer.clock.value != 0 or not timer.key.startswith(prefix):
        return None
    return timer.key[len(prefix) :]


def _check_timestamp(ts: Any) -> None:
    if type(ts) is not int or not I64_MIN <= ts <= I64_MAX:
        raise Error(f"timestamp {ts!r} is not an integer number of ms in the s64 range")


def _timestamp_of(record: "Record") -> int:
    ts = record.timestamp
    if ts is None:
        raise Error(
            f"record {record.topic}-{record.partition}@{record.offset} has no timestamp, "
            "so it falls in no event-time window"
        )
    return ts


WINDOWS_PER_FIRING = 64
"""How many windows one firing of a window end's timer closes at most
(:meth:`Windows.fire`); it sets a timer for the rest (``name 0x01 last-key``,
at the same time), which fire in the host's next round. Below the host's
default limit of 100 outputs per fired timer."""

_CONTINUED = 0x01
"""The byte after the name in the key of the timer that goes on with a window
end's windows after the last key a firing closed (``name 0x01 key``);
distinct from the ``name 0x00 key`` of per-key timers."""


class Windows:
    """Tumbling or hopping event-time windows per record key, each with an
    accumulator (stored as JSON).

    Each window of a key keeps one accumulator that :meth:`add` folds each
    record into. Each window *end* has one event-time timer at
    ``end - 1 + allowed lateness``, whatever the number of keys (Flink and
    Kafka Streams keep one per key and window: here a window's keys cost no
    timer each, to set, checkpoint, log and fire). When it fires,
    :meth:`fire` in ``on_timer`` turns it into the closed windows
    (:class:`Window`) of that end and removes their state,
    :data:`WINDOWS_PER_FIRING` at a time: each window's result comes out
    once. Create them with :meth:`tumbling` or :meth:`hopping`.

    State layout (as the Rust SDK's): window ``start`` of key ``k`` is the
    :class:`MapState` entry (``name``, ``start`` as an ``i64`` map key's 8
    bytes, ``k`` as the map key), that is
    ``name 0x00 00 00 00 08 i64_key(start) k``, so one window's keys are one
    key range; its timers are event-time timers with the key ``name``, one
    per window end, at ``end - 1 + allowed lateness``. A firing takes the
    range's first :data:`WINDOWS_PER_FIRING` entries in key order and, if
    more remain, sets an event-time timer ``name 0x01 last-key`` at the same
    time, whose firing goes on after that key. (Earlier SDKs stored
    (``name``, ``k``, ``start``) with a timer ``name 0x00 k`` per key;
    :meth:`fire` still closes such a window, once.)
    """

    __slots__ = (
        "name",
        "size_ms",
        "slide_ms",
        "lateness_ms",
        "_state",
        "_stored_per_key",
        "_timer_key",
        "_timer_prefix",
    )

    def __init__(self, name: str, size_ms: int, slide_ms: Optional[int] = None, allowed_lateness_ms: int = 0) -> None:
        # Per window start (its i64 map-key bytes in the record key's place),
        # the accumulator of each record key (the map key).
        self._state = MapState(name, MapKey.BYTES)
        # The layout of earlier SDKs: per record key, the accumulator of each
        # window start (an i64 map key).
        self._stored_per_key = MapState(name, MapKey.I64)
        self.name = name
        self.size_ms = _millis(f"windows `{name}`: the size", size_ms)
        self.slide_ms = self.size_ms if slide_ms is None else _millis(f"windows `{name}`: the slide", slide_ms)
        self.lateness_ms = _millis(f"windows `{name}`: the allowed lateness", allowed_lateness_ms)
        if self.size_ms <= 0 or self.slide_ms <= 0 or self.slide_ms > self.size_ms:
            raise Error(f"windows `{name}`: the size and slide must be positive, and the slide at most the size")
        self._timer_key = self._state._name
        self._timer_prefix = self._timer_key + b"\x00"

    @classmethod
    def tumbling(cls, name: str, size_ms: int) -> "Windows":
        """Windows ``[k * size, (k + 1) * size)`` named ``name`` (unique among
        the transform's states and windows)."""
        return cls(name, size_ms)

    @classmethod
    def hopping(cls, name: str, size_ms: int, slide_ms: int) -> "Windows":
        """Windows of ``size_ms`` starting every ``slide_ms``: a record falls
        in ``size / slide`` of them (rounded up)."""
        return cls(name, size_ms, slide_ms)

    def allowed_lateness(self, ms: int) -> "Windows":
        """The same windows, staying open ``ms`` after the watermark passes
        their end (default 0) for late records; each still fires once."""
        return type(self)(self.name, self.size_ms, self.slide_ms, ms)

    def _fires_at(self, start: int) -> int:
        return _sat(_sat(_sat(start + self.size_ms) - 1) + self.lateness_ms)

    def _start_of(self, at: int) -> int:
        """The start of the window whose timer is set for ``at``."""
        return _sat(_sat(_sat(at - self.lateness_ms) + 1) - self.size_ms)

    def _window_prefix(self, start: int) -> bytes:
        """``name 0x00 u32_be(8) i64_key(start)``: the first bytes of every
        accumulator of the window starting at ``start``, which are followed
        by the record key."""
        return self._state.prefix(MapKey.I64.encode(start))

    def add(self, key: Bytes, timestamp: int, fold: Callable[[Any], Any]) -> int:
        """Folds a record at ``timestamp`` of ``key`` into every open window
        that holds it (``fold`` gets the window's accumulator, ``None`` for a
        new one, and returns the new one); returns how many took it: 0 when
        all of them have fired already (the record is too late for them)."""
        k = _bytes(key)
        _check_timestamp(timestamp)
        size, slide = self.size_ms, self.slide_ms
        w = watermark()
        start = _sat((timestamp // slide) * slide)
        floor = _sat(timestamp - size)
        name = self.name
        added = 0
        while start > floor:
            fires_at = self._fires_at(start)
            if w is None or fires_at > w:
                entry = self._window_prefix(start) + k
                raw = _store.read(entry)
                _store.write(entry, _json_encode(fold(None if raw is None else _decode_value(name, raw))))
                # One timer per window end, whatever the keys: set with a
                # window's first accumulator (once per call), and firing it
                # closes every key's window of that start.
                if raw is None:
                    _set_once_per_call(Timer(Clock.EVENT, self._timer_key, fires_at))
                added += 1
            start = _sat(start - slide)
        return added

    def add_record(self, record: "Record", fold: Callable[[Any], Any]) -> int:
        """:meth:`add` for a record: its key (``key_or_empty()``) and its
        timestamp (an :class:`Error` if it has none)."""
        return self.add(record.key_or_empty(), _timestamp_of(record), fold)

    def fire(self, timer: Timer) -> List[Window]:
        """If ``timer`` is one of these windows' timers, the windows it
        closes, whose state is removed, in key byte order: at most
        :data:`WINDOWS_PER_FIRING`; the rest come from a timer this sets at
        the same time (``name 0x01 last-key``), in the host's next round.
        Empty for any other timer (another window's, or one the transform
        set itself)."""
        if timer.clock.value != 0:
            return []
        # The window end's timer, or the one that goes on after the key the
        # previous firing of that end stopped at.
        name = self._timer_key
        key = timer.key
        if not key.startswith(name):
            return self._fire_stored_per_key(timer)
        rest = key[len(name) :]
        if not rest:
            last = None
        elif rest[0] == _CONTINUED:
            last = rest[1:]
        else:
            return self._fire_stored_per_key(timer)
        start = self._start_of(timer.at)
        end = _sat(start + self.size_ms)
        prefix = self._window_prefix(start)
        n = len(prefix)
        # From after the last key fired, not from the range's start: the
        # windows fired before are deletions there until the checkpoint
        # folds them, and passing over them again, page after page, would
        # cost a window end with n keys O(n^2 / 64).
        after = None if last is None else prefix + last
        page = _store.scan(prefix, after, WINDOWS_PER_FIRING + 1)
        closed = []
        for entry, raw in page[:WINDOWS_PER_FIRING]:
            if not entry.startswith(prefix):
                raise Error(
                    f"host bug: state.scan-prefix returned a key outside the prefix (windows `{self.name}`)"
                )
            closed.append(Window(entry[n:], start, end, _decode_value(self.name, raw)))
            _store.write(entry, None)
        if len(page) > WINDOWS_PER_FIRING and closed:
            Timer(Clock.EVENT, name + bytes((_CONTINUED,)) + closed[-1].key, timer.at).set()
        return closed

    def _fire_stored_per_key(self, timer: Timer) -> List[Window]:
        """A timer ``name 0x00 key`` of a window that an earlier SDK stored
        per key (``name``, key, start): closes that window alone, so that
        windows open across an upgrade are not lost."""
        key = _timer_record_key(self._timer_prefix, timer)
        if key is None:
            return []
        start = self._start_of(timer.at)
        value = self._stored_per_key.get(key, start, _UNSET)
        if value is _UNSET:
            return []
        self._stored_per_key.remove(key, start)
        return [Window(key, start, _sat(start + self.size_ms), value)]

    def __repr__(self) -> str:
        return f"Windows({self.name!r}, size_ms={self.size_ms}, slide_ms={self.slide_ms}, lateness_ms={self.lateness_ms})"


class SessionWindows:
    """Session windows per record key: records less than ``gap_ms`` apart
    form one session ``[first, last + gap)``, closed when the watermark
    passes its end (plus the allowed lateness); a record that bridges two
    sessions merges them.

    A key's open sessions are one :class:`ValueState` JSON array of
    ``{"start", "end", "value"}``; each session has an event-time timer with
    the key ``name 0x00 key`` at ``end - 1 + allowed lateness``.
    """

    __slots__ = ("name", "gap_ms", "lateness_ms", "_state", "_timer_prefix")

    def __init__(self, name: str, gap_ms: int, allowed_lateness_ms: int = 0) -> None:
        self._state = ValueState(name)
        self.name = name
        self.gap_ms = _millis(f"sessions `{name}`: the gap", gap_ms)
        self.lateness_ms = _millis(f"sessions `{name}`: the allowed lateness", allowed_lateness_ms)
        if self.gap_ms <= 0:
            raise Error(f"sessions `{name}`: the gap must be positive")
        self._timer_prefix = self._state._prefix

    def allowed_lateness(self, ms: int) -> "SessionWindows":
        """The same sessions, staying open ``ms`` after the watermark passes
        their end (default 0)."""
        return type(self)(self.name, self.gap_ms, ms)

    def _fires_at(self, end: int) -> int:
        return _sat(_sat(end - 1) + self.lateness_ms)

    def _sessions(self, key: bytes) -> List[Dict[str, Any]]:
        sessions = self._state.get(key)
        if sessions is None:
            return []
        if type(sessions) is not list or not all(
            type(s) is dict and type(s.get("start")) is int and type(s.get("end")) is int and "value" in s
            for s in sessions
        ):
            raise Error(f'state `{self.name}`: invalid JSON: expected an array of {{"start", "end", "value"}}')
        return sessions

    def add(
        self,
        key: Bytes,
        timestamp: int,
        fold: Callable[[Any], Any],
        merge: Callable[[Any, Any], Any],
    ) -> bool:
        """Folds a record at ``timestamp`` of ``key`` into its session: a new
        one (``fold(None)``), the one it extends, or (when it bridges
        several) their merge, combined pairwise with ``merge(a, b)``.
        Returns ``False`` if the session it would open has fired already
        (the record is too late)."""
        k = _bytes(key)
        _check_timestamp(timestamp)
        start, end = timestamp, _sat(timestamp + self.gap_ms)
        w = watermark()
        if w is not None and self._fires_at(end) <= w:
            return False
        touching, rest = [], []
        for s in self._sessions(k):
            (touching if s["start"] < end and start < s["end"] else rest).append(s)
        timer_key = self._timer_prefix + k
        merged: Optional[Dict[str, Any]] = None
        for s in touching:
            Timer(Clock.EVENT, timer_key, self._fires_at(s["end"])).delete()
            if merged is None:
                merged = s
            else:
                merged = {
                    "start": min(merged["start"], s["start"]),
                    "end": max(merged["end"], s["end"]),
                    "value": merge(merged["value"], s["value"]),
                }
        if merged is None:
            session = {"start": start, "end": end, "value": fold(None)}
        else:
            session = {
                "start": min(merged["start"], start),
                "end": max(merged["end"], end),
                "value": fold(merged["value"]),
            }
        Timer(Clock.EVENT, timer_key, self._fires_at(session["end"])).set()
        rest.append(session)
        rest.sort(key=lambda s: s["start"])
        self._state.set(k, [{"start": s["start"], "end": s["end"], "value": s["value"]} for s in rest])
        return True

    def add_record(self, record: "Record", fold: Callable[[Any], Any], merge: Callable[[Any, Any], Any]) -> bool:
        """:meth:`add` for a record: its key (``key_or_empty()``) and its
        timestamp (an :class:`Error` if it has none)."""
        return self.add(record.key_or_empty(), _timestamp_of(record), fold, merge)

    def fire(self, timer: Timer) -> Optional[Window]:
        """If ``timer`` is one of these sessions' timers, the session it
        closes, whose state is removed; ``None`` for any other timer."""
        key = _timer_record_key(self._timer_prefix, timer)
        if key is None:
            return None
        closed, still_open = [], []
        for s in self._sessions(key):
            (closed if self._fires_at(s["end"]) == timer.at else still_open).append(s)
        if not closed:
            return None
        if still_open:
            self._state.set(key, [{"start": s["start"], "end": s["end"], "value": s["value"]} for s in still_open])
        else:
            self._state.clear(key)
        s = closed[0]
        return Window(key, s["start"], s["end"], s["value"])

    def __repr__(self) -> str:
        return f"SessionWindows({self.name!r}, gap_ms={self.gap_ms}, lateness_ms={self.lateness_ms})"


# ---------------------------------------------------------------- logging

TRACE, DEBUG, INFO, WARN, ERROR = range(5)


def log(level: int, message: str) -> None:
    """One line in the host's log (one boundary crossing: keep it off the
    per-record path). ``level`` is one of ``TRACE`` .. ``ERROR``."""
    if IN_COMPONENT:
        _wit_log.log(_wit_log.Level(level), str(message))
    else:
        print(f"[{('trace', 'debug', 'info', 'warn', 'error')[level]}] {message}", file=sys.stderr)


def trace(message: str) -> None:
    log(TRACE, message)


def debug(message: str) -> None:
    log(DEBUG, message)


def info(message: str) -> None:
    log(INFO, message)


def warn(message: str) -> None:
    log(WARN, message)


def error(message: str) -> None:
    log(ERROR, message)


# ---------------------------------------------------------------- transform


class Transform:
    """Base class of a transform. Override what you need; ``process`` is required.

    The instance is created once per guest instance with the job's
    :class:`Config` (an exception fails the job). Attributes must not hold
    anything a replay would need: keep that in state.
    """

    def __init__(self, config: Config) -> None:
        pass

    def begin_batch(self, batch: Batch) -> None:
        """Before the batch's first record: the place to ``prefetch``."""

    def process(self, record: Record, out: Emitter) -> None:
        """Transforms one record, emitting any number of outputs."""
        raise NotImplementedError("process")

    def end_batch(self, out: Emitter) -> None:
        """After the batch's last record, before state is written back."""

    def on_timer(self, timer: Timer, out: Emitter) -> None:
        """Called for each due timer of the shard, in time order: an
        event-time timer once the watermark reaches its time, a
        processing-time one once the host's clock does. The timer is already
        removed; set it again to fire again. State is written back after the
        call's last timer, as for a batch; an exception fails the call (the
        host restarts the task from its last checkpoint and the timers fire
        again). Time-to-live timers never get here. Does nothing by default."""

    def migrate(self, from_module: str) -> None:
        """Called once per shard after the job was upgraded to this module,
        after ``__init__`` and before the first batch, with the sha256 (hex)
        of the module that wrote the state: the place to rewrite old state in
        this module's layout. Its writes are part of the next checkpoint; if
        the task restarts before that commits, it runs again over the old
        state. Keeps the state as it is by default."""


def _message(e: BaseException) -> str:
    if isinstance(e, Error):
        return str(e)
    if isinstance(e, Err):
        return str(e.value)
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _debug_str(b: bytes) -> str:
    """``b`` as Rust's ``{:?}`` shows ``String::from_utf8_lossy(b)``."""
    out = []
    for ch in b.decode(errors="replace"):
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\0":
            out.append("\\0")
        elif ch in "\t\r\n":
            out.append({"\t": "\\t", "\r": "\\r", "\n": "\\n"}[ch])
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _shard_of(batch: List[Record]) -> Optional[int]:
    """The shard a batch's state calls are scoped to: its records'
    partition (``None`` for an empty batch)."""
    if not batch:
        return None
    partition = batch[0].partition
    return partition if 0 <= partition <= 0xFFFFFFFF else None


def export(cls: type) -> type:
    """Makes ``cls`` (a :class:`Transform` subclass) the component's
    implementation of world ``packed-out`` (and of ``timed``, its older
    subset): assign the result to ``WitWorld`` at module level. A host calls
    ``process-packed-out`` for every batch; ``process`` and
    ``process-packed`` are there for older hosts."""

    slot: List[Any] = [None]

    def instance(name: str, shard: Optional[int] = None) -> Any:
        """The transform, for a call of ``name`` (of ``shard``'s batch, whose
        state the store may hold)."""
        t = slot[0]
        if t is None:
            raise Err(f"{name} called before init")
        _store.begin(shard)
        _new_call()
        return t

    def unpack(batch: bytes) -> List[Record]:
        try:
            return _unpack_batch(batch)
        except Error as e:
            raise Err(str(e)) from None

    def run(t: Any, batch: List[Record], pack: Callable[[List[_Output]], Any]) -> Any:
        """One batch through ``t``: its outputs converted by ``pack``, once
        the state is written back. Outputs that cannot be converted (say, a
        topic that is not text) fail the batch before any state is written."""
        records = Batch(batch)
        out = Emitter()
        stage: Any = "begin_batch"
        try:
            t.begin_batch(records)
            process = t.process
            for r in batch:
                stage = r
                process(r, out)
            stage = "end_batch"
            t.end_batch(out)
            stage = "outputs"
            outputs = pack(out.records)
            stage = None
            _store.end()
        except Exception as e:  # noqa: BLE001
            _store.discard()
            if isinstance(stage, Record):
                stage = f"record {stage.topic}-{stage.partition}@{stage.offset}"
            msg = _message(e)
            raise Err(f"{stage}: {msg}" if stage else msg) from None
        return outputs

    class WitWorld:
        def init(self, config: List[Tuple[str, str]]) -> None:
            _store.discard()
            _new_call()
            try:
                instance = cls(Config(config))
                _store.finish()  # state touched in __init__: the host refuses it (state belongs to an input partition)
            except Exception as e:  # noqa: BLE001 - every failure is a message
                _store.discard()
                raise Err(_message(e)) from None
            slot[0] = instance

        def process(self, batch: List[Any]) -> List[Any]:
            return run(instance("process"), [Record._from_wit(r) for r in batch], _to_wit)

        def process_packed(self, batch: bytes) -> List[Any]:
            records = unpack(batch)
            return run(instance("process-packed", _shard_of(records)), records, _to_wit)

        def process_packed_out(self, batch: bytes) -> bytes:
            records = unpack(batch)
            return run(instance("process-packed-out", _shard_of(records)), records, _pack_outputs)

        def hold_state(self, max_bytes: int) -> None:
            """The host will call ``flush_state`` before it reads the state:
            a shard's cache may stay from batch to batch, ``max_bytes`` in all."""
            _store.hold(max_bytes)

        def flush_state(self, shard: int) -> None:
            """Writes back what is held of ``shard`` and forgets it."""
            try:
                _store.give_back(shard)
            except Exception as e:  # noqa: BLE001
                _store.discard()
                raise Err(_message(e)) from None

        def on_timers(self, fired: List[Any]) -> List[Any]:
            t = instance("on-timers")
            out = Emitter()
            timer: Optional[Timer] = None
            try:
                on_timer = t.on_timer
                for w in fired:
                    this = _timer_from_wit(w)
                    if _expire(this):  # the SDK's own time-to-live timers
                        continue
                    timer = this
                    on_timer(this, out)
                    timer = None
                outputs = _to_wit(out.records)
                _store.finish()
            except Exception as e:  # noqa: BLE001
                _store.discard()
                msg = _message(e)
                if timer is not None:
                    clock = _CLOCK_NAMES.get(timer.clock.value, str(timer.clock))
                    msg = f"timer {clock} {_debug_str(timer.key)}@{timer.at}: {msg}"
                raise Err(msg) from None
            return outputs

        def migrate(self, from_module: str) -> None:
            t = instance("migrate")
            try:
                t.migrate(from_module)
                _store.finish()
            except Exception as e:  # noqa: BLE001
                _store.discard()
                raise Err(_message(e)) from None

    WitWorld.__name__ = WitWorld.__qualname__ = "WitWorld"
    WitWorld.transform = cls  # type: ignore[attr-defined]
    return WitWorld
