"""The counting stage's SQL: one query text per counter, the same text for DuckDB and Spark.

Each counter is a template rendered by :func:`render` into plain SQL that both engines
accept (no quoted identifiers, no engine-specific functions: ``CAST``, ``CASE``, ``LEAST``,
``GREATEST``, ``FLOOR``, ``isnan``, ``COALESCE``, ``VALUES``). The queries read three
relations, which :mod:`dsparklab.analysis.sql.engines` registers:

- ``positions``: the positions table with ``run_id`` (one row per drafted position);
- ``steps``: the steps table with ``run_id`` (one row per (request, step));
- ``runs``: one row per selected run with the run columns (``run_id``, ``engine``,
  ``method``, ``n``, ``target``, ``drafter``, ``tier``, ``temperature``, ``dataset``).

Run columns always come from ``runs`` (an inner join on ``run_id``, which is also what
selects runs by status and filter); row columns (``request_id``, ``prompt_id``) from the
tables. The same texts count a store (:func:`~dsparklab.analysis.sql.aggregate_store`) and
frames in memory (:func:`~dsparklab.analysis.sql.count_frames`): they are the library's
only counters. The tests hold each one equal to an independent numpy counter
(``tests/oracles.py``) on every store shape ``dsparklab validate`` accepts (integer counts
exactly; float sums up to summation order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsparklab.analysis.layouts import DEFAULT_LEVELS, STEP_MATCH_COLUMNS
from dsparklab.errors import DSparkLabError

# Row-level grouping columns besides the run columns, and the relation each comes from in
# the positions queries (``t``: positions; ``u``: the step, i.e. the steps table's row).
ROW_COLUMNS = ("request_id", "prompt_id")
# Binned step columns acceptance can be counted by (from the steps table): the context a
# step drafted from (prompt plus tokens emitted so far, ``context_len``) and the output
# depth (tokens the request had emitted when the step's draft began: its ``context_len``
# less the request's first). Each bin is named by its lower edge; the last is open.
BIN_EDGES: dict[str, tuple[int, ...]] = {
    "context_bin": (0, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
    "depth_bin": (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
}
BIN_SOURCES = {"context_bin": "s.context_len", "depth_bin": "s.depth"}
_POSITION_ROW_ALIAS = {"request_id": "t", "prompt_id": "s"}
_PREFIX_ROW_ALIAS = {"request_id": "u", "prompt_id": "u"}
NAN = "CAST('NaN' AS DOUBLE)"

# -- acceptance from the steps table -------------------------------------------------------
# Per step D = num_drafted, L = min(num_verified, D), A = min(accepted_len, L); position i
# (< D) is drafted, reached iff A >= i and L > i, accepted iff A > i. Steps are first
# histogrammed by (run, row keys, D, L, A), so the run columns join the few histogram cells
# rather than every step; then the cells are spread over positions.
ACCEPTANCE_STEPS = """
WITH {bins}h0 AS (
  SELECT s.run_id AS run_id, {row_keys}
    s.num_drafted AS d,
    LEAST(s.num_verified, s.num_drafted) AS l,
    LEAST(s.accepted_len, s.num_verified, s.num_drafted) AS a,
    COUNT(*) AS c
  FROM {step_rows} s
  WHERE s.num_drafted > 0
  GROUP BY s.run_id, {row_group}
    s.num_drafted,
    LEAST(s.num_verified, s.num_drafted),
    LEAST(s.accepted_len, s.num_verified, s.num_drafted)
),
h AS (
  SELECT {keys}
    h0.d AS d, h0.l AS l, h0.a AS a, SUM(h0.c) AS c
  FROM h0 JOIN runs r ON h0.run_id = r.run_id
  GROUP BY {group}
    h0.d, h0.l, h0.a
)
SELECT {h_keys}
  g.position AS position,
  CAST(SUM(h.c) AS BIGINT) AS n_drafted,
  CAST(SUM(CASE WHEN h.a >= g.position AND h.l > g.position THEN h.c ELSE 0 END) AS BIGINT)
    AS n_reached,
  CAST(SUM(CASE WHEN h.a > g.position THEN h.c ELSE 0 END) AS BIGINT) AS n_accepted
FROM h JOIN (SELECT * FROM (VALUES {grid}) AS p(position)) g ON g.position < h.d
GROUP BY {h_group} g.position
"""

# -- per-row quantities from the positions table -------------------------------------------
# x: one row per position row, joined to its step's row of the steps table (accepted_len A,
# num_verified V, prompt_id): reached = position <= A and position < V. A is the step's
# accepted rows on any trace that passes validate (its invariant accepted_len = accepted
# positions), so no per-step count of the positions is needed; a position row without a
# steps row (which validate rejects, and TraceWriter never leaves) counts as drafted only.
POSITION_ROWS = """
WITH x AS (
  SELECT {keys}
    t.position AS position,
    t.accepted AS accepted,
    COALESCE(t.position <= s.accepted_len AND t.position < s.num_verified, FALSE) AS reached,
    CAST(t.confidence AS DOUBLE) AS confidence
  FROM positions t
    LEFT JOIN steps s
      ON s.run_id = t.run_id AND s.request_id = t.request_id AND s.step = t.step
    JOIN runs r ON t.run_id = r.run_id
)
"""

# The prefix score needs every earlier position of the row's step, so the rows are
# pivoted per step rather than joined back: k holds each step's confidences c_0..c_{P-1}
# (NULL where the row is missing or its confidence is null) and labels a_0..a_{P-1} (NULL
# where the row is missing); u joins the step's steps row (num_verified, prompt_id; NULL
# where there is none) and multiplies the prefix products c_0 * ... * c_j left to right in
# float64, as numpy's running product does; x unpivots one row per position row present,
# verified = position < num_verified (or no steps row).
PREFIX_ROWS = """
WITH k AS (
  SELECT t.run_id, t.request_id, t.step{pivot}
  FROM positions t
  GROUP BY t.run_id, t.request_id, t.step
),
u AS (
  SELECT k.run_id, k.request_id, k.step, s.num_verified, s.prompt_id{labels}{prefix}
  FROM k LEFT JOIN steps s
    ON s.run_id = k.run_id AND s.request_id = k.request_id AND s.step = k.step
),
x AS (
  SELECT {keys}
    g.position AS position,
    {label} = 1 AS accepted,
    (u.num_verified IS NULL OR g.position < u.num_verified) AS verified,
    {prefix_score} AS prefix_confidence
  FROM u JOIN runs r ON u.run_id = r.run_id
    CROSS JOIN (SELECT * FROM (VALUES {grid}) AS p(position)) g
  WHERE {label} IS NOT NULL
)
"""

# When every step of the selection verified every position it drafted (no adaptive
# verification: UNVERIFIED_STEPS counts none) and no key comes from the steps table, a row
# is reached iff its position is at most its step's accepted rows A (prefix-closed
# acceptance; validate's invariant accepted_len = accepted rows), summed by a window over
# the step: x without the join of every position row with the steps table.
# (The window runs over the positions alone, before the join with runs: DuckDB then sorts
# the few columns it needs, not every run column joined to every row.)
POSITION_ROWS_WINDOW = """
WITH x AS (
  SELECT {keys}
    t.position AS position,
    t.accepted AS accepted,
    t.reached AS reached,
    CAST(t.confidence AS DOUBLE) AS confidence
  FROM (
    SELECT p.run_id, p.request_id, p.position, p.accepted, p.confidence,
      p.position <= SUM(CASE WHEN p.accepted THEN 1 ELSE 0 END)
        OVER (PARTITION BY p.run_id, p.request_id, p.step) AS reached
    FROM positions p
  ) t JOIN runs r ON t.run_id = r.run_id
)
"""
UNVERIFIED_STEPS = """
SELECT COUNT(*) AS n
FROM steps s JOIN runs r ON s.run_id = r.run_id
WHERE s.num_verified < s.num_drafted
"""

# Acceptance counters per (keys, position) from the position rows.
ACCEPTANCE_COUNTS = """
SELECT {x_keys}
  x.position AS position,
  CAST(COUNT(*) AS BIGINT) AS n_drafted,
  CAST(SUM(CASE WHEN x.reached THEN 1 ELSE 0 END) AS BIGINT) AS n_reached,
  CAST(SUM(CASE WHEN x.reached AND x.accepted THEN 1 ELSE 0 END) AS BIGINT) AS n_accepted
FROM x
GROUP BY {x_group} x.position
"""
ACCEPTANCE_POSITIONS = POSITION_ROWS + ACCEPTANCE_COUNTS
ACCEPTANCE_POSITIONS_WINDOW = POSITION_ROWS_WINDOW + ACCEPTANCE_COUNTS

# Calibration counters of one score per (keys, position, bin, level, label):
# bin = min(max(floor(s * B), 0), B - 1); level = the exact score or
# the grid cell floor(s * L) clipped to [0, L - 1], given by its lower edge cell / L.
CALIBRATION_COUNTS = """,
y AS (
  SELECT {x_keys}
    x.position AS position,
    x.accepted AS accepted,
    x.{score} AS s,
    LEAST(GREATEST(CAST(FLOOR(x.{score} * {n_bins}) AS BIGINT), 0), {last_bin}) AS bin,
    {level_code} AS level_code
  FROM x
  WHERE {keep}
)
SELECT {y_keys}
  '{score}' AS score,
  y.position AS position,
  y.bin AS bin,
  CAST(y.bin AS DOUBLE) / {n_bins} AS bin_lo,
  CAST(y.bin + 1 AS DOUBLE) / {n_bins} AS bin_hi,
  {level} AS level,
  y.accepted AS accepted,
  CAST(COUNT(*) AS BIGINT) AS count,
  SUM(y.s) AS sum_score,
  SUM(y.s * y.s) AS sum_score_sq
FROM y
GROUP BY {y_group} y.position, y.bin, y.level_code, y.accepted
"""
CALIBRATION = POSITION_ROWS + CALIBRATION_COUNTS
CALIBRATION_WINDOW = POSITION_ROWS_WINDOW + CALIBRATION_COUNTS
PREFIX_CALIBRATION = PREFIX_ROWS + CALIBRATION_COUNTS

# Which rows each score is judged on: the head's output at reached
# positions; the prefix product at every verified position.
SCORE_ROWS = {
    "confidence": "x.reached AND x.confidence IS NOT NULL AND NOT isnan(x.confidence)",
    "prefix_confidence": (
        "x.verified AND x.prefix_confidence IS NOT NULL AND NOT isnan(x.prefix_confidence)"
    ),
}

# -- step times ----------------------------------------------------------------------------
# A step without a verify time makes its group's time sums NaN, a step without emitted its
# group's token sum; a null (or NaN) draft or other time counts 0.
_DRAFT, _OTHER = (
    f"CASE WHEN s.{c} IS NULL OR isnan(s.{c}) THEN 0.0 ELSE s.{c} END"
    for c in ("draft_time_s", "other_time_s")
)
_UNTIMED = "COUNT(s.verify_time_s) < COUNT(*)"
STEP_TIMES = f"""
SELECT {{keys}}
  CAST(COUNT(*) AS BIGINT) AS n_steps,
  CASE WHEN COUNT(s.emitted) < COUNT(*) THEN {NAN}
    ELSE CAST(SUM(s.emitted) AS DOUBLE) END AS sum_tokens,
  CASE WHEN {_UNTIMED} THEN {NAN}
    ELSE SUM({_DRAFT} + s.verify_time_s + {_OTHER}) END AS sum_time,
  CASE WHEN {_UNTIMED} THEN {NAN} ELSE SUM({_DRAFT}) END AS sum_draft,
  CASE WHEN {_UNTIMED} THEN {NAN} ELSE SUM(s.verify_time_s) END AS sum_verify
FROM steps s JOIN runs r ON s.run_id = r.run_id
GROUP BY {{group}}
"""


@dataclass(frozen=True)
class Counter:
    """One counter: its query template and the relations it reads."""

    name: str
    template: str
    tables: tuple[str, ...]


COUNTERS: dict[str, Counter] = {
    "acceptance_steps": Counter("acceptance_steps", ACCEPTANCE_STEPS, ("steps", "runs")),
    "acceptance": Counter("acceptance", ACCEPTANCE_POSITIONS, ("positions", "steps", "runs")),
    "calibration": Counter("calibration", CALIBRATION, ("positions", "steps", "runs")),
    "step_times": Counter("step_times", STEP_TIMES, ("steps", "runs")),
}


def _key_lists(keys: Sequence[str], alias: dict[str, str]) -> tuple[str, str]:
    """``"a.k AS k, ..."`` and ``"a.k, ..."`` (each with a trailing comma when non-empty)."""
    exprs = [f"{alias.get(k, 'r')}.{k}" for k in keys]
    select = "".join(f"{e} AS {k}, " for e, k in zip(exprs, keys, strict=True))
    return select, "".join(f"{e}, " for e in exprs)


def _check_keys(keys: Sequence[str]) -> None:
    for key in keys:
        if not key.isidentifier() or key.lower() in {"position", "score", "level", "bin"}:
            raise DSparkLabError(f"cannot group counters by {key!r}")


def render(
    counter: str,
    *,
    keys: Sequence[str] = (),
    n_positions: int = 1,
    score: str = "confidence",
    n_bins: int = 10,
    levels: int | None = DEFAULT_LEVELS,
    all_verified: bool = False,
) -> str:
    """The SQL text of ``counter`` grouped by ``keys`` (run columns and row columns).

    Parameters
    ----------
    counter
        A name of :data:`COUNTERS`.
    keys
        Output key columns: run columns (taken from ``runs``) and ``request_id`` /
        ``prompt_id`` (from the tables); ``step_times`` also the steps' ``batch_size``,
        and needs at least one.
    n_positions
        P, the widest window of the selected runs: positions ``0..P-1`` are counted.
    score, n_bins, levels
        Calibration only: the score (``confidence`` or ``prefix_confidence``), the number
        of equal-width bins B and the level grid L (None: the exact score values).
    all_verified
        Every selected step verified every position it drafted (:data:`UNVERIFIED_STEPS`
        counts none): ``acceptance`` and the ``confidence`` calibration then find reached
        rows by a window over each step instead of a join with the steps table, unless a
        key (``prompt_id``) comes from there. Both give the same counts on such runs.

    Returns
    -------
    str
        A query both DuckDB and Spark SQL run as is.
    """
    if counter not in COUNTERS:
        raise DSparkLabError(f"unknown counter {counter!r}; valid counters are {sorted(COUNTERS)}")
    _check_keys(keys)
    width = max(int(n_positions), 1)
    fields: dict[str, object] = {}
    for name in ("h", "x", "y"):
        fields[f"{name}_keys"], fields[f"{name}_group"] = _key_lists(
            keys, dict.fromkeys(keys, name)
        )
    if counter == "acceptance_steps":
        rows = [k for k in keys if k in ROW_COLUMNS or k in BIN_EDGES]
        fields["row_keys"], fields["row_group"] = _key_lists(rows, dict.fromkeys(rows, "s"))
        fields["keys"], fields["group"] = _key_lists(
            keys, dict.fromkeys([*ROW_COLUMNS, *BIN_EDGES], "h0")
        )
        fields["grid"] = _grid(width)
        fields["bins"], fields["step_rows"] = _binned_steps([k for k in keys if k in BIN_EDGES])
        return COUNTERS[counter].template.format(**fields)
    if any(k in BIN_EDGES for k in keys):
        raise DSparkLabError(
            f"{counter} cannot group by {[k for k in keys if k in BIN_EDGES]}: the bins are "
            "counted from the steps table (acceptance_steps)"
        )
    if counter == "step_times":
        if not keys:
            raise DSparkLabError("step_times needs at least one key column")
        fields["keys"], group = _key_lists(
            keys, dict.fromkeys([*ROW_COLUMNS, *STEP_MATCH_COLUMNS], "s")
        )
        fields["group"] = group.rstrip(", ")
        return COUNTERS[counter].template.format(**fields)
    prefix = counter == "calibration" and score == "prefix_confidence"
    fields["keys"], _ = _key_lists(keys, _PREFIX_ROW_ALIAS if prefix else _POSITION_ROW_ALIAS)
    if prefix:
        fields.update(_pivot(width))
    by_window = all_verified and "prompt_id" not in keys
    if counter == "acceptance":
        template = ACCEPTANCE_POSITIONS_WINDOW if by_window else COUNTERS[counter].template
        return template.format(**fields)
    if score not in SCORE_ROWS:
        raise DSparkLabError(f"unknown calibration score {score!r}; valid: {sorted(SCORE_ROWS)}")
    if n_bins < 1:
        raise DSparkLabError(f"n_bins must be >= 1, got {n_bins}")
    if levels is not None and levels < 1:
        raise DSparkLabError(f"levels must be >= 1 or None (exact), got {levels}")
    if levels is None:  # the exact score is its own level
        fields["level_code"], fields["level"] = f"x.{score}", "y.level_code"
    else:
        cell = f"CAST(FLOOR(x.{score} * {levels}) AS BIGINT)"
        fields["level_code"] = f"LEAST(GREATEST({cell}, 0), {levels - 1})"
        fields["level"] = f"CAST(y.level_code AS DOUBLE) / {levels}"
    if prefix:
        template = PREFIX_CALIBRATION
    else:
        template = CALIBRATION_WINDOW if by_window else COUNTERS[counter].template
    return template.format(
        **fields, score=score, n_bins=n_bins, last_bin=n_bins - 1, keep=SCORE_ROWS[score]
    )


def _pivot(width: int) -> dict[str, str]:
    """The per-step pivot of confidences and labels over positions ``0..width-1``, the
    prefix products, and each unpivoted row's label and prefix score."""
    pivot = "".join(
        f",\n    MAX(CASE WHEN t.position = {i} THEN CAST(t.confidence AS DOUBLE) END) AS c{i}"
        f",\n    MAX(CASE WHEN t.position = {i} THEN CASE WHEN t.accepted THEN 1 ELSE 0 END END)"
        f" AS a{i}"
        for i in range(width)
    )
    labels = "".join(f", k.a{i}" for i in range(width))
    # (((c0 * c1) * c2) ...): SQL multiplies left to right, as numpy's running product
    products = ["k.c0"]
    for i in range(1, width):
        products.append(f"{products[-1]} * k.c{i}")
    prefix = "".join(f",\n    {p} AS pp{i}" for i, p in enumerate(products))

    def at(column: str) -> str:
        cases = " ".join(f"WHEN {i} THEN u.{column}{i}" for i in range(width))
        return f"CASE g.position {cases} END"

    return {
        "pivot": pivot,
        "labels": labels,
        "prefix": prefix,
        "label": at("a"),
        "prefix_score": at("pp"),
        "grid": _grid(width),
    }


def _bin_case(column: str, edges: Sequence[int]) -> str:
    """``CASE``: the lower edge of the bin ``column`` falls in (NULL stays NULL)."""
    ladder = " ".join(
        f"WHEN {column} < {hi} THEN {lo}" for lo, hi in zip(edges[:-1], edges[1:], strict=True)
    )
    return f"CASE WHEN {column} IS NULL THEN NULL {ladder} ELSE {edges[-1]} END"


def _binned_steps(bins: Sequence[str]) -> tuple[str, str]:
    """The CTEs that add ``bins`` to the steps rows, and the relation to read them from
    (``steps`` itself when no bin is asked for). The depth needs each request's first
    context (a window over its steps), so it is only computed when asked for."""
    if not bins:
        return "", "steps"
    depth = (
        ", s.context_len - MIN(s.context_len) OVER (PARTITION BY s.run_id, s.request_id) AS depth"
        if "depth_bin" in bins
        else ""
    )
    cases = "".join(f", {_bin_case(BIN_SOURCES[b], BIN_EDGES[b])} AS {b}" for b in bins)
    return (
        f"sd AS (SELECT s.*{depth} FROM steps s),\nsb AS (SELECT s.*{cases} FROM sd s),\n",
        "sb",
    )


def _grid(width: int) -> str:
    """``(0), (1), ..., (width - 1)``: the positions a VALUES list spreads rows over."""
    return ", ".join(f"({i})" for i in range(width))
