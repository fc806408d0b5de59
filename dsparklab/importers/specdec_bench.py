r"""``specdec-bench``: NVIDIA specdec_bench's acceptance_rate.json and speculation_profile.json.

Provenance: ``acceptance_rate.json`` is ``AcceptanceRate`` in NVIDIA/Model-Optimizer's
``examples/specdec_bench/specdec_bench/metrics/acceptance_rate.py`` (main at a2fbac7b:
``Joint_Acceptance_Rate`` is the product of the conditional rates).

``acceptance_rate.json`` is a list with one object per benchmark run (the metric appends):

- ``Acceptance_Length_Histogram``: steps per *length* :math:`L` = tokens emitted in the
  step, bonus included (:math:`L = j + 1`); keys are strings after JSON;
- ``Conditional_Acceptance_Rate[L]`` = :math:`P(L' \ge L \mid L' \ge L_{prev})`, i.e.
  :math:`a_{L-2}` (key 1 is always 1.0); ``Joint_Acceptance_Rate[L]`` = :math:`P(L' \ge
  L)` = :math:`s_{L-2}`;
- ``Request_AL`` (``{request: {turn: mean L}}``) and ``Average_AL``, the **per-request**
  mean (pre-1.0 files: ``Request_AR`` / ``Average_AR``).

``speculation_profile.json`` (schema 1.0) carries ``conditional_accept_rates`` and
``marginal_accept_rates`` by draft position, ``mean_accept_length`` (**per step**) and
``mean_accept_length_per_request`` (they differ: requests of different lengths),
``accept_length_by_k`` (AL measured per window; for block drafters,
``accept_length_model`` = ``measured_per_k``, each K is its own measurement) and
optionally ``acceptance_length_histogram``. Each window in ``accept_length_by_k`` other
than the profile's own becomes a run holding only that AL.

A run directory's ``timing.json`` with its ``configuration.json`` gives that run's step time
(:func:`read_specdec_timing`): measured where the user replayed an acceptance profile,
they come back as a cost table (``dsparklab.analysis.cost_table_from_step_times``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dsparklab.analysis.definitions import (
    accept_len_from_marginal,
    accepted_tokens,
    check,
    conditional_from_marginal,
    counts_from_histogram,
    dense_histogram,
    per_request_accept_len,
    per_step_accept_len,
    specdec_rates_by_length,
)
from dsparklab.importers._common import (
    DEFAULT_DATASET,
    DEFAULT_METHOD,
    Fields,
    ImportedRun,
    Options,
    SourceFile,
    histogram_counter_rows,
    imported_engine,
    is_finite_number,
    json_records,
    largest_difference_check,
    read_source,
    worst_check,
)
from dsparklab.store.rows import counter_row, totals_row

LENGTHS = "Acceptance_Length_Histogram"
ENGINE = "specdec_bench"


def _length_histogram(f: Fields, key: str, n: int | None) -> tuple[np.ndarray, int]:
    """:math:`h_j` (``j = L - 1``) from a length-keyed map, and the window n."""
    raw = f.mapping(key)
    assert raw is not None
    if not raw:
        raise f.error(key, "empty: the run recorded no decode steps")
    with f.definition_errors(key):
        hist = dense_histogram(raw, offset=1, field=f.name(key))
    if np.any(hist != np.round(hist)):
        raise f.error(key, "step counts must be integers")
    observed = len(hist) - 1
    if n is None:
        n = max(observed, 1)
    if observed > n:
        raise f.error(
            key, f"length {observed + 1} means {observed} accepted drafts, more than n = {n}"
        )
    dense = np.zeros(n + 1)
    dense[: len(hist)] = hist
    return dense, n


def _numbers_by_int(
    f: Fields, key: str, *, keys: str, valid: Callable[[int, float], bool], expected: str
) -> dict[int, float] | None:
    """An object of finite numbers keyed by integers (strings after JSON); None if absent.

    ``keys`` names what a key is; ``valid`` accepts a (key, number) pair, else the error
    says ``expected``.
    """
    raw = f.mapping(key, optional=True)
    if raw is None:
        return None
    out: dict[int, float] = {}
    for k, v in raw.items():
        try:
            number = int(k)
        except (TypeError, ValueError):
            raise f.error(f"{key}[{k!r}]", f"key is not an integer {keys}") from None
        if not is_finite_number(v) or not valid(number, v):
            raise f.error(f"{key}[{k!r}]", f"expected {expected}, got {v!r}")
        out[number] = float(v)
    return out


def _rate_map(f: Fields, key: str) -> dict[int, float] | None:
    return _numbers_by_int(
        f, key, keys="length", valid=lambda _, rate: 0 <= rate <= 1, expected="a rate in [0, 1]"
    )


def _per_request(f: Fields) -> tuple[str | None, dict[str, float]]:
    key = f.first_present("Request_AL", "Request_AR")
    if key is None:
        return None, {}
    raw = f.mapping(key)
    assert raw is not None
    out: dict[str, float] = {}
    for rid, turns in raw.items():
        if isinstance(turns, Mapping):
            for turn, value in turns.items():
                if not is_finite_number(value):
                    raise f.error(f"{key}[{rid!r}][{turn!r}]", f"expected a number, got {value!r}")
                out[f"{rid}/turn{turn}"] = float(value)
        elif is_finite_number(turns):
            out[str(rid)] = float(turns)
        else:
            raise f.error(f"{key}[{rid!r}]", f"expected a number or {{turn: AL}}, got {turns!r}")
    return key, out


def _acceptance_run(
    source: SourceFile, record: Any, line: int | None, index: int, options: Options
) -> ImportedRun:
    f = Fields(source, record, line=line)
    if not f.has(LENGTHS):
        raise f.error(
            LENGTHS, "required field missing: not a specdec_bench acceptance_rate.json run"
        )
    hist, n = _length_histogram(f, LENGTHS, options.n)
    raw_lengths = f.mapping(LENGTHS)
    assert raw_lengths is not None
    request_key, per_request = _per_request(f)
    average_key = f.first_present("Average_AL", "Average_AR")
    average = f.number(average_key, low=0.0) if average_key else None
    steps = int(hist.sum())
    checks = []
    if average is not None and per_request:
        checks.append(
            check(
                average_key or "Average_AL",
                average,
                per_request_accept_len(per_request.values()),
                definition="per_request: mean over (request, turn) of each turn's mean length",
            )
        )
    computed = specdec_rates_by_length(raw_lengths)
    conditional = _rate_map(f, "Conditional_Acceptance_Rate")
    joint = _rate_map(f, "Joint_Acceptance_Rate")
    notes = [
        "specdec_bench counts every streamed output chunk as a step (a prefill's first "
        "token, when streamed alone, is a length-1 step; a final EOS-truncated step too)",
        "Average_AL is the per-request mean; the lab's AL is per step",
    ]
    # a length the histogram does not reach has no computed rate: it is the worst
    if conditional is not None:
        checks += worst_check(
            lambda worst: f"Conditional_Acceptance_Rate (worst length {worst})",
            [(str(k), v, computed["conditional"].get(k)) for k, v in conditional.items()],
            definition="a_{L-2} = P(L' >= L | L' >= previous observed length)",
        )
    if joint is not None:
        joint_checks = worst_check(
            lambda worst: f"Joint_Acceptance_Rate (worst length {worst})",
            [(str(k), v, computed["joint"].get(k)) for k, v in joint.items()],
            definition="s_{L-2} = P(L' >= L)",
        )
        if any(not c.equal for c in joint_checks):
            notes.append(
                "Joint_Acceptance_Rate is not the survival P(L >= len): two later release "
                "branches of specdec_bench (NVIDIA/Model-Optimizer commits 67223462f, "
                "c777c44c3) write there the running mean of the survivals up to L, and "
                "drop each beam's last chunk (and a first chunk of length 1) from the lengths"
            )
        checks += joint_checks
    tables: dict[str, list[dict[str, Any]]] = {
        "counters": histogram_counter_rows(hist, n),
        "totals": [
            totals_row(
                num_drafts=steps,
                num_accepted_tokens=int(accepted_tokens(hist)),
                reported_accept_len=average,
                reported_accept_len_definition="per_request" if average is not None else None,
            )
        ],
    }
    for rid, value in per_request.items():
        tables["totals"].append(
            totals_row(
                scope="request",
                request_id=rid,
                reported_accept_len=value,
                reported_accept_len_definition="per_step",
            )
        )
    return ImportedRun(
        fmt="specdec-bench",
        sources=[source],
        granularity="request" if per_request else "aggregate",
        n=n,
        method=options.method_or_default,
        dataset=options.dataset_or_default,
        engine=imported_engine(ENGINE),
        tables=tables,
        reported={
            "steps": steps,
            "per_step_accept_len (from the histogram)": per_step_accept_len(hist),
            f"{average_key} (per request)": average,
            "requests": len(per_request),
            "request_key": request_key,
        },
        checks=checks,
        notes=notes,
        part=f"{source.path.name}:{index}",
    )


def _model(value: Any) -> dict[str, Any]:
    """A profile's model: an object with an ``id`` or ``name``, or the name itself."""
    if isinstance(value, Mapping):
        return {"name": str(value.get("id") or value.get("name") or value)}
    return {"name": str(value or "unknown")}


def _profile_runs(
    source: SourceFile, record: Any, line: int | None, options: Options
) -> list[ImportedRun]:
    f = Fields(source, record, line=line)
    version = f.text("schema_version")
    if version is None:
        raise f.error("schema_version", "required field missing: not a speculation_profile.json")
    if str(version).split(".")[0] != "1":
        raise f.error(
            "schema_version", f"schema {version} is not supported (this importer reads 1.x)"
        )
    if f.value.get("measured") is False:
        raise f.error("measured", "the profile is a stub (measured: false): nothing was measured")
    n = f.req_int("num_speculative_tokens", minimum=1)
    if options.n is not None and options.n != n:
        raise f.error("num_speculative_tokens", f"--n {options.n} but the profile says {n}")
    marginal = f.numbers("marginal_accept_rates", optional=True, allow_null=True, high=1.0)
    conditional = f.numbers("conditional_accept_rates", optional=True, allow_null=True, high=1.0)
    for key, vector in (
        ("marginal_accept_rates", marginal),
        ("conditional_accept_rates", conditional),
    ):
        if vector is not None and len(vector) != n:
            raise f.error(key, f"{len(vector)} entries for num_speculative_tokens = {n}")
    mean_step = f.number("mean_accept_length", low=0.0, optional=True)
    mean_request = f.number("mean_accept_length_per_request", low=0.0, optional=True)
    by_k = (
        _numbers_by_int(
            f,
            "accept_length_by_k",
            keys="window",
            valid=lambda window, _: window >= 1,
            expected="a window >= 1 and a finite AL",
        )
        or {}
    )
    histogram = None
    if f.has("acceptance_length_histogram") and f.mapping("acceptance_length_histogram"):
        histogram, _ = _length_histogram(f, "acceptance_length_histogram", n)
    method = options.method or f.text("method") or DEFAULT_METHOD
    drafter = _model(f.value.get("draft_checkpoint"))
    target = _model(f.value.get("target_model"))
    conditions = f.value.get("measurement_conditions")
    dataset = options.dataset or (
        str(conditions.get("dataset"))
        if isinstance(conditions, Mapping) and conditions.get("dataset")
        else DEFAULT_DATASET
    )
    checks = []
    if marginal is not None and mean_step is not None:
        checks.append(
            check(
                "mean_accept_length vs marginal_accept_rates",
                mean_step,
                accept_len_from_marginal(marginal),
                definition="per_step: 1 + sum_i s_i (rates rounded to 6 decimals)",
                tolerance=1e-6 * (n + 1),
            )
        )
    if marginal is not None and conditional is not None:
        derived = conditional_from_marginal(marginal)
        checks.append(
            largest_difference_check(
                "conditional_accept_rates vs marginal ratios (largest difference)",
                np.nan_to_num(conditional),
                np.where(np.isnan(derived), 0.0, derived),
                definition="a_i = s_i / s_{i-1}",
                tolerance=1e-5,
            )
        )
    if histogram is not None:
        counts = counts_from_histogram(histogram, n)
        steps = float(histogram.sum())
        if marginal is not None and steps:
            checks.append(
                largest_difference_check(
                    "marginal_accept_rates vs acceptance_length_histogram (largest difference)",
                    np.nan_to_num(marginal),
                    counts["n_accepted"].to_numpy() / steps,
                    definition="s_i = #{L >= i + 2} / steps",
                    tolerance=1e-5,
                )
            )
        if mean_step is not None:
            checks.append(
                check(
                    "mean_accept_length vs acceptance_length_histogram",
                    mean_step,
                    per_step_accept_len(histogram),
                    definition="per_step: sum_L L h_L / sum_L h_L",
                    tolerance=1e-6 * (n + 1),
                )
            )
    if n in by_k and mean_step is not None:
        checks.append(
            check(
                f"accept_length_by_k[{n}]",
                by_k[n],
                mean_step,
                definition="per_step AL at the profile's own window",
                tolerance=1e-6,
            )
        )
    if histogram is not None:
        counters = histogram_counter_rows(histogram, n)
    elif marginal is not None or conditional is not None:
        counters = [
            counter_row(
                i,
                accept_rate=None if conditional is None else conditional[i],
                survival=None if marginal is None else marginal[i],
            )
            for i in range(n)
        ]
    else:
        counters = []
    common: dict[str, Any] = dict(
        fmt="specdec-bench",
        sources=[source],
        method=method,
        dataset=dataset,
        engine=imported_engine(ENGINE),
        target=target,
        drafter=drafter,
    )
    profile_notes = [
        f"accept_length_model = {f.text('accept_length_model')!r}, verification_method = "
        f"{f.text('verification_method')!r}",
        "mean_accept_length is per step; mean_accept_length_per_request weighs requests equally",
    ]
    if not counters:
        profile_notes.append("no per-position vectors (block verification?): AL only")
    runs = [
        ImportedRun(
            granularity="aggregate",
            n=n,
            tables={
                "counters": counters,
                "totals": [
                    totals_row(
                        num_drafts=int(histogram.sum()) if histogram is not None else None,
                        num_accepted_tokens=int(accepted_tokens(histogram))
                        if histogram is not None
                        else None,
                        reported_accept_len=mean_step,
                        reported_accept_len_definition="per_step"
                        if mean_step is not None
                        else None,
                    )
                ],
            },
            reported={
                "mean_accept_length (per step)": mean_step,
                "mean_accept_length_per_request": mean_request,
                "accept_length_by_k": {str(k): v for k, v in sorted(by_k.items())},
                "accept_length_model": f.text("accept_length_model"),
            },
            checks=checks,
            notes=profile_notes,
            part="profile",
            **common,
        )
    ]
    for window, value in sorted(by_k.items()):
        if window == n:
            continue
        runs.append(
            ImportedRun(
                granularity="aggregate",
                n=window,
                tables={
                    "totals": [
                        totals_row(
                            reported_accept_len=value, reported_accept_len_definition="per_step"
                        )
                    ]
                },
                reported={"accept_length_by_k": {str(window): value}},
                notes=[
                    f"accept_length_by_k[{window}] of a profile measured at n = {n}: the AL only"
                ],
                part=f"profile-k{window}",
                **common,
            )
        )
    return runs


def import_specdec_bench(sources: Sequence[SourceFile], options: Options) -> list[ImportedRun]:
    """Runs from acceptance_rate.json files (one per entry) and speculation profiles."""
    runs: list[ImportedRun] = []
    for source in sources:
        records = json_records(source)
        stripped = source.text.lstrip()
        if stripped.startswith("["):
            if not records:
                raise source.error("an empty list of runs")
            for index, record in enumerate(records):
                runs.append(_acceptance_run(source, record.value, record.line, index, options))
        elif (
            len(records) == 1
            and isinstance(records[0].value, dict)
            and "schema_version" in records[0].value
        ):
            runs += _profile_runs(source, records[0].value, records[0].line, options)
        elif (
            len(records) == 1 and isinstance(records[0].value, dict) and LENGTHS in records[0].value
        ):
            runs.append(_acceptance_run(source, records[0].value, records[0].line, 0, options))
        else:
            raise source.error(
                "neither an acceptance_rate.json (a list of runs) nor a speculation_profile.json "
                "(an object with schema_version)",
                field="schema_version",
            )
    return runs


# -- timing.json + configuration.json: a run's step time, for a cost table -------------------
# Field names as NVIDIA/Model-Optimizer writes them at a2fbac7b: ``timing.json`` by
# ``examples/specdec_bench/specdec_bench/metrics/timing.py`` (a list, one object appended per
# invocation; ``compute_statistics`` formats each statistic as a string with 4 decimals);
# ``configuration.json`` by ``specdec_bench/utils.py:dump_env`` (``vars(args)`` of ``run.py``:
# ``speculative_algorithm``, ``draft_length``, ``concurrency``, ``engine``; plus ``gpu``).
# The step intervals are ``zip(times[1:], times[:-1])`` with ``times[0]`` the request's
# start, so the first is the time to first token.
TIMING_FILE = "timing.json"
CONFIGURATION_FILE = "configuration.json"
STEP_TIME = "Request Generation Step Time"  # each request's intervals between output chunks
NO_SPECULATION = "NONE"  # run.py's --speculative_algorithm without a drafter
TIMING_COLUMNS = (
    "run_dir", "method", "n", "concurrency", "repeat", "step_time_s", "output_tps", "engine",
    "gpu",
)  # fmt: skip


def _step_time(f: Fields) -> float:
    """The median of ``Request Generation Step Time`` in seconds (``quantiles["0.5"]``, a
    string after ``compute_statistics``). Not the mean: specdec_bench's intervals start at
    the request's send time, so each request's first interval is its time to first token,
    and a drafting run (fewer chunks per request) would weigh it more."""
    stats = f.sub(STEP_TIME)
    quantiles = stats.sub("quantiles")
    raw = quantiles.value.get("0.5")
    try:
        value = float(raw) if isinstance(raw, (str, int, float)) else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise quantiles.error("0.5", f"expected a number of seconds, got {raw!r}")
    if not value > 0:
        raise quantiles.error("0.5", f"must be > 0 seconds, got {raw!r}")
    return value


def read_specdec_timing(run_dirs: Sequence[Path], *, method: str | None = None) -> pd.DataFrame:
    """The step time of specdec_bench runs, one row per ``timing.json`` entry.

    Each directory is one ``run.py --save_dir``: ``configuration.json`` gives the run's
    ``speculative_algorithm`` (``NONE``: the target alone, ``method = "none"``, ``n = 0``;
    else lower-cased, or ``method`` when given, e.g. ``dspark`` for a vLLM DSpark engine run
    as ``MTP``), ``draft_length`` (n) and ``concurrency``; each ``timing.json`` entry a
    repeat of it (``configuration.json`` describes the last invocation only, so entries of
    other settings must not share a directory). ``step_time_s`` is the entry's median
    interval between a request's output chunks (one engine step each when the engine
    streams a step's tokens together; the median leaves out each request's time to first
    token), written with 4 decimals of a second (about 1 % of a 5 ms step).

    Bad input: :class:`~dsparklab.errors.InputFormatError` naming the file and field.
    """
    rows = []
    for run_dir in run_dirs:
        config_source = read_source(Path(run_dir) / CONFIGURATION_FILE)
        documents = json_records(config_source)
        if len(documents) != 1:
            raise config_source.error(f"expected one JSON object, got {len(documents)} values")
        config = Fields(config_source, documents[0].value)
        algorithm = config.value.get("speculative_algorithm")
        if not isinstance(algorithm, str) or not algorithm:
            raise config.error("speculative_algorithm", f"expected a name, got {algorithm!r}")
        speculative = algorithm.upper() != NO_SPECULATION
        n = config.req_int("draft_length", minimum=1) if speculative else 0
        concurrency = config.req_int("concurrency", minimum=1)
        timing_source = read_source(Path(run_dir) / TIMING_FILE)
        records = json_records(timing_source)
        if not records:
            raise timing_source.error("an empty list of runs")
        for repeat, record in enumerate(records):
            f = Fields(timing_source, record.value, prefix=f"[{repeat}]", line=record.line)
            rows.append(
                {
                    "run_dir": str(run_dir),
                    "method": (method or algorithm.lower()) if speculative else "none",
                    "n": n,
                    "concurrency": concurrency,
                    "repeat": repeat,
                    "step_time_s": _step_time(f),
                    "output_tps": f.number("Output TPS", low=0.0),
                    "engine": config.value.get("engine"),
                    "gpu": config.value.get("gpu"),
                }
            )
    return pd.DataFrame(rows, columns=list(TIMING_COLUMNS))
