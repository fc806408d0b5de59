"""What adaptive verification would buy on recorded traffic (a replay, not a run)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
    NO_CONFIDENCE,
    UNIT_COLUMNS,
    as_columns,
    combined_codes,
    factorize,
    require_columns,
    require_values,
    tidy,
)
from dsparklab.analysis._kernels import group_sums, step_codes
from dsparklab.analysis.prepare import annotate_positions
from dsparklab.errors import DSparkLabError

DEFAULT_TAUS = tuple(np.round(np.linspace(0.0, 1.0, 21), 10))


def compute_adaptive_verification(
    positions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    taus: Sequence[float] = DEFAULT_TAUS,
) -> pd.DataFrame:
    """Tokens per step and verified positions per step if only confident prefixes were verified.

    Parameters
    ----------
    positions
        The positions table of runs that recorded the confidence head (steps with a null
        confidence anywhere, e.g. every Eagle3 step, are left out).
    steps
        The steps table; needed when the recorded runs already verified adaptively
        (``num_verified < num_drafted``), so that censored steps are counted.
    by
        Step-level grouping columns (run columns, ``prompt_id``, ``request_id``).
    taus
        Thresholds on the prefix confidence.

    Returns
    -------
    pandas.DataFrame
        One row per group and ``tau``: ``n_steps``, ``tokens_per_step`` (emitted, bonus
        included), ``verified_per_step`` (drafted positions sent to the target),
        ``tokens_per_step_full`` and ``verified_per_step_full`` (verifying everything, as
        recorded), ``tokens_per_verified`` = tokens_per_step / (verified_per_step + 1)
        (emitted tokens per token the target scores; the +1 is the bonus slot), and
        ``n_censored`` (steps whose outcome the trace cannot tell; counted as a lower
        bound). ``sum_tokens``, ``sum_verified`` are the summable counters.

    Notes
    -----
    For a step with confidences :math:`c_0, \\dots, c_{n-1}` and :math:`A` accepted
    positions under full verification, the adaptive verifier keeps the longest prefix
    whose running product stays above :math:`\\tau`:

    .. math::

        k(\\tau) = \\max\\{k : \\textstyle\\prod_{j \\le i} c_j \\ge \\tau
                   \\ \\forall i < k\\}, \\qquad
        \\mathrm{tokens}(\\tau) = \\min(A, k(\\tau)) + 1

    Greedy acceptance of position :math:`i` depends only on the prefix, so the first
    :math:`\\min(A, k)` positions are accepted either way and the bonus token is the
    target's own. The replay keeps the recorded steps: in a real run a shorter accept
    changes where the next step starts, which no trace can replay. Where the recorded
    run verified only :math:`V < n` positions and accepted all of them, :math:`A` is
    censored at :math:`V`; such steps with :math:`k > V` are counted in ``n_censored``.
    """
    by = as_columns(by)
    if len(taus) == 0:
        raise DSparkLabError("taus is empty; pass thresholds, e.g. np.linspace(0, 1, 21)")
    require_columns(positions, ["confidence"], what="compute_adaptive_verification")
    require_values(positions, "confidence", what="adaptive verification", why=NO_CONFIDENCE)
    frame = annotate_positions(positions, steps=steps)
    require_columns(frame, by, what="compute_adaptive_verification")
    request_code, _ = combined_codes(frame, UNIT_COLUMNS)
    position = frame["position"].to_numpy(dtype=np.int64)
    step_code, n_steps = step_codes(request_code, frame["step"].to_numpy(dtype=np.int64))
    if n_steps == 0:
        return pd.DataFrame(columns=[*by, "tau", "n_steps", "tokens_per_step"])
    n_pos = int(position.max()) + 1
    prefix = np.full((n_steps, n_pos), np.nan)  # [S, P]; NaN: not drafted or no confidence
    prefix[step_code, position] = frame["prefix_confidence"].to_numpy(dtype=np.float64)
    drafted = np.bincount(step_code, minlength=n_steps)  # [S]
    accepted = np.zeros(n_steps, dtype=np.int64)  # [S]
    accepted[step_code] = frame["step_accepted"].to_numpy(dtype=np.int64)
    verified = np.full(n_steps, np.iinfo(np.int64).max)  # [S]
    if "num_verified" in frame.columns:
        verified[step_code] = frame["num_verified"].to_numpy(dtype=np.int64)
    # every drafted position of the step has a confidence
    keep = (~np.isnan(prefix)).sum(axis=1) == drafted  # [S]
    full_verified = np.minimum(drafted, verified)
    censored_full = accepted >= full_verified  # accepted all that was verified

    first_row = np.zeros(n_steps, dtype=np.int64)
    first_row[step_code] = np.arange(len(step_code))
    step_frame = frame.iloc[first_row].reset_index(drop=True)
    codes, sizes, uniques = factorize(step_frame, list(by))
    pieces = []
    for tau in taus:
        with np.errstate(invalid="ignore"):
            ok = prefix >= tau  # [S, P]
        k = np.cumprod(ok, axis=1).sum(axis=1)  # [S] leading positions above tau
        tokens = np.minimum(accepted, k) + 1
        censored = censored_full & (k > full_verified) & (verified < drafted)
        cells, count, s = group_sums(
            [c[keep] for c in codes],
            sizes,
            {
                "sum_tokens": tokens[keep],
                "sum_verified": k[keep],
                "sum_tokens_full": accepted[keep] + 1,
                "sum_verified_full": full_verified[keep],
                "n_censored": censored[keep],
            },
        )
        pieces.append(
            tidy(
                list(by),
                cells,
                uniques,
                {
                    "tau": np.full(len(count), float(tau)),
                    "n_steps": count.astype(np.int64),
                    **{name: value for name, value in s.items()},
                },
            )
        )
    out = pd.concat(pieces, ignore_index=True)
    out["n_censored"] = out["n_censored"].astype(np.int64)
    out["tokens_per_step"] = out["sum_tokens"] / out["n_steps"]
    out["verified_per_step"] = out["sum_verified"] / out["n_steps"]
    out["tokens_per_step_full"] = out["sum_tokens_full"] / out["n_steps"]
    out["verified_per_step_full"] = out["sum_verified_full"] / out["n_steps"]
    out["tokens_per_verified"] = out["sum_tokens"] / (out["sum_verified"] + out["n_steps"])
    return out
