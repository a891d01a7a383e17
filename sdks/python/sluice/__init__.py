"""Write sluice transforms in Python.

A sluice transform is a WebAssembly component (world ``sluice:transform/transform``,
``wit/sluice.wit``) that the host feeds batches of Kafka records; it returns the
records to write and keeps keyed state that the host checkpoints exactly once.
This module is the Python counterpart of the Rust crate ``sluice-guest``: it hides
the generated componentize-py bindings behind a small API.

- :class:`Transform`: subclass it (``__init__(config)``, ``begin_batch``,
  ``process``, ``end_batch``), then ``WitWorld = export(MyTransform)``.
- :class:`Record` and :class:`Batch` to read input, :class:`Emitter` to write.
- :class:`Config` for the job's settings.
- :class:`ValueState`: one JSON value per record key, cached per batch.
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
exception ``<Type>: <message>``).

State and key layout: identical to the Rust SDK, so a job can switch language
and keep its state. A :class:`ValueState` named ``name`` stores the value for
record key ``k`` under host key ``name + b"\\x00" + k``, as compact JSON text
(``json.dumps(v, separators=(",", ":"), ensure_ascii=False)``, which is also
what serde_json writes for integers, strings, lists and objects). A write-back
cache sits in front of the host for the length of one batch: reads hit the
host at most once per key (``prefetch`` loads many keys with one
``state.get-many``), writes stay in the guest until the batch ends, and
nothing is cached across batches because the host may roll state back
between them.

Outside a component (plain CPython, e.g. unit tests) the module runs against
an in-memory state store and prints log lines to stderr; see
``sdks/python/tests``.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

try:  # Inside the component: the bindings componentize-py generates.
    from componentize_py_types import Err
    from wit_world.imports import log as _wit_log
    from wit_world.imports import state as _wit_state
    from wit_world.imports.types import Header as _Header
    from wit_world.imports.types import OutputRecord as _OutputRecord

    IN_COMPONENT = True
except ImportError:  # Plain CPython: stand-ins with the same shapes.
    from dataclasses import dataclass

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

__all__ = [
    "Batch",
    "Config",
    "Emitter",
    "Error",
    "Record",
    "Transform",
    "ValueState",
    "debug",
    "error",
    "export",
    "info",
    "log",
    "trace",
    "warn",
]

Bytes = Union[bytes, bytearray, memoryview, str]
"""Keys and values the helpers accept: ``str`` is encoded as UTF-8."""


def _bytes(b: Bytes) -> bytes:
    t = type(b)
    if t is bytes:
        return b
    if t is str:
        return b.encode()  # type: ignore[union-attr]
    return bytes(b)  # type: ignore[arg-type]


class Error(Exception):
    """A failure whose message is reported as is (no exception type prefix)."""


# ---------------------------------------------------------------- records


class Record:
    """One input record (wraps the WIT ``input-record`` without copying).

    ``key`` and ``value`` are ``bytes`` or ``None`` (no key / tombstone).
    """

    __slots__ = ("_r",)

    def __init__(self, inner: Any) -> None:
        self._r = inner

    @property
    def key(self) -> Optional[bytes]:
        """The key, or ``None`` for a record produced without one."""
        return self._r.key

    def key_or_empty(self) -> bytes:
        """The key, or ``b""`` for records without one."""
        k = self._r.key
        return b"" if k is None else k

    def key_str(self) -> str:
        """The key as UTF-8 text; :class:`Error` if there is none."""
        if self._r.key is None:
            raise Error("record has no key")
        return self._r.key.decode()

    @property
    def value(self) -> Optional[bytes]:
        """The value, or ``None`` for a tombstone."""
        return self._r.value

    def is_tombstone(self) -> bool:
        """Whether the record has no value."""
        return self._r.value is None

    def value_str(self) -> str:
        """The value as UTF-8 text; :class:`Error` for a tombstone."""
        if self._r.value is None:
            raise Error("record has no value (tombstone)")
        return self._r.value.decode()

    def json(self) -> Any:
        """The value decoded from JSON; :class:`Error` for a tombstone or bad JSON."""
        if self._r.value is None:
            raise Error("record has no value (tombstone)")
        try:
            return json.loads(self._r.value)
        except ValueError as e:
            raise Error(f"invalid JSON: {e}") from None

    @property
    def headers(self) -> List[Tuple[str, bytes]]:
        """The headers in record order, as ``(key, value)`` pairs."""
        return [(h.key, h.value) for h in self._r.headers]

    def header(self, name: str) -> Optional[bytes]:
        """The value of the last header called ``name`` (as Kafka's ``lastHeader``)."""
        for h in reversed(self._r.headers):
            if h.key == name:
                return h.value
        return None

    @property
    def timestamp(self) -> Optional[int]:
        """Milliseconds since the Unix epoch, if the record has a timestamp."""
        return self._r.timestamp

    @property
    def topic(self) -> str:
        return self._r.topic

    @property
    def partition(self) -> int:
        return self._r.partition

    @property
    def offset(self) -> int:
        return self._r.offset

    def __repr__(self) -> str:
        return f"Record({self.topic}-{self.partition}@{self.offset}, key={self.key!r}, value={self.value!r})"


class Batch:
    """The records of one ``process`` call, in input order (iterable, indexable)."""

    __slots__ = ("records",)

    def __init__(self, records: List[Record]) -> None:
        self.records = records

    def keys(self) -> List[bytes]:
        """Every record's :meth:`Record.key_or_empty`, repeats included: what
        :meth:`ValueState.prefetch` expects."""
        return [r.key_or_empty() for r in self.records]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> Record:
        return self.records[i]


class Emitter:
    """Collects a batch's output records; emitting never crosses into the host."""

    __slots__ = ("records",)

    def __init__(self) -> None:
        self.records: List[Any] = []

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
        self.records.append(
            _OutputRecord(
                key if key is None or type(key) is bytes else _bytes(key),
                value if value is None or type(value) is bytes else _bytes(value),
                [_Header(k, _bytes(v)) for k, v in headers] if headers else [],
                topic,
            )
        )

    def emit_json(self, key: Optional[Bytes], value: Any, **kwargs: Any) -> None:
        """Like :meth:`emit`, with the value encoded as compact JSON."""
        self.emit(key, _json_encode(value), **kwargs)

    def forward(self, record: Record, topic: Optional[str] = None) -> None:
        """Writes ``record``'s key, value and headers unchanged."""
        r = record._r
        self.records.append(_OutputRecord(r.key, r.value, list(r.headers), topic))

    def __len__(self) -> int:
        return len(self.records)


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


# ---------------------------------------------------------------- state


class _Memory:
    """In-memory stand-in for the host's ``state`` interface (plain CPython)."""

    def __init__(self) -> None:
        self.map: Dict[bytes, bytes] = {}
        self.calls = {"get": 0, "get_many": 0, "write": 0}

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


class _Store:
    """The per-batch write-back cache in front of the host's ``state``.

    ``values`` holds every key read or written during the batch (``None``:
    absent or deleted); ``dirty`` (insertion-ordered, so writes are
    deterministic) the keys the host has yet to hear about.
    """

    __slots__ = ("backend", "values", "dirty")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.values: Dict[bytes, Optional[bytes]] = {}
        self.dirty: Dict[bytes, None] = {}

    def read(self, key: bytes) -> Optional[bytes]:
        values = self.values
        if key in values:
            return values[key]
        v = self.backend.get(key)
        values[key] = v
        return v

    def prefetch(self, keys: Iterable[bytes]) -> None:
        values = self.values
        missing = [k for k in dict.fromkeys(keys) if k not in values]
        if not missing:
            return
        got = self.backend.get_many(missing)
        if len(got) != len(missing):
            raise Error(f"host bug: state.get-many returned {len(got)} values for {len(missing)} keys")
        values.update(zip(missing, got))

    def write(self, key: bytes, value: Optional[bytes]) -> None:
        if key not in self.dirty:
            if key in self.values and self.values[key] == value:
                return  # the host already has exactly this
            self.dirty[key] = None
        self.values[key] = value

    def finish(self) -> None:
        """Ends a batch: one ``state.write`` with every dirty entry, then forgets all."""
        if self.dirty:
            values = self.values
            entries = [(k, values[k]) for k in self.dirty]
            self.dirty = {}
            self.values = {}
            self.backend.write(entries)
        else:
            self.values.clear()

    def discard(self) -> None:
        """Ends a failed batch: drops the cache and its unflushed writes."""
        self.values = {}
        self.dirty = {}


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


class ValueState:
    """One JSON value per record key, stored under ``name 0x00 key``.

    Create it once at module level (it is only a name). Keys may be ``bytes``
    or ``str`` (UTF-8); values anything ``json`` can encode. Every call goes
    through the per-batch cache, so only ``prefetch`` and cache misses cross
    into the host.
    """

    __slots__ = ("name", "_prefix")

    def __init__(self, name: str) -> None:
        if not name:
            raise Error("state name must not be empty")
        if "\0" in name:
            raise Error(f"state name {name!r} must not contain a 0x00 byte")
        self.name = name
        self._prefix = name.encode() + b"\x00"

    def key(self, key: Bytes) -> bytes:
        """The host key for record key ``key``: ``name 0x00 key``."""
        return self._prefix + _bytes(key)

    def _decode(self, raw: Optional[bytes]) -> Any:
        if raw is None:
            return None
        try:
            return _json_decode(raw)
        except ValueError as e:
            raise Error(f"state `{self.name}`: invalid JSON: {e}") from None

    def get(self, key: Bytes, default: Any = None) -> Any:
        """The value for ``key``, or ``default`` when there is none."""
        raw = _store.read(self._prefix + _bytes(key))
        return default if raw is None else self._decode(raw)

    def set(self, key: Bytes, value: Any) -> None:
        """Stores ``value`` for ``key``."""
        _store.write(self._prefix + _bytes(key), _json_encode(value))

    def update(self, key: Bytes, f: Callable[[Any], Any]) -> Any:
        """Replaces the value for ``key`` with ``f(current)`` (``current`` is
        ``None`` when absent) and returns the new value."""
        k = self._prefix + (key if type(key) is bytes else _bytes(key))
        values = _store.values  # the hot path: inlined cache hit
        raw = values[k] if k in values else _store.read(k)
        new = f(None if raw is None else self._decode(raw))
        _store.write(k, _json_encode(new))
        return new

    def clear(self, key: Bytes) -> None:
        """Removes the value for ``key``."""
        _store.write(self._prefix + _bytes(key), None)

    def prefetch(self, keys: Iterable[Bytes]) -> None:
        """Loads the values of all ``keys`` into the batch's cache with one
        ``state.get-many``; call it from ``begin_batch`` with ``batch.keys()``."""
        p = self._prefix
        _store.prefetch([p + _bytes(k) for k in keys])

    def __repr__(self) -> str:
        return f"ValueState({self.name!r})"


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


def _message(e: BaseException) -> str:
    if isinstance(e, Error):
        return str(e)
    if isinstance(e, Err):
        return str(e.value)
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def export(cls: type) -> type:
    """Makes ``cls`` (a :class:`Transform` subclass) the component's
    implementation: assign the result to ``WitWorld`` at module level."""

    slot: List[Any] = [None]

    class WitWorld:
        def init(self, config: List[Tuple[str, str]]) -> None:
            _store.discard()
            try:
                instance = cls(Config(config))
                _store.finish()  # state touched in __init__: the host refuses it (state belongs to an input partition)
            except Exception as e:  # noqa: BLE001 - every failure is a message
                _store.discard()
                raise Err(_message(e)) from None
            slot[0] = instance

        def process(self, batch: List[Any]) -> List[Any]:
            t = slot[0]
            if t is None:
                raise Err("process called before init")
            records = Batch([Record(r) for r in batch])
            out = Emitter()
            _store.discard()
            stage = "begin_batch"
            try:
                t.begin_batch(records)
                process = t.process
                for r in records.records:
                    stage = r
                    process(r, out)
                stage = "end_batch"
                t.end_batch(out)
                stage = None
                _store.finish()
            except Exception as e:  # noqa: BLE001
                _store.discard()
                if isinstance(stage, Record):
                    stage = f"record {stage.topic}-{stage.partition}@{stage.offset}"
                msg = _message(e)
                raise Err(f"{stage}: {msg}" if stage else msg) from None
            return out.records

    WitWorld.__name__ = WitWorld.__qualname__ = "WitWorld"
    WitWorld.transform = cls  # type: ignore[attr-defined]
    return WitWorld
