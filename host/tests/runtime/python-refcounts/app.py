"""A fixture of host/tests/runtime/examples.rs
(`the_python_c_core_leaves_immortal_objects_uncounted`)."""

import sys

import sluice
from sluice import Transform, ValueState, export

COUNTS = ValueState("count")


class Probe(Transform):
    """running-count, plus one record per batch with the reference counts of
    objects 3.14 keeps immortal (None, the small int 1, a one-byte bytes)."""

    def begin_batch(self, batch):
        COUNTS.prefetch(batch.keys())

    def process(self, record, out):
        key = record.key_or_empty()
        n = COUNTS.update(key, lambda n: (n or 0) + 1)
        out.emit(key, str(n))

    def end_batch(self, out):
        out.emit(b"c-core", str(sluice.SPEEDUPS))
        out.emit(b"refcounts", f"{sys.getrefcount(None)} {sys.getrefcount(1)} {sys.getrefcount(b'x')}")


WitWorld = export(Probe)
