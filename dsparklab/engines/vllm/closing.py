"""How a tap run ends when its writer's process dies first, and who closes it.

How a run ends (``run.json`` status): a recorder whose every request has finished, with
every slot processed, writes its rows and run.json at once and leaves an empty marker
file (:data:`SETTLED_MARKER`) in the run directory; the first request scheduled after
that removes the marker (one ``unlink``) before anything of it is recorded. A run closed
while settled is ``complete``; with requests in flight, queued slots or unwritten rows
it is ``incomplete`` (every row already recorded is written first). vLLM's server
force-kills its engine process at shutdown, so a process that outlives the writer closes
the run from the marker instead (:func:`close_run_of_dead_writer`):
settled means ``complete``, anything else ``incomplete``, never the other way round. A
run that recorded no request at all (an idle data-parallel rank, a server shut down before
any traffic) is removed instead, by its writer or by the closer: a complete run holds rows.

A run several TP ranks write (vLLM 0.34's batch-sharded DSpark sampling) is closed writer
by writer: rank 0's run.json from ``.settled``, each joined rank's ``writers/tp<k>.json``
from its own ``.settled-tp<k>``, each counting the parts its writer id names
(:func:`close_runs_of_dead_descendants`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsparklab.errors import DSparkLabError
from dsparklab.store import read_run_json
from dsparklab.store.location import Location
from dsparklab.store.reader import joined_record, part_files, store_runs
from dsparklab.store.schema import JOINED_DIR, JOINED_WRITERS, TABLES
from dsparklab.store.writer import (
    part_suffix,
    remove_run,
    utc_now,
    write_json_atomic,
    write_run_json,
)

logger = logging.getLogger(__name__)

# In a run directory while its recorder is settled: every request finished, every row
# and run.json written.
SETTLED_MARKER = ".settled"
# What closing a run that recorded no request does: removes it (TraceWriter.discard)
REMOVED = "removed"


def settled_marker(run_dir: Path, joined_tag: str | None = None) -> Path:
    """The settled marker of a run's owner, or of the writer ``joined_tag`` that joins it."""
    return run_dir / (SETTLED_MARKER if joined_tag is None else f"{SETTLED_MARKER}-{joined_tag}")


def ancestor_pids(pid: int | None = None, *, depth: int = 8) -> list[int]:
    """Parent, grandparent, ... of ``pid`` (this process) up to ``depth`` levels.

    Read from ``/proc``; where there is none, just the parent of this process.
    """
    pid = os.getpid() if pid is None else pid
    out: list[int] = []
    for _ in range(depth):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return out or ([os.getppid()] if pid == os.getpid() else [])
        pid = int(stat.rpartition(")")[2].split()[1])
        if pid <= 1:
            break
        out.append(pid)
    return out


def _process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no procfs: kill(0) is all we know
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def close_run_of_dead_writer(run_dir: Location | Path, *, closed_by: str) -> str | None:
    """Close a ``running`` tap run whose writing process has exited without closing it.

    ``complete`` when the writer had settled (:data:`SETTLED_MARKER`: every request
    finished, every row written), ``incomplete`` otherwise. Returns the status set, or
    None when the run is not ``running`` or its writer is still alive. Rows are left as
    they are; run.json's part and row counts are taken from the finished parts its writer
    wrote (the writers that joined the run count theirs in their own files).
    """
    # the owner's run.json as written: what this writes back (joined writers keep their own)
    meta = read_run_json(run_dir, derive_status=False, joined=False)
    theirs = tuple(
        part_suffix(str(record.get("writer_id", "")))
        for tag in meta.get(JOINED_WRITERS) or ()
        if (record := joined_record(run_dir, tag)) is not None
    )
    return _close_exited(
        meta,
        run_dir,
        lambda part: not part.name.endswith(theirs),
        marker=settled_marker(Path(run_dir)),  # a local run: its writer's pid is ours to see
        closed_by=closed_by,
        save=lambda closed: write_run_json(run_dir, closed),
    )


def close_joined_writer_of_dead_process(
    run_dir: Location | Path, tag: str, *, closed_by: str
) -> str | None:
    """Close the writer ``tag`` that joined run ``run_dir`` (its ``writers/<tag>.json``) as
    :func:`close_run_of_dead_writer` closes a run: from its own settled marker
    (:func:`~dsparklab.engines.vllm.recorder.settled_marker`), with the parts its writer id
    names. Returns the status set, or None."""
    record = joined_record(run_dir, tag)
    if record is None:
        return None
    mine = part_suffix(str(record.get("writer_id", "")))
    return _close_exited(
        record,
        run_dir,
        lambda part: part.name.endswith(mine),
        marker=settled_marker(Path(Location.of(run_dir).path), tag),
        closed_by=closed_by,
        save=lambda closed: write_json_atomic(
            Location.of(run_dir) / JOINED_DIR / f"{tag}.json", closed
        ),
    )


def _close_exited(
    meta: dict[str, Any],
    run_dir: Location | Path,
    written_here: Callable[[Location], bool],
    *,
    marker: Path,
    closed_by: str,
    save: Callable[[dict[str, Any]], None],
) -> str | None:
    """Close the writer whose record ``meta`` is (run.json, or a joined writer's file) when
    it is ``running`` and its process (``config.pid``) has exited: ``complete`` when it had
    settled (``marker``), else ``incomplete``, its counts taken from the finished parts
    ``written_here`` picks; ``save`` writes the record. Returns the status set, or None."""
    import pyarrow.parquet as pq

    pid = (meta.get("config") or {}).get("pid")
    if meta["status"] != "running" or not isinstance(pid, int) or _process_alive(pid):
        return None
    settled = marker.is_file()
    status = "complete" if settled else "incomplete"
    files = {
        table: [part for part in part_files(run_dir, table) if written_here(part)]
        for table in TABLES
    }
    if (
        settled
        and not any(files.values())
        and not meta.get(JOINED_WRITERS)
        and "writer" not in meta
    ):
        # its engine served no request: no run, as its writer would have left (discard)
        remove_run(run_dir)
        return REMOVED
    meta.update(
        status=status,
        finished_at=utc_now(),
        lease_expires_at=None,
        parts={table: len(found) for table, found in files.items()},
        rows={
            table: sum(pq.read_metadata(p).num_rows for p in found)
            for table, found in files.items()
        },
        ended={
            "closed_by": closed_by,
            "writer_pid": pid,
            "reason": "the writer had settled: every request finished, every row written"
            if settled
            else "the writer ended with requests in flight or rows not yet written",
        },
    )
    save(meta)
    marker.unlink(missing_ok=True)
    return status


def close_runs_of_dead_descendants(
    trace_dir: Location | Path, *, ancestor: int | None = None, wait_s: float = 10.0
) -> dict[str, str]:
    """Close the ``running`` runs below ``trace_dir`` whose writers descend from ``ancestor``
    (this process) and have exited, and the writers that joined a run (each TP rank's under
    batch-sharded sampling) alike; returns ``{run_dir: status}`` (``{run_dir}#<tag>`` for a
    joined writer).

    A writer still alive gets up to ``wait_s`` seconds to exit (and close its run itself).
    """
    ancestor = os.getpid() if ancestor is None else ancestor
    trace_dir = Location.of(trace_dir)
    if not trace_dir.is_local:  # pids mean nothing across hosts: the runs' leases end
        return {}
    mine = _running_writers_of(trace_dir, ancestor)
    closed: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    closed_by = f"dsparklab in pid {ancestor}"
    while mine:
        for run_dir, tag in list(mine):
            if tag is None:
                status = close_run_of_dead_writer(run_dir, closed_by=closed_by)
                still = (
                    status
                    if status is not None
                    else read_run_json(run_dir, derive_status=False, joined=False)["status"]
                )
            else:
                status = close_joined_writer_of_dead_process(run_dir, tag, closed_by=closed_by)
                still = (joined_record(run_dir, tag) or {}).get("status")
            if status is not None or still != "running":
                mine.remove((run_dir, tag))
            if status is not None:
                name = str(run_dir) if tag is None else f"{run_dir}#{tag}"
                closed[name] = status
                logger.info("dsparklab: %s closed as %s (its writer had exited)", name, status)
        if not mine or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return closed


def _running_writers_of(trace_dir: Location, ancestor: int) -> list[tuple[Location, str | None]]:
    """``(run_dir, None)`` for each run below ``trace_dir`` written as ``running`` by a
    descendant of ``ancestor``, ``(run_dir, tag)`` for each such joined writer."""
    found: list[tuple[Location, str | None]] = []
    for run_dir in store_runs(trace_dir):  # the taps' runs, listed below _runs only
        try:
            meta = read_run_json(run_dir, derive_status=False, joined=False)
            writers = [(None, meta)] + [
                (tag, joined_record(run_dir, tag) or {"status": "missing"})
                for tag in meta.get(JOINED_WRITERS) or ()
            ]
        except DSparkLabError:
            continue
        for tag, written in writers:
            ancestors = (written.get("config") or {}).get("ancestor_pids") or ()
            if written["status"] == "running" and ancestor in ancestors:
                found.append((run_dir, tag))
    return found
