"""Helpers shared by the SDK's tests: records as ``sluice exec`` builds them,
and a host simulation of ``sluice exec`` (one input partition, no
out-of-orderness) that drives an exported ``WitWorld`` through batches,
watermark and clock lines and timer firings, as host/src/exec.rs does."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.dont_write_bytecode = True  # no __pycache__ next to the SDK
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "sdks" / "python"))

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


def run_exec(example_dir, batch_size=None, config=None, timers_as_wit=True):
    """Runs an example over its testdata/input.jsonl as ``sluice exec`` does;
    returns the output lines."""
    reset()
    args_batch, args_config = parse_args(example_dir)
    batch_size = batch_size or args_batch
    config = args_config if config is None else config
    world = load_world(example_dir)
    world.init(config)
    out, batch, index = [], [], 0
    wm, clock = None, 0

    def fire():
        for _ in range(1000):
            due = testing.take_due()
            if not due:
                return
            out.extend(output_line(r) for r in world.on_timers([wit_timer(t) if timers_as_wit else t for t in due]))
        raise AssertionError("timers keep firing")

    def flush():
        nonlocal wm
        out.extend(output_line(r) for r in world.process(batch))
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
    return out
