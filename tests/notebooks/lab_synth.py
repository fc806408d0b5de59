"""A small synthetic run set for the lab's tests (test data, never a measurement).

Written through the real :class:`dsparklab.store.TraceWriter` in the layout the collectors
use (``<root>/<dataset>/<method>-n<k>``, ``<root>/<dataset>/none``), with the structure the
notebooks look at: DSpark's acceptance decays slowly with position, Eagle3's faster and
more so at large n (so Eagle3 n=7 regresses against n=3 on the code set); the confidence
head is informative but over-confident; the Markov head flips some drafts; DSpark's draft
time is one pass, Eagle3's grows with n. The engine is named ``synthetic``.

A run written at a ``concurrency`` C records it (run.json ``load``); each request's share
of its batch's verify is (1 + 0.15 (C - 1) k) / C of the batch-1 time, k the tokens each
request verifies (n + 1; 1 for the target alone): a wide window fills the batch, so
larger loads favour smaller windows. Its steps all ran at batch size C.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dsparklab.store import TraceWriter, new_run_json
from dsparklab.store.sampling import request_sampled

VOCAB = 64
BASE_ACCEPT = {"humaneval": 0.86, "prose": 0.72}
DECAY = {"dspark": 0.015, "eagle3": 0.05}
# Eagle3's later positions degrade more at large windows (the regression to diagnose).
EAGLE_LONG_WINDOW_PENALTY = 0.04


def _accept_probs(method: str, dataset: str, n: int) -> np.ndarray:
    base = BASE_ACCEPT.get(dataset, 0.75)
    positions = np.arange(n)
    probs = base - DECAY[method] * positions
    if method == "eagle3":
        probs = probs - EAGLE_LONG_WINDOW_PENALTY * max(n - 3, 0) / 4 * (positions > 0)
    return np.clip(probs, 0.05, 0.98)  # [n]


def write_synthetic_run(
    root: Path,
    *,
    method: str,
    n: int,
    dataset: str,
    n_requests: int = 4,
    tokens_per_request: int = 40,
    seed: int = 0,
    tier: str = "synthetic",
    sample: float = 1.0,
    concurrency: int | None = None,
) -> Path:
    """One run written into the store ``root``; returns its run.json's directory. ``sample``
    < 1 records only the requests whose prompt id a ``DSPARKLAB_SAMPLE`` of that fraction
    keeps, and says so in run.json."""
    key = f"{method}/{n}/{dataset}/{seed}".encode()
    rng = np.random.default_rng(zlib.crc32(key))
    leaf = "none" if method == "none" else f"{method}-n{n}"
    load = 1.0
    if concurrency is not None:
        leaf += f"-c{concurrency}"
        load = (1 + 0.15 * (concurrency - 1) * (n + 1 if method != "none" else 1)) / concurrency
    meta = new_run_json(
        run_id=f"synthetic-{dataset}-{leaf}",
        engine={"name": "synthetic", "version": "0"},
        method=method,
        num_speculative_tokens=0 if method == "none" else n,
        target={"name": "synthetic-target", "path": "-", "content_hash": "sha256:0"},
        drafter=None
        if method == "none"
        else {"name": f"synthetic-{method}", "path": "-", "content_hash": "sha256:1"},
        dataset=dataset,
        sampling={"temperature": 0.0, "seed": seed},
        tier=tier,
        synthetic=True,
        **({"sample": {"fraction": sample}} if sample < 1.0 else {}),
        **({"load": {"concurrency": concurrency, "repeat": 0}} if concurrency else {}),
    )
    probs = _accept_probs(method, dataset, n) if method != "none" else np.zeros(0)
    with TraceWriter(root, meta) as writer:
        for r in range(n_requests):
            request_id = f"req{r:03d}"
            prompt_id = f"{dataset}/{r:03d}"
            if not request_sampled(prompt_id, sample):
                continue
            # a per-prompt difficulty, shared by every run of the same dataset
            hardness = np.random.default_rng(zlib.crc32(prompt_id.encode())).normal(0, 0.06)
            # the prefill's token opens the output; each step then emits accepted_len + 1
            emitted, step, output = 0, 0, [0]
            while emitted < tokens_per_request:
                context = 20 + emitted
                verify = 0.010 * (1 + 0.02 * n) * rng.uniform(0.95, 1.05) * load
                if method == "none":  # the target alone: one token a step, nothing drafted
                    # a second draw replaces the first (kept so the runs' values stay as they were)
                    verify = 0.010 * rng.uniform(0.95, 1.05) * load
                    drafted, accepted_len, draft_time = 0, 0, None
                else:
                    p = np.clip(probs - hardness, 0.02, 0.99)  # [n]
                    raw = rng.random(n) < p
                    accepted = np.cumprod(raw).astype(bool)  # [n] prefix-closed
                    accepted_len = int(accepted.sum())
                    drafted = n
                    draft_base_s = 0.002 if method == "dspark" else 0.0012 * n
                    draft_time = draft_base_s * rng.uniform(0.95, 1.05)
                writer.add(
                    "steps",
                    dict(
                        request_id=request_id,
                        prompt_id=prompt_id,
                        dataset=dataset,
                        step=step,
                        context_len=context,
                        num_drafted=drafted,
                        num_verified=drafted,
                        accepted_len=accepted_len,
                        emitted=accepted_len + 1,
                        draft_time_s=draft_time,
                        verify_time_s=verify,
                        # a closed loop kept full: every step ran the whole load
                        **({"batch_size": concurrency} if concurrency else {}),
                    ),
                )
                if method == "none":
                    output.append(int(rng.integers(VOCAB)))
                    emitted += 1
                    step += 1
                    continue
                draft = rng.integers(0, VOCAB, n)
                target = np.where(
                    accepted, draft, (draft + 1 + rng.integers(0, VOCAB - 1, n)) % VOCAB
                )
                rows = []
                for i in range(n):
                    row = dict(
                        request_id=request_id,
                        step=step,
                        position=i,
                        draft_token=int(draft[i]),
                        target_token=int(target[i]),
                        accepted=bool(accepted[i]),
                        draft_logprob=float(np.log(p[i]) + rng.normal(0, 0.05)),
                        base_logprob=None,
                        markov_bias=None,
                        markov_bias_norm=None,
                        markov_flip=None,
                        confidence=None,
                    )
                    if method == "dspark":
                        flip = bool(rng.random() < 0.12 + 0.02 * i)
                        bias = float(rng.normal(0.4 + 0.6 * accepted[i], 0.5))
                        # informative but over-confident: pushed towards 1
                        conf = float(
                            np.clip(
                                p[i] + 0.08 + rng.normal(0, 0.08) + 0.1 * (accepted[i] - p[i]),
                                0.01,
                                0.99,
                            )
                        )
                        row.update(
                            base_logprob=float(row["draft_logprob"] - abs(bias) * 0.3),
                            markov_bias=bias,
                            markov_bias_norm=abs(bias) + 0.5,
                            markov_flip=flip,
                            confidence=conf,
                        )
                    rows.append(row)
                writer.add_many("positions", rows)
                output.extend(int(t) for t in draft[:accepted_len])
                output.append(int(target[accepted_len]) if accepted_len < n else 0)
                emitted += accepted_len + 1
                step += 1
            writer.add(
                "requests",
                dict(
                    request_id=request_id,
                    prompt_id=prompt_id,
                    dataset=dataset,
                    prompt_token_ids=[1, 2, 3],
                    output_token_ids=output,
                    output_text=" ".join(map(str, output)),
                    wall_time_s=0.5,
                ),
            )
    return Path(writer.run_dir.path)


def write_synthetic_runs(
    root: Path,
    *,
    methods: Sequence[str] = ("dspark", "eagle3", "none"),
    ns: Sequence[int] = (3, 4, 5, 6, 7),
    datasets: Sequence[str] = ("humaneval", "prose"),
    n_requests: int = 4,
    tokens_per_request: int = 40,
) -> Path:
    """Every (dataset, method, n) run below ``root`` (one ``none`` run per dataset)."""
    for dataset in datasets:
        for method in methods:
            for n in [0] if method == "none" else ns:
                write_synthetic_run(
                    root,
                    method=method,
                    n=n,
                    dataset=dataset,
                    n_requests=n_requests,
                    tokens_per_request=tokens_per_request,
                )
    return Path(root)
