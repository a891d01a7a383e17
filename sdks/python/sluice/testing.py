"""A simulated host for unit tests in plain CPython (the counterpart of the
Rust SDK's ``time::testing``): set the watermark and the clock, take the
timers that are due as the host would fire them, and look at or reset the
in-memory state store.

Drive a transform as the host does::

    from sluice import export, testing

    world = export(MyTransform)()
    world.init([])
    world.process(records)                      # WIT input-record shapes
    testing.set_watermark(60_000)
    outputs = world.on_timers(testing.take_due())

Inside a component there is nothing to simulate: every function here raises
:class:`sluice.Error`.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import sluice
from sluice import Error, Timer

__all__ = [
    "calls",
    "finish",
    "pending",
    "reset",
    "reset_state",
    "set_processing_time",
    "set_watermark",
    "state",
    "take_due",
]


def _host() -> "sluice._SimulatedTime":
    if sluice.IN_COMPONENT:
        raise Error("sluice.testing is for plain CPython; inside a component the host keeps time")
    return sluice._time


def set_watermark(at: Optional[int]) -> None:
    """Sets the watermark (tests may move it back; the host never does) and
    starts a new call (the cached watermark and clock, and the timers that
    windows set once per call, are forgotten)."""
    _host().watermark_at = at
    sluice._new_call()


def set_processing_time(at: int) -> None:
    """Sets the host's clock and starts a new call."""
    _host().now = at
    sluice._new_call()


def take_due() -> List[Timer]:
    """Removes and returns the due timers, in the order the host fires them:
    event-time timers at or below the watermark, then processing-time timers
    at or below the clock, each by time, then key."""
    return _host().take_due()


def pending() -> List[Timer]:
    """The timers set, in order."""
    return _host().pending()


def reset() -> None:
    """Forgets every timer and resets the watermark (``None``) and the clock (0)."""
    sluice._time = sluice._SimulatedTime()
    sluice._new_call()


def reset_state() -> None:
    """Empties the in-memory state store (and its cache and call counts)."""
    _host()
    sluice._store.discard()
    sluice._store.hold(0)
    sluice._store.backend = sluice._Memory()


def finish() -> None:
    """Ends a call as the SDK does after a batch: writes the cached state
    changes back to the store and empties the cache."""
    _host()
    sluice._store.finish()


def state() -> Dict[bytes, bytes]:
    """The in-memory store's entries as the host holds them (written-back
    state only: call :func:`finish` first)."""
    _host()
    return dict(sluice._store.backend.map)


def calls() -> Dict[str, int]:
    """How many calls a host would have seen so far, by function
    (``get``, ``get_many``, ``write``, ``scan_prefix``, ``watermark``,
    ``processing_time``, ``set_timer``, ``delete_timer``)."""
    out = dict(sluice._store.backend.calls)
    out.update(_host().calls)
    return out
