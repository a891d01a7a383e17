"""Emits, for each record, its key and the number of records seen so far
with that key (see README.md)."""

from sluice import Transform, ValueState, export

COUNTS = ValueState("count")


def increment(n):
    # Defined once rather than as a lambda in process: building a
    # function object on every record costs time (the Python SDK's guide,
    # "Speed").
    return (n or 0) + 1


class RunningCount(Transform):
    def begin_batch(self, batch):
        # One state.get-many call for the whole batch.
        COUNTS.prefetch(batch.keys())

    def process(self, record, out):
        # Records without a key count under the empty key.
        key = record.key_or_empty()
        n = COUNTS.update(key, increment)
        out.emit(key, str(n))


WitWorld = export(RunningCount)
