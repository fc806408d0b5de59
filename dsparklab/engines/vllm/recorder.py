r"""Host side of the taps: staged copies -> trace rows keyed by request id.

vLLM verifies a request's draft one step after proposing it, and re-sorts batch rows
every step, so the recorder keeps one *pending* draft per request id. Each staged draft
step (:class:`~dsparklab.engines.vllm.core.HostSlot`) carries, for every row, the
verification result of the request's previous draft (``num_sampled``, ``num_rejected``,
the last emitted token) and the request's new draft with its tap values. Processing a
slot first resolves the pending drafts (one ``steps`` row and n ``positions`` rows per
verified draft), then stores the new ones as pending.

Conventions (as vLLM's rejection sampler): ``accepted = num_sampled - 1`` (the bonus
token is not a draft token), ``verified = accepted + num_rejected``; a row with
``num_sampled == 0`` (a chunked prefill) verified nothing. The target's token is known
where the verifier emitted one: equal to the draft at accepted positions, the emitted
bonus/correction token at position ``accepted``, null after it.

Step costs (``batch_size``, ``draft_time_s``, ``verify_time_s``; docs/vllm-plugin.md,
"Step costs"). A slot is one engine step of vLLM: the target's forward over the batch
(which verifies the drafts of the step before), sampling, and the draft pass that proposes
the next drafts, in that order (both runners: ``GPUModelRunner.execute_model`` then
``sample_tokens``, which calls the speculator's ``propose``). The slot carries the marks of
its draft pass and, where the step was timed as a whole
(:mod:`~dsparklab.engines.vllm.clock`), of the step: :math:`D`, :math:`T` and, on Model
Runner V2, :math:`V` (the target's forward and the sampler). Every ``steps`` row a slot
resolves (a draft this engine step verified) gets the slot's batch size :math:`B` (the rows
vLLM ran in it) and its share of the step: ``draft_time_s`` = :math:`D / B`,
``verify_time_s`` = :math:`V / B` and ``other_time_s`` = :math:`(T - V - D) / B` (V2); on
V1, ``verify_time_s`` = :math:`(T - D) / B` (verify and other together, ``other_time_s``
null). So the draft time on a row is the pass of the engine step that
verified the row's block (which drafts the request's *next* block), and a step's costs all
come from one batch: :math:`B \times` share is that batch's time, and the shares of one
engine step add up to :math:`T` over its :math:`B` rows. Rows of the batch that resolve no
draft (a prefill chunk, a request's first token) get no ``steps`` row; their shares are
counted in run.json's ``step_costs`` (``unattributed_s``), so
``attributed_s + unattributed_s = step_time_s`` over the run.

On either runner, a request that schedules one token and verifies nothing after its
first token (the step before drafted nothing for it: vLLM's dynamic speculative decoding
schedules no drafts at some batch sizes) is a target-only step of a speculative run: one
``steps`` row with ``num_drafted = 0`` and the slot's shares, as below (a re-prefill after
a preemption schedules more than one token and is no step).

Target-only engines (no speculative config) stage one host-only slot per engine step
(``meta["target_only"]``): each row that sampled a token other than its first (the
prefill's) is one ``steps`` row with ``num_drafted = 0``, ``verify_time_s`` = :math:`V / B`
and ``other_time_s`` = :math:`(T - V) / B` (V2), or ``verify_time_s`` = :math:`T / B` (V1).

Slots are read only when their device events have completed (never blocking the draft
step); a background thread does that every ``flush_seconds`` and writes parquet parts
through :class:`dsparklab.store.TraceWriter`, the only way rows reach the disk.

How a run ends (``run.json`` status), and how it is closed when its writer's process
dies first: :mod:`~dsparklab.engines.vllm.closing`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsparklab.engines.stats import DraftStats
from dsparklab.engines.vllm.closing import settled_marker
from dsparklab.engines.vllm.columns import DraftBlock, StepRecords, VerifiedDrafts
from dsparklab.engines.vllm.core import HostSlot
from dsparklab.engines.vllm.coverage import null, partial
from dsparklab.engines.vllm.step_cost import StepCost, StepCostTally
from dsparklab.store import TraceWriter
from dsparklab.store.location import Location
from dsparklab.store.sampling import request_sampled

logger = logging.getLogger(__name__)

# the thread that processes staged slots and writes rows (off the engine's thread, under
# the same interpreter lock)
FLUSH_THREAD = "dsparklab-trace-flush"

# vLLM appends "-" + 8 random hex characters to the caller's request id.
_INTERNAL_SUFFIX = re.compile(r"^(?P<external>.+)-[0-9a-f]{8}$")


def external_request_id(internal_id: str) -> str:
    """The request id the caller chose (``LLM.generate``'s, the OpenAI server's)."""
    match = _INTERNAL_SUFFIX.match(internal_id)
    return match.group("external") if match else internal_id


@dataclass
class PendingDraft:
    """A request's draft waiting for its verification (host values)."""

    block: DraftBlock  # the drafts of the engine step that proposed it
    row: int  # its batch row there
    context_len: int | None
    # this writer writes the draft's position rows (in a run several ranks write, the rank
    # that sampled the row does)
    owned: bool = True


@dataclass
class StepRows:
    """What processing one slot produced (for tests and callers that keep rows)."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    positions: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)


class TraceRecorder:
    """Turns staged draft steps into ``steps``/``positions``/``requests`` rows.

    Parameters
    ----------
    num_speculative_tokens
        n, the drafted positions per step.
    dataset
        Label written into every ``steps``/``requests`` row.
    writer
        Where rows go; None keeps them in memory (``self.rows``), for tests.
    sample
        Fraction of requests recorded (:func:`dsparklab.store.sampling.request_sampled`
        on the caller's request id); the others are not recorded at all.
    """

    def __init__(
        self,
        num_speculative_tokens: int,
        *,
        dataset: str = "vllm",
        writer: TraceWriter | None = None,
        flush_seconds: float | None = None,
        sample: float = 1.0,
        joined_rank: int | None = None,
    ) -> None:
        self.n = num_speculative_tokens
        self.sample = sample
        # in a run every tensor-parallel rank writes (vLLM 0.34's batch-sharded DSpark
        # sampling), this writer's rank: it writes the position rows of the rows it sampled,
        # and rank 0, the run's owner, every steps and requests row; None: the run is this
        # writer's alone
        self.joined_rank = joined_rank
        self.dataset = dataset
        self.writer = writer
        self.rows = StepRows()
        self.stats = DraftStats.new(num_speculative_tokens)
        self.costs = StepCostTally()
        self.closed = False
        self.failed: str | None = None
        # _lock: processing and writing (the flush thread); _qlock: the queue only, so
        # staging from vLLM's loop never waits for a parquet write
        self._lock = threading.RLock()
        self._qlock = threading.Lock()
        self._queue: deque[tuple[HostSlot, Callable[[HostSlot], None] | None]] = deque()
        self._pending: dict[str, PendingDraft] = {}
        # the rows due, made as columns at the end of each processing turn
        self._step_records = StepRecords(dataset)
        self._verified = VerifiedDrafts()
        self._step_count: dict[str, int] = {}
        self._seen: set[str] = set()
        # target-only: requests whose first (prefill) token was sampled
        self._first_token: set[str] = set()
        # requests vLLM scheduled and has not yet reported finished (internal ids)
        self._active: set[str] = set()
        self._settled = False  # the marker is on disk (changed under _qlock)
        # (slot watermark, request ids, forget the request entirely)
        self._finished: list[tuple[int, set[str], bool]] = []
        self._seq_staged = 0
        self._started_any = False  # a request was ever scheduled (start_requests)
        self._seq_done = 0
        self._warned: set[str] = set()
        # the run opens now (its directory, run.json), not in the flush thread's first turn,
        # whose file writes and encoding, under the interpreter lock, would stall the engine
        # step that runs beside it
        if writer is not None:
            writer.__enter__()
        self._flush_seconds = flush_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_write = time.monotonic()
        if self.background:  # now, not inside the first engine step it would then lengthen
            self._start_thread()

    # -- staging ---------------------------------------------------------------------
    @property
    def background(self) -> bool:
        """Whether a thread reads staged slots (else the caller calls process_ready)."""
        return self.writer is not None and bool(self._flush_seconds)

    def stage(self, slot: HostSlot, release: Callable[[HostSlot], None] | None = None) -> None:
        """Queue a slot whose copies have been issued; it is read once they completed."""
        with self._qlock:
            if self.closed:
                if release is not None:
                    release(slot)
                return
            if self._settled:
                self._unsettle()
            self._seq_staged += 1
            slot.meta["seq"] = self._seq_staged
            self._queue.append((slot, release))
        if self.background and self._thread is None:
            self._start_thread()

    def queued(self) -> int:
        return len(self._queue)

    def process_ready(self, *, block: bool = False) -> int:
        """Process queued slots in order while their copies are complete; returns count."""
        done = 0
        # the turn's steps rows and their positions rows (made at its end) in one flush
        with self._lock, self.writer.together() if self.writer is not None else nullcontext():
            try:
                while True:
                    with self._qlock:
                        if not self._queue:
                            break
                        slot, release = self._queue[0]
                        if not slot.ready() and not block:
                            break
                        self._queue.popleft()
                    slot.wait()
                    seq = int(slot.meta.get("seq", self._seq_done))
                    try:
                        self._process(slot)
                    finally:
                        if release is not None:
                            release(slot)
                    self._seq_done = seq
                    done += 1
                    # at once: a preempted request that resumed in a later slot keeps its draft
                    self._retire_finished()
            finally:
                self._write_columns()
            self._retire_finished()
        return done

    def start_requests(self, request_ids: Iterable[str]) -> None:
        """Requests vLLM scheduled for the first time: in flight until finished."""
        ids = set(request_ids)
        if not ids:
            return
        with self._qlock:
            if self._settled:
                self._unsettle()
            self._active |= ids
            self._started_any = True

    def _unsettle(self) -> None:
        """Remove the settled marker (called under ``_qlock``, before recording more)."""
        self._settled = False
        if (marker := self._settled_marker()) is not None:
            marker.unlink(missing_ok=True)

    def _settled_marker(self) -> Path | None:
        """This writer's settled marker in a local run: ``.settled``, or a joining rank's
        ``.settled-tp<k>`` (:func:`settled_marker`)."""
        if self.run_dir is None or not self.run_dir.is_local:
            return None
        tag = None if self.writes_steps else f"tp{self.joined_rank}"
        return settled_marker(Path(self.run_dir.path), tag)

    def in_flight(self) -> set[str]:
        """Requests scheduled or recorded and not yet reported finished."""
        with self._qlock:
            active = set(self._active)
        return active | set(self._pending) | set(self._step_count) | self._first_token

    def finish_requests(self, request_ids: Iterable[str], *, forget: bool = True) -> None:
        """Requests that left the batch: drop their pending drafts once queued slots are read.

        ``forget=False`` (preempted: the request resumes later under the same id) keeps
        its step count, so the resumed request's steps continue the numbering.
        """
        ids = set(request_ids)
        if not ids:
            return
        with self._qlock:
            self._finished.append((self._seq_staged, ids, forget))

    def note_null(self, names: Iterable[str], why: str) -> None:
        """run.json's ``recorded_fields``: fields ``names`` are null on this run's path,
        because ``why`` (said once in the log, never a silent null)."""
        self._note_fields(names, null(why), "not recorded", why)

    def note_partial(self, names: Iterable[str], why: str) -> None:
        """run.json's ``recorded_fields``: fields ``names`` are recorded for some rows only,
        and ``why`` says which (said once in the log)."""
        self._note_fields(names, partial(why), "recorded for some rows only", why)

    def _note_fields(self, names: Iterable[str], status: str, what: str, why: str) -> None:
        fields = dict(self.writer.meta.get("recorded_fields") or {}) if self.writer else {}
        new = [name for name in names if fields.get(name) != status]
        if not new:
            return
        fields.update(dict.fromkeys(new, status))
        if self.writer is not None:
            self.writer.update_meta(recorded_fields=fields)
        self._warn_once(
            f"{status}:{','.join(new)}",
            f"dsparklab: {what} (%s): %s; %s",
            ", ".join(new),
            why,
            self.run_dir,
        )

    # -- processing ------------------------------------------------------------------
    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def keeps(self, req_id: str) -> bool:
        """Whether this run records the request (all of it, or nothing)."""
        # every row of every step asks: an unsampled run skips the id's parsing
        return self.sample >= 1.0 or request_sampled(external_request_id(req_id), self.sample)

    def _process(self, slot: HostSlot) -> None:
        meta = slot.meta
        req_ids: Sequence[str] = meta["req_ids"]
        num_reqs = len(req_ids)
        if num_reqs == 0:
            return
        cost = StepCost.of(slot, num_reqs)
        t = slot.arrays  # numpy views: no torch call per slice
        if meta.get("target_only"):
            # V1 knows the sampled counts on the host; V2 staged them from the device
            sampled = meta.get("num_sampled") or t["num_sampled"][:num_reqs].tolist()
            self.costs.observe(cost, self._process_target_only(meta, req_ids, sampled, cost))
            return
        num_sampled = [int(x) for x in t["num_sampled"][:num_reqs].tolist()]
        if "num_verified" in meta:  # V1: verified counts known on the host
            num_rejected = [
                max(int(v) - (s - 1), 0) if s > 0 else 0
                for v, s in zip(meta["num_verified"], num_sampled, strict=True)
            ]
        else:
            num_rejected = [int(x) for x in t["num_rejected"][:num_reqs].tolist()]
        last_token = t["last_token"][:num_reqs].tolist()
        # sequence length incl. this step's drafts, minus the rejected ones, plus the bonus
        if "seq_base" in meta:  # V1: num_computed + num_scheduled, from the host
            seq_lens = [int(x) for x in meta["seq_base"]]
        else:
            seq_lens = [int(x) for x in t["seq_lens"][:num_reqs].tolist()]
        context_len = [s - r + 1 for s, r in zip(seq_lens, num_rejected, strict=True)]
        num_drafted = int(meta.get("num_drafted", 0))
        # copied: the slot's memory is reused once it is released
        block = DraftBlock.of(t, num_reqs, num_drafted) if num_drafted else None
        # the tokens each row scheduled this step (V1 and V2 stage them from the host)
        scheduled = meta.get("num_scheduled")
        # batch-sharded sampling: row r was sampled by TP rank r mod this size
        sharded_over = meta.get("sharded_over")
        resolved = 0
        for row, req_id in enumerate(req_ids):
            if not self.keeps(req_id):
                continue
            pending = self._pending.pop(req_id, None)
            sampled = int(num_sampled[row])
            if pending is None and sampled == 1 and int(num_rejected[row]) == 0:
                # one token, no draft verified: the request's first (its prefill's), a
                # re-prefill's after a preemption (many tokens scheduled), or a decode step
                # after one that drafted nothing (one token scheduled: vLLM's dynamic
                # speculative decoding schedules 0 drafts at some batch sizes), which is a
                # target-only step of this run
                if req_id in self._first_token and scheduled and int(scheduled[row]) == 1:
                    self._add_step(req_id, int(seq_lens[row]), 0, 0, 0, cost)
                    resolved += 1
                self._first_token.add(req_id)
            if pending is not None and sampled > 0:
                accepted = sampled - 1
                verified = accepted + int(num_rejected[row])
                if verified > 0:
                    if verified > pending.block.width or accepted > verified:
                        self._warn_once(
                            "mismatch",
                            "dsparklab: request %s verified %d positions (%d accepted) of a "
                            "%d-token draft; step skipped (the recorded draft is not the "
                            "verified one)",
                            req_id,
                            verified,
                            accepted,
                            pending.block.width,
                        )
                    else:
                        self._emit(req_id, pending, accepted, verified, int(last_token[row]), cost)
                        resolved += 1
            if block is not None:
                self._pending[req_id] = PendingDraft(
                    block=block,
                    row=row,
                    context_len=int(context_len[row]) if sampled > 0 else None,
                    owned=self._samples_row(row, sharded_over),
                )
        self.costs.observe(cost, resolved)

    def _samples_row(self, row: int, sharded_over: int | None) -> bool:
        """Whether this writer writes the position rows of batch row ``row``'s draft."""
        if self.joined_rank is None:
            return True
        if sharded_over is None:  # a step every rank sampled whole: the owner writes it
            return self.joined_rank == 0
        return row % sharded_over == self.joined_rank

    @property
    def writes_steps(self) -> bool:
        """Whether this writer writes steps and requests rows (not a joining rank)."""
        return self.joined_rank in (None, 0)

    def _process_target_only(
        self,
        meta: Mapping[str, Any],
        req_ids: Sequence[str],
        num_sampled: Sequence[int],
        cost: StepCost,
    ) -> int:
        """A target-only engine step: one ``steps`` row per request that sampled a token
        after its first; returns how many."""
        rows = 0
        for req_id, sampled, context in zip(req_ids, num_sampled, meta["seq_base"], strict=True):
            if int(sampled) <= 0 or not self.keeps(req_id):  # a prefill chunk; not sampled
                continue
            if req_id not in self._first_token:  # the prefill's token: no step
                self._first_token.add(req_id)
                continue
            self._emit_target_only(req_id, int(context), cost)
            rows += 1
        return rows

    def _emit_target_only(self, req_id: str, context_len: int, cost: StepCost) -> None:
        self._add_step(req_id, context_len, 0, 0, 0, cost)
        self.stats.observe_draft(0, 0)

    def _add_step(
        self,
        req_id: str,
        context_len: int,
        drafted: int,
        verified: int,
        accepted: int,
        cost: StepCost,
    ) -> int:
        """Write one steps row (its request row first, once); returns the step number
        (a joining rank counts the steps and writes neither)."""
        step = self._step_count.get(req_id, 0)
        self._step_count[req_id] = step + 1
        if not self.writes_steps:
            return step
        prompt_id = external_request_id(req_id)
        if req_id not in self._seen:
            self._seen.add(req_id)
            self._add(
                "requests",
                [{"request_id": req_id, "prompt_id": prompt_id, "dataset": self.dataset}],
            )
        self._step_records.add(
            req_id, prompt_id, step, context_len, drafted, verified, accepted, cost
        )
        return step

    def _emit(
        self,
        req_id: str,
        pending: PendingDraft,
        accepted: int,
        verified: int,
        emitted: int,
        cost: StepCost,
    ) -> None:
        if pending.context_len is None:
            self._warn_once(
                "context",
                "dsparklab: a verified draft had no context length; recorded as -1",
            )
        context = pending.context_len if pending.context_len is not None else -1
        step = self._add_step(req_id, context, pending.block.width, verified, accepted, cost)
        if self.writes_steps:
            self.stats.observe_draft(min(verified, self.n), min(accepted, self.n))
        if pending.owned:  # its rows are made with the turn's others (_write_columns)
            self._verified.add(req_id, step, pending.block, pending.row, accepted, emitted)

    def _write_columns(self) -> None:
        """The steps and positions rows made since the last call, a table each."""
        for name, records in (("steps", self._step_records), ("positions", self._verified)):
            if not len(records):
                continue
            table = records.take_table()
            if self.writer is None:
                getattr(self.rows, name).extend(table.to_pylist())
            else:
                self.writer.add_table(name, table)

    def _add(self, table: str, rows: list[dict[str, Any]]) -> None:
        if self.writer is None:
            getattr(self.rows, table).extend(rows)
            return
        self.writer.add_many(table, rows)

    def _retire_finished(self) -> None:
        with self._qlock:
            finished, self._finished = self._finished, []
        keep = []
        for watermark, ids, forget in finished:
            if watermark <= self._seq_done:
                for req_id in ids:
                    self._pending.pop(req_id, None)
                    if forget:
                        self._step_count.pop(req_id, None)
                        self._seen.discard(req_id)
                        self._first_token.discard(req_id)
                        with self._qlock:
                            self._active.discard(req_id)
            else:
                keep.append((watermark, ids, forget))
        with self._qlock:
            self._finished = keep + self._finished

    # -- lifecycle -------------------------------------------------------------------
    def _start_thread(self) -> None:
        if self._thread is not None or not self._flush_seconds or self.writer is None:
            return
        self._thread = threading.Thread(target=self._flush_loop, name=FLUSH_THREAD, daemon=True)
        self._thread.start()

    def _flush_loop(self) -> None:
        assert self._flush_seconds is not None
        interval = min(0.5, self._flush_seconds)
        while not self._stop.wait(interval):
            try:
                if not self._flush_once():
                    return
            except Exception:  # fail open: the engine keeps running, tracing stops
                logger.exception("dsparklab: trace flush failed; tracing disabled")
                self.fail("flush failed")
                return

    def _flush_once(self) -> bool:
        """One turn of the flush thread: process the ready slots, write rows when due, settle,
        renew the lease. False once the recorder is closed."""
        assert self._flush_seconds is not None
        with self._lock:
            if self.closed:
                return False
            self.process_ready()
            now = time.monotonic()
            if self.writer is not None and now - self._last_write >= self._flush_seconds:
                self.writer.flush()
                self._last_write = now
            self._settle()
            if self.writer is not None:
                self.writer.heartbeat()
        return True

    def _settle(self) -> None:
        """Write everything and leave the marker once no request is in flight (under _lock)."""
        if self._settled or self.writer is None:
            return
        with self._qlock:
            if self._queue or self._finished:
                return
            seq = self._seq_staged
        if self.in_flight():
            return
        self.writer.update_meta(**self._tallies())
        self.writer.checkpoint()
        self._last_write = time.monotonic()
        with self._qlock:
            # nothing staged or scheduled meanwhile: start_requests/stage wait for this
            if seq == self._seq_staged and not self._active and not self._queue:
                # the local dead-writer check reads it
                if (marker := self._settled_marker()) is not None:
                    marker.touch()
                self._settled = True

    def drain(self) -> None:
        """Wait for and process every queued slot, then write buffered rows."""
        with self._lock:
            self.process_ready(block=True)
            if self.writer is not None:
                self.writer.update_meta(**self._tallies())
                self.writer.flush()

    def close(self, *, status: str = "complete") -> None:
        """Drain, write run.json with the final status and stop the flush thread.

        A status other than ``complete`` still writes every row already recorded.
        """
        with self._lock:
            if self.closed:
                return
            try:
                if status == "complete":
                    self.process_ready(block=True)
            except BaseException:
                status = "incomplete"  # slots left unprocessed: never complete
                raise
            finally:
                self.closed = True
                self._stop.set()
                if self.writer is not None:
                    self._close_writer(status)

    def end(self) -> str:
        """Close at the end of the process: ``complete`` when every request finished and
        every slot was processed, else ``incomplete``; returns the status."""
        with self._lock:
            if self.closed:
                return "closed"
            status = "incomplete"
            try:
                self.process_ready(block=True)
                if not self.queued() and not self.in_flight():
                    status = "complete"
            finally:
                self.close(status=status)
        return status

    def _close_writer(self, status: str) -> None:
        assert self.writer is not None
        served_nothing = self._seq_staged == 0 and not self._started_any
        if status == "complete" and served_nothing and self.joined_rank is None:
            # an engine that served no request (an idle data-parallel rank, a server shut
            # down before any traffic) leaves no run: a complete run holds rows
            self.writer.discard()
            logger.info("dsparklab: %s recorded no request; its run is removed", self.run_dir)
            return
        self.writer.update_meta(**self._tallies())
        if self.failed:
            self.writer.update_meta(error=self.failed)
        if status != "complete":
            try:  # keep what was recorded (a failing flush is why it failed: give up)
                self.writer.flush()
            except Exception:
                logger.exception("dsparklab: writing the last rows of %s failed", self.run_dir)
        self.writer.close(status=status)
        if (marker := self._settled_marker()) is not None:
            marker.unlink(missing_ok=True)

    def fail(self, reason: str) -> None:
        """Stop recording and mark the run failed (rows already written are kept)."""
        with self._lock:
            if self.closed:
                return
            self.failed = reason
            with self._qlock:
                queued, self._queue = list(self._queue), deque()
            for slot, release in queued:
                if release is not None:
                    release(slot)
        try:
            self.close(status="failed")
        except Exception:
            logger.exception("dsparklab: could not mark the tap trace failed")

    def _tallies(self) -> dict[str, Any]:
        """run.json's running tallies: drafts and acceptance, and the engine steps' costs."""
        return {"tap_stats": self.stats.to_json(), "step_costs": self.costs.to_json()}

    @property
    def run_dir(self) -> Location | None:
        return self.writer.run_dir if self.writer is not None else None

    def summary(self) -> Mapping[str, Any]:
        return {
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "closed": self.closed,
            "failed": self.failed,
            "pending_requests": len(self._pending),
            "tap_stats": self.stats.to_json(),
            "step_costs": self.costs.to_json(),
        }


__all__ = [
    "PendingDraft",
    "StepRows",
    "TraceRecorder",
    "external_request_id",
]
