"""Synthetic traces for the analysis tests (test data, never a measurement).

``build_run`` draws one run in the store's layout: steps rows and positions rows with the
contract's columns and dtypes, plus the run-level columns that ``read_trace`` joins on.
``write_run`` writes such a run through the real ``TraceWriter``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dsparklab.store import POSITIONS_SCHEMA, STEPS_SCHEMA, TraceWriter, new_run_json
from dsparklab.store.location import Location

TARGET = "tiny-target"
# rate [S, n] (per-position acceptance probability), rng -> the confidence head's output [S, n]
ConfidenceModel = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def noisy_confidence(sd: float) -> ConfidenceModel:
    """An informative head: the acceptance probability plus N(0, sd) noise, clipped to [0, 1]."""
    return lambda rate, rng: np.clip(rate + rng.normal(0, sd, rate.shape), 0, 1)


def uniform_confidence(lo: float, hi: float) -> ConfidenceModel:
    """A head that ignores the acceptance probability: uniform on [lo, hi]."""
    return lambda rate, rng: rng.uniform(lo, hi, rate.shape)


@dataclass
class Run:
    meta: dict
    steps: pd.DataFrame
    positions: pd.DataFrame


def _run_columns(meta: dict) -> dict:
    return {
        "run_id": meta["run_id"],
        "engine": meta["engine"]["name"],
        "method": meta["method"],
        "n": meta["num_speculative_tokens"],
        "target": meta["target"]["name"],
        "drafter": (meta["drafter"] or {}).get("name", "none"),
        "tier": meta.get("tier", ""),
        "temperature": float(meta["sampling"]["temperature"]),
        "dataset": meta["dataset"],
    }


def build_run(
    *,
    run_id: str = "run-a",
    method: str = "dspark",
    n: int = 5,
    dataset: str = "gsm8k",
    n_requests: int = 20,
    steps_per_request: int | Sequence[int] = 10,
    accept: float | Sequence[float] = 0.7,
    seed: int = 0,
    confidence: ConfidenceModel | None = None,
    flip_rate: float = 0.2,
    draft_time: float | Callable[[int], float] = 0.002,
    verify_time: float = 0.010,
    num_verified: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
    prompt_prefix: str = "p",
) -> Run:
    """One run with position i accepted w.p. ``accept[i]`` given the earlier ones were.

    ``confidence(rate [S, n], rng) -> [S, n]`` makes the confidence head's output from the
    per-position acceptance probability (default: the probability itself, i.e. calibrated).
    ``num_verified(num_drafted [S], rng) -> [S]`` simulates adaptive verification.
    """
    rng = np.random.default_rng(seed)
    markov = method == "dspark"
    meta = new_run_json(
        run_id=run_id,
        engine={"name": "synthetic", "version": "0"},
        method=method,
        num_speculative_tokens=n,
        target={"name": TARGET},
        drafter=None if method == "none" else {"name": f"{method}-tiny"},
        dataset=dataset,
        sampling={"temperature": 0.0, "seed": seed},
        synthetic=True,
    )
    counts = (
        np.full(n_requests, steps_per_request)
        if np.isscalar(steps_per_request)
        else np.asarray(steps_per_request)
    )
    request = np.repeat(np.arange(n_requests), counts)  # [S]
    step = np.concatenate([np.arange(c) for c in counts]) if len(counts) else np.zeros(0, int)
    n_steps = len(request)
    request_ids = np.array([f"{run_id}/req{r:04d}" for r in range(n_requests)], dtype=object)
    prompt_ids = np.array([f"{prompt_prefix}{r:04d}" for r in range(n_requests)], dtype=object)

    drafted = np.zeros(n_steps, dtype=np.int64) if method == "none" else np.full(n_steps, n)
    verified = drafted.copy() if num_verified is None else num_verified(drafted, rng)
    rate = np.broadcast_to(np.asarray(accept, dtype=float), (n,)) if n else np.zeros(0)
    rate_sn = np.broadcast_to(rate, (n_steps, n))  # [S, n]
    raw = rng.random((n_steps, n)) < rate_sn  # [S, n]
    in_verify = np.arange(n)[None, :] < verified[:, None]  # [S, n]
    accepted = np.cumprod(raw & in_verify, axis=1).astype(bool)  # [S, n] prefix-closed
    accepted_len = accepted.sum(axis=1) if n else np.zeros(n_steps, int)
    dt = draft_time(n) if callable(draft_time) else draft_time
    emitted = accepted_len + 1  # no output cut: synthetic
    # the prompt's 32 tokens and the prefill's, then what each earlier step emitted
    context = 33 + pd.Series(emitted).groupby(request).cumsum().to_numpy() - emitted
    steps = pd.DataFrame(
        {
            "request_id": request_ids[request],
            "prompt_id": prompt_ids[request],
            "dataset": dataset,
            "step": step.astype(np.int32),
            "context_len": context.astype(np.int32),
            "num_drafted": drafted.astype(np.int32),
            "num_verified": verified.astype(np.int32),
            "accepted_len": accepted_len.astype(np.int32),
            "emitted": emitted.astype(np.int32),
            "batch_size": np.ones(n_steps, dtype=np.int32),
            "draft_time_s": np.nan if method == "none" else dt * rng.uniform(0.9, 1.1, n_steps),
            "verify_time_s": verify_time * rng.uniform(0.9, 1.1, n_steps),
            "other_time_s": np.nan,
        }
    )
    if method == "none" or n == 0:
        positions = pd.DataFrame({f.name: pd.Series(dtype=object) for f in POSITIONS_SCHEMA})
        positions = _typed(positions.iloc[:0], POSITIONS_SCHEMA)
    else:
        draft = rng.integers(0, 50, (n_steps, n))  # [S, n]
        target = np.where(accepted, draft, (draft + 1 + rng.integers(0, 49, (n_steps, n))) % 50)
        conf = rate_sn.copy() if confidence is None else confidence(rate_sn, rng)
        flip = rng.random((n_steps, n)) < flip_rate
        bias = rng.normal(0.5, 1.0, (n_steps, n)) + accepted * 0.5
        positions = pd.DataFrame(
            {
                "request_id": np.repeat(request_ids[request], n),
                "step": np.repeat(step, n).astype(np.int32),
                "position": np.tile(np.arange(n), n_steps).astype(np.int32),
                "draft_token": draft.reshape(-1),
                "target_token": target.reshape(-1),
                "accepted": accepted.reshape(-1),
                "draft_logprob": rng.normal(-1, 0.3, n_steps * n).astype(np.float32),
                "base_logprob": rng.normal(-1.2, 0.3, n_steps * n).astype(np.float32),
                "markov_bias": bias.reshape(-1).astype(np.float32) if markov else np.nan,
                "markov_bias_norm": np.abs(bias.reshape(-1)).astype(np.float32)
                if markov
                else np.nan,
                "markov_flip": pd.array(flip.reshape(-1), dtype="boolean")
                if markov
                else pd.array([pd.NA] * (n_steps * n), dtype="boolean"),
                "confidence": conf.reshape(-1).astype(np.float32) if markov else np.nan,
            }
        )
        positions = _typed(positions, POSITIONS_SCHEMA)
    steps = _typed(steps, STEPS_SCHEMA)
    constants = _run_columns(meta)
    return Run(
        meta,
        steps.assign(**{k: v for k, v in constants.items() if k != "dataset"}),
        positions.assign(**constants),
    )


def _typed(frame: pd.DataFrame, schema) -> pd.DataFrame:
    dtypes = {"int32": "int32", "int64": "int64", "float": "float32", "double": "float64"}
    out = {}
    for field in schema:
        col = frame[field.name]
        name = str(field.type)
        if name == "bool":
            out[field.name] = col.astype("boolean" if field.nullable else bool)
        elif name in dtypes:
            out[field.name] = col.astype(dtypes[name])
        else:
            out[field.name] = col.astype(object)
    return pd.DataFrame(out)


def concat(*runs: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Positions and steps of several runs, as ``read_trace`` over their parent returns."""
    positions = pd.concat([r.positions for r in runs if len(r.positions)], ignore_index=True)
    steps = pd.concat([r.steps for r in runs], ignore_index=True)
    return positions, steps


def write_run(root: Path | str, run: Run) -> Location:
    """Write ``run`` through the real TraceWriter into the store ``root`` (a directory or
    s3://); returns the run's directory (its run.json's)."""
    step_cols = [f.name for f in STEPS_SCHEMA]
    pos_cols = [f.name for f in POSITIONS_SCHEMA]
    with TraceWriter(root, run.meta, flush_rows=997) as writer:
        for rec in run.steps[step_cols].to_dict("records"):
            writer.add("steps", _plain(rec))
        by_step = run.positions[pos_cols].to_dict("records")
        writer.add_many("positions", [_plain(r) for r in by_step])
        requests = run.steps.drop_duplicates("request_id")
        # the prefill's token, then what each step emitted
        n_output = (run.steps.groupby("request_id")["emitted"].sum() + 1).to_dict()
        writer.add_many(
            "requests",
            [
                {
                    "request_id": r["request_id"],
                    "prompt_id": r["prompt_id"],
                    "dataset": r["dataset"],
                    "prompt_token_ids": [1, 2, 3],
                    "output_token_ids": [4] * int(n_output[r["request_id"]]),
                    "output_text": "x",
                    "wall_time_s": 1.0,
                }
                for r in requests.to_dict("records")
            ],
        )
    return writer.run_dir


def _plain(record: dict) -> dict:
    out = {}
    for key, value in record.items():
        if value is pd.NA or (isinstance(value, float) and np.isnan(value)):
            out[key] = None
        elif isinstance(value, np.generic):
            out[key] = value.item()
        else:
            out[key] = value
    return out
