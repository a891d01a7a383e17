"""Helpers shared by the SDK's tests: records as ``sluice exec`` builds them,
and a host simulation of ``sluice exec`` (one input partition, no
out-of-orderness) that drives an exported ``WitWorld`` through batches,
watermark and clock lines and timer firings, as host/src/exec.rs does."""

import importlib.util
import json
import os
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

sys.dont_write_bytecode = True  # no __pycache__ next to the SDK
ROOT = Path(__file__).resolve().parents[3]
# SLUICE_PY_SDK: a folder holding a copy of the `sluice` package with the C
# core built into it (test.sh's second run); by default the source tree's.
sys.path.insert(0, os.environ.get("SLUICE_PY_SDK") or str(ROOT / "sdks" / "python"))

import sluice  # noqa: E402
from sluice import testing  # noqa: E402


def reset():
    """A fresh in-memory state store and simulated clock."""
    testing.reset_state()
    testing.reset()


def backend():
    return sluice._store.backend


def input_record(line, offset, topic="input", partition=0):
    """One WIT input-record from a testdata line, as ``sluice exec`` builds it."""
    j = json.loads(line) if isinstance(line, str) else line
    enc = lambda v: None if v is None else v.encode()  # noqa: E731
    return SimpleNamespace(
        key=enc(j.get("key")), value=enc(j.get("value")), headers=[], timestamp=j.get("timestamp"),
        topic=topic, partition=partition, offset=offset,
    )


def pack_batch(records):
    """A ``packed-batch`` (wit/sluice.wit) of WIT input-records of one
    partition, as the host packs it (host/src/runtime/packed.rs)."""
    topics = list(dict.fromkeys(r.topic for r in records))
    parts = [struct.pack("<iI", records[0].partition if records else 0, len(topics))]
    for t in topics:
        parts.append(struct.pack("<I", len(t.encode())) + t.encode())
    parts.append(struct.pack("<I", len(records)))
    for r in records:
        flags = (r.key is not None) | (r.value is not None) << 1 | (r.timestamp is not None) << 2
        parts.append(struct.pack("<BIq", flags, topics.index(r.topic), r.offset))
        if r.timestamp is not None:
            parts.append(struct.pack("<q", r.timestamp))
        for b in (r.key, r.value):
            if b is not None:
                parts.append(struct.pack("<I", len(b)) + b)
        parts.append(struct.pack("<I", len(r.headers)))
        for h in r.headers:
            parts.append(struct.pack("<I", len(h.key.encode())) + h.key.encode() + struct.pack("<I", len(h.value)) + h.value)
    return b"".join(parts)


def unpack_outputs(packed):
    """The records of a ``packed-outputs`` string, as output-record shapes."""
    at = 0

    def take(n):
        nonlocal at
        assert at + n <= len(packed), f"packed outputs cut short at byte {at}"
        part = packed[at : at + n]
        at += n
        return part

    def sized():
        return take(struct.unpack("<I", take(4))[0])

    out = []
    for _ in range(struct.unpack("<I", take(4))[0]):
        flags = take(1)[0]
        assert flags < 8, f"unknown flags {flags}"
        topic = sized().decode() if flags & 4 else None
        key = sized() if flags & 1 else None
        value = sized() if flags & 2 else None
        headers = [SimpleNamespace(key=sized().decode(), value=sized()) for _ in range(struct.unpack("<I", take(4))[0])]
        out.append(SimpleNamespace(key=key, value=value, headers=headers, topic=topic))
    assert at == len(packed), f"{len(packed) - at} bytes after the last record"
    return out


def process(world, batch, packed):
    """One batch through ``world``: as a list of records, or packed both ways
    (``process-packed-out``, what a host of 0.1.5 calls)."""
    if packed:
        return unpack_outputs(world.process_packed_out(pack_batch(batch)))
    return world.process(batch)


def wit_timer(timer):
    """A timer in the shape the generated bindings hand over (``clock`` an enum)."""
    return SimpleNamespace(clock=SimpleNamespace(value=timer.clock.value), key=timer.key, at=timer.at)


def output_line(r):
    dec = lambda v: None if v is None else v.decode()  # noqa: E731
    d = {} if r.key is None else {"key": dec(r.key)}
    d["value"] = dec(r.value)
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False)


def load_world(example_dir):
    """The ``WitWorld`` instance of an example's app.py."""
    name = Path(example_dir).name.replace("-", "_") + "_app"
    spec = importlib.util.spec_from_file_location(name, Path(example_dir) / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WitWorld()


def parse_args(example_dir):
    """``--batch-size`` and ``--config k=v`` from an example's testdata/args."""
    path = Path(example_dir) / "testdata" / "args"
    words = path.read_text().split() if path.exists() else []
    batch_size, config = 1000, []
    for flag, value in zip(words[::2], words[1::2]):
        if flag == "--batch-size":
            batch_size = int(value)
        elif flag == "--config":
            k, _, v = value.partition("=")
            config.append((k, v))
        else:
            raise ValueError(f"unknown sluice exec argument {flag}")
    return batch_size, config


def run_exec(example_dir, batch_size=None, config=None, timers_as_wit=True, packed=False, hold=False):
    """Runs an example over its testdata/input.jsonl as ``sluice exec`` does;
    returns the output lines. With ``hold``, the SDK may hold the shard's
    state across batches (packed calls only), as a host offers: it is asked
    back before timers fire and at the end."""
    reset()
    args_batch, args_config = parse_args(example_dir)
    batch_size = batch_size or args_batch
    config = args_config if config is None else config
    world = load_world(example_dir)
    world.init(config)
    if hold:
        world.hold_state(1 << 30)
    out, batch, index = [], [], 0
    wm, clock = None, 0

    def fire():
        for _ in range(1000):
            due = testing.take_due()
            if not due:
                return
            if hold:
                world.flush_state(0)
            out.extend(output_line(r) for r in world.on_timers([wit_timer(t) if timers_as_wit else t for t in due]))
        raise AssertionError("timers keep firing")

    def flush():
        nonlocal wm
        out.extend(output_line(r) for r in process(world, batch, packed))
        stamps = [r.timestamp for r in batch if r.timestamp is not None]
        if stamps:
            wm = max(stamps) if wm is None else max(wm, max(stamps))
            testing.set_watermark(wm)
        batch.clear()
        fire()

    for line in (Path(example_dir) / "testdata" / "input.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        j = json.loads(line)
        if "watermark" in j or "processing_time" in j:
            if batch:
                flush()
            if "processing_time" in j:
                clock = max(clock, j["processing_time"])
                testing.set_processing_time(clock)
            if "watermark" in j:
                wm = j["watermark"] if wm is None else max(wm, j["watermark"])
                testing.set_watermark(wm)
            fire()
            continue
        batch.append(input_record(j, index))
        index += 1
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    if hold:
        world.flush_state(0)
    return out
