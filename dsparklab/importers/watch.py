r"""``dsparklab watch``: scrape a running vLLM server's ``/metrics`` into a live run.

Every ``interval`` seconds the speculative-decoding counters are scraped and the
difference to the previous scrape is written as one interval (granularity ``interval``):
per position :math:`R_{k,i}`, :math:`A_{k,i}` in ``counters`` and the interval's drafts,
tokens and wall-clock bounds in ``totals``, flushed at once so a notebook reading the run
sees each interval as it finishes (:func:`dsparklab.analysis.compute_acceptance_over_time`).

The run ends cleanly, keeping every finished interval, on Ctrl-C (or SIGTERM), when the
server stops answering, when its counters go backwards (a restart) or after
``max_intervals``; ``run.json`` says why (``stop_reason``). A first scrape that fails
writes nothing.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dsparklab
from dsparklab.errors import DSparkLabError
from dsparklab.importers._common import DEFAULT_DATASET, DEFAULT_METHOD, InputFormatError
from dsparklab.importers.prometheus import counter_rows, delta_totals
from dsparklab.prometheus import PER_POS, SpecDecodeCounters, spec_decode_counters
from dsparklab.store import TraceWriter, new_run_json

ENGINE = {"name": "vllm", "version": "unknown", "mode": "live"}


class ScrapeError(DSparkLabError, RuntimeError):
    """The metrics endpoint did not answer (connection refused, timeout, HTTP error)."""


def scrape(url: str, *, timeout_s: float = 5.0) -> str:
    """GET ``url`` and return its text; ScrapeError names the URL and the reason."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310
            return str(response.read().decode("utf-8", errors="replace"))
    except urllib.error.HTTPError as err:
        raise ScrapeError(f"{url}: HTTP {err.code}") from err
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        reason = getattr(err, "reason", err)
        raise ScrapeError(f"{url}: {reason}") from err


@dataclass
class WatchResult:
    run_dir: Path
    intervals: int
    stop_reason: str


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT / SIGTERM set ``stop`` instead of raising (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _run_json(
    url: str, n: int, dataset: str, method: str, interval_s: float, first: SpecDecodeCounters
) -> dict[str, Any]:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return new_run_json(
        run_id=f"watch/{dataset}/{method}-n{n}/{stamp}",
        engine=ENGINE,
        method=method,
        num_speculative_tokens=n,
        target={"name": first.model_name or "unknown"},
        drafter={"name": "unknown"},
        dataset=dataset,
        sampling={"temperature": None},
        granularity="interval",
        tier="live",
        source={
            "format": "vllm-metrics",
            "metrics_url": url,
            "interval_s": interval_s,
            "engines": first.engines,
            "counters_at_start": {
                "num_drafts": first.num_drafts,
                "num_draft_tokens": first.num_draft_tokens,
                "num_accepted_tokens": first.num_accepted_tokens,
                "accepted_per_pos": first.accepted_per_pos,
            },
        },
        dsparklab_version=dsparklab.__version__,
    )


def watch(
    metrics_url: str,
    out: Path | str,
    *,
    interval_s: float = 10.0,
    dataset: str | None = None,
    method: str | None = None,
    n: int | None = None,
    max_intervals: int | None = None,
    timeout_s: float = 5.0,
    stop: threading.Event | None = None,
    on_interval: Callable[[int, SpecDecodeCounters], None] | None = None,
    clock: Callable[[], float] = time.time,
) -> WatchResult:
    """Scrape ``metrics_url`` every ``interval_s`` seconds into a new run below ``out``.

    Parameters
    ----------
    metrics_url
        The server's Prometheus endpoint, e.g. ``http://127.0.0.1:8000/metrics``.
    out
        The store the run goes to, as ``watch/<dataset>/<method>-n<n>/<UTC time>``.
    dataset, method, n
        Labels (the counters carry none); ``n`` must match the server's window.
    max_intervals
        Stop after this many intervals (None: until stopped).
    stop
        Set it to end the run (the CLI's Ctrl-C / SIGTERM set it).
    on_interval
        Called after each written interval with its index and counts.
    """
    if interval_s <= 0:
        raise DSparkLabError(f"--interval must be > 0 seconds, got {interval_s}")
    stop = stop or threading.Event()
    try:
        first_text = scrape(metrics_url, timeout_s=timeout_s)
    except ScrapeError as err:
        raise ScrapeError(f"cannot start watching: {err}") from err
    before = spec_decode_counters(first_text, metrics_url)
    if n is not None and n != before.n:
        raise InputFormatError(
            f"--n {n} but the server's counters have {before.n} positions",
            path=metrics_url,
            field=f"{PER_POS}_total",
        )
    dataset = dataset or DEFAULT_DATASET
    method = method or DEFAULT_METHOD
    meta = _run_json(metrics_url, before.n, dataset, method, interval_s, before)
    t_prev = clock()
    intervals = 0
    reason = ""
    with _stop_on_signals(stop), TraceWriter(out, meta, flush_seconds=1e9) as writer:
        writer.update_meta(intervals=0, stop_reason=None)
        writer.checkpoint()
        while True:
            if max_intervals is not None and intervals >= max_intervals:
                reason = f"finished {max_intervals} intervals"
                break
            if stop.wait(interval_s):
                reason = "interrupted (Ctrl-C or SIGTERM)"
                break
            t_now = clock()
            try:
                text = scrape(metrics_url, timeout_s=timeout_s)
            except ScrapeError as err:
                reason = f"server lost: {err}"
                break
            try:
                after = spec_decode_counters(text, metrics_url)
                delta = after.minus(before, metrics_url)
            except InputFormatError as err:
                reason = f"stopped: {err}"
                break
            writer.add_many("counters", counter_rows(delta, scope="interval", interval=intervals))
            writer.add(
                "totals",
                delta_totals(
                    delta, scope="interval", interval=intervals, t_start=t_prev, t_end=t_now
                ),
            )
            intervals += 1
            writer.update_meta(intervals=intervals)
            writer.checkpoint()
            if on_interval is not None:
                on_interval(intervals - 1, delta)
            before, t_prev = after, t_now
        writer.update_meta(stop_reason=reason, intervals=intervals)
        if intervals == 0:
            writer.update_meta(error=f"no interval finished ({reason})")
            writer.close(status="failed")
    return WatchResult(run_dir=Path(writer.run_dir.path), intervals=intervals, stop_reason=reason)
