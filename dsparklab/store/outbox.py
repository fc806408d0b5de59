"""Outbox: a writer's commits sent by a background thread, so a failing store never stalls it.

A live writer (the vLLM plugin) must not wait on its store: an endpoint that is down, slow,
refusing credentials or missing its bucket must not change vLLM's tokens or hold up a
step. The writer hands each finished file (a part, or run.json) to an :class:`Outbox`,
which sends them in order from its own thread and retries a failing send with back-off.
While the store is away, files queue up to ``max_bytes``; past that, the oldest parts are
dropped and counted, a whole flush at a time (a step and its positions stay together; a
flush whose first part was sent is never cut), and run.json is never dropped: only its
newest version is kept. A live run.json takes the place of the queued one it replaces, so a
steady stream of parts never keeps pushing it back (its lease and its drop counts land); the
final one goes last, after every part it counts. When the store answers again, everything
still queued is sent. One log line says when the store went away and one when it came back,
with what was dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from dsparklab.store.location import Location, StoreAccessError, one_line

logger = logging.getLogger("dsparklab.store")

DEFAULT_MAX_BYTES = 256 * 2**20
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0


@dataclass
class _Item:
    location: Location
    data: bytes
    table: str | None  # None: run.json
    rows: int = 0
    batch: int | None = None  # the parts of one flush: dropped together or not at all


@dataclass
class OutboxCounts:
    """What the outbox sent and dropped, per table (parts and rows)."""

    sent_parts: dict[str, int] = field(default_factory=dict)
    sent_rows: dict[str, int] = field(default_factory=dict)
    dropped_parts: dict[str, int] = field(default_factory=dict)
    dropped_rows: dict[str, int] = field(default_factory=dict)
    failures: int = 0

    def dropped_json(self) -> dict[str, dict[str, int]] | None:
        """run.json's ``dropped`` block; None when nothing was dropped."""
        if not self.dropped_parts:
            return None
        return {"parts": dict(self.dropped_parts), "rows": dict(self.dropped_rows)}


class Outbox:
    """Sends files in the order given, from one daemon thread, retrying until they land.

    ``put`` never blocks on the store; ``drain(timeout_s)`` waits for the queue to empty
    (at close) and says whether it did.
    """

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, name: str = "store") -> None:
        self.max_bytes = max_bytes
        self.name = name
        self.counts = OutboxCounts()
        self._queue: deque[_Item] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._down_since: float | None = None
        self._dropped_in_outage = 0
        self._started: set[int] = set()  # batches with a part sent and parts still queued
        self._thread = threading.Thread(target=self._run, name=f"dsparklab-{name}", daemon=True)
        self._thread.start()

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def put(
        self,
        location: Location,
        data: bytes,
        *,
        table: str | None,
        rows: int = 0,
        batch: int | None = None,
        final: bool = False,
    ) -> None:
        """Queue one file. A newer run.json (``table`` None) replaces a queued older one: in
        its place while the run is live, at the back when ``final`` (the closing one, sent
        after every part). Parts given one ``batch`` are dropped together."""
        with self._cond:
            if table is None and self._replace_run_json(location, data, final):
                self._cond.notify_all()
                return
            self._queue.append(_Item(location, data, table, rows, batch))
            self._bytes += len(data)
            self._drop_over_bound()
            self._cond.notify_all()

    def _replace_run_json(self, location: Location, data: bytes, final: bool) -> bool:
        """Drop the queued (not in flight) older versions of this run.json; a live one
        takes the first one's place (True: placed), a final one is appended by the caller."""
        in_flight = self._queue[0] if self._busy and self._queue else None
        queued = [i for i in self._queue if i.location == location and i is not in_flight]
        placed = bool(queued) and not final
        if placed:
            first, queued = queued[0], queued[1:]
            self._bytes += len(data) - len(first.data)
            first.data = data
        for old in queued:
            self._queue.remove(old)
            self._bytes -= len(old.data)
        return placed

    def _drop_over_bound(self) -> None:
        """Oldest flush first, whole; never one being sent or partly sent (it would land in
        part), and never run.json (it says what was dropped)."""
        while self._bytes > self.max_bytes:
            in_flight = self._queue[0] if self._busy and self._queue else None
            begun = self._started | ({in_flight.batch} if in_flight is not None else set())
            victim = next(
                (
                    i
                    for i in self._queue
                    if i.table is not None
                    and i is not in_flight
                    and (i.batch is None or i.batch not in begun)
                ),
                None,
            )
            if victim is None:
                return
            doomed = [
                i
                for i in self._queue
                if i is victim or (victim.batch is not None and i.batch == victim.batch)
            ]
            for item in doomed:
                self._queue.remove(item)
                self._bytes -= len(item.data)
                table = item.table
                assert table is not None
                counts = self.counts
                counts.dropped_parts[table] = counts.dropped_parts.get(table, 0) + 1
                counts.dropped_rows[table] = counts.dropped_rows.get(table, 0) + item.rows
                self._dropped_in_outage += 1

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued file is sent (or ``timeout_s`` passes)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))
        return True

    def close(self, timeout_s: float) -> bool:
        """Drain, then stop the thread; False when files were left unsent."""
        sent = self.drain(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        return sent

    def _run(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                item = self._queue[0]
                self._busy = True
            try:
                item.location.write_bytes(item.data)
            except (StoreAccessError, OSError) as err:
                with self._cond:
                    self._busy = False
                    self.counts.failures += 1
                    if self._down_since is None:
                        self._down_since = time.monotonic()
                        logger.warning(
                            "dsparklab: %s unreachable (%s); buffering up to %d MiB and retrying",
                            self.name,
                            one_line(err),
                            self.max_bytes // 2**20,
                        )
                    if self._closed:
                        return
                    self._cond.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_FIRST_S
            with self._cond:
                self._busy = False
                if self._queue and self._queue[0] is item:
                    self._queue.popleft()
                    self._bytes -= len(item.data)
                if item.batch is not None:  # a flush begun stays whole until it is all sent
                    if any(i.batch == item.batch for i in self._queue):
                        self._started.add(item.batch)
                    else:
                        self._started.discard(item.batch)
                if item.table is not None:
                    counts = self.counts
                    counts.sent_parts[item.table] = counts.sent_parts.get(item.table, 0) + 1
                    counts.sent_rows[item.table] = counts.sent_rows.get(item.table, 0) + item.rows
                if self._down_since is not None:
                    logger.warning(
                        "dsparklab: %s is back after %.0f s; %d parts dropped meanwhile "
                        "(counted in run.json's 'dropped')",
                        self.name,
                        time.monotonic() - self._down_since,
                        self._dropped_in_outage,
                    )
                    self._down_since = None
                    self._dropped_in_outage = 0
                self._cond.notify_all()
