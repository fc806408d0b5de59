"""Sequential temperature scaling of DSpark's confidence head.

The head outputs ``c_i = sigmoid(z_i)``, the estimated probability that drafted position
``i`` is accepted given that every earlier position was (the event adaptive verification
plans with). A single linear head serves every position, so its scale cannot fit every
position at once; one temperature per position can:

.. math::

    \\hat c_i = \\sigma(z_i / T_i), \\qquad
    T_i = \\arg\\min_T \\; -\\sum_{b \\in R_i} \\big[y_{b,i} \\log \\sigma(z_{b,i}/T)
          + (1 - y_{b,i}) \\log(1 - \\sigma(z_{b,i}/T))\\big]

where ``y_{b,i}`` says block ``b``'s position ``i`` matched the target and ``R_i`` is the
set of blocks whose positions ``0..i-1`` all matched (position ``i`` was reached). The fit
runs position by position, each on its own reached set: "sequential" as in the DSpark
paper's calibration. It is fitted on the drafter's own training answers (teacher-forced
blocks, :func:`dsparklab.zoo.evaluate.dspark_block_correct`) and stored beside the
checkpoint in ``calibration.json`` (``confidence_temperatures``; vLLM and speculators
never read it); the engines record both the raw and the calibrated score.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

CALIBRATION_JSON = "calibration.json"
FIELD = "confidence_temperatures"


def fit_sequential_temperatures(
    correct: np.ndarray, confidence: np.ndarray, *, steps: int = 200
) -> list[float]:
    """One temperature per position (see the module docstring), fitted by LBFGS on log T.

    Parameters
    ----------
    correct, confidence : np.ndarray
        ``[blocks, n]``: whether each drafted position matched, and the raw head score.

    Returns
    -------
    list of float
        ``T_i``; 1.0 where fewer than 2 blocks reached the position or all reached blocks
        agree (nothing to fit).
    """
    correct = np.asarray(correct, dtype=bool)
    conf = np.clip(np.asarray(confidence, dtype=np.float64), 1e-7, 1 - 1e-7)
    logits = np.log(conf) - np.log1p(-conf)
    reached = np.concatenate(
        [np.ones((len(correct), 1), dtype=bool), np.cumprod(correct, axis=1)[:, :-1] > 0], axis=1
    )
    temperatures = []
    for i in range(correct.shape[1]):
        z = torch.tensor(logits[reached[:, i], i])
        y = torch.tensor(correct[reached[:, i], i], dtype=torch.float64)
        if len(y) < 2 or y.min() == y.max():
            temperatures.append(1.0)
            continue
        temperatures.append(_fit_temperature(z, y, steps))
    return temperatures


def _fit_temperature(z: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """argmin_T BCE(sigmoid(z / T), y), optimised over log T."""
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=steps)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.exp())


def apply_temperatures(confidence: np.ndarray, temperatures: Sequence[float]) -> np.ndarray:
    """``sigmoid(logit(c_i) / T_i)`` over the last axis (positions); NaN stays NaN."""
    conf = np.clip(np.asarray(confidence, dtype=np.float64), 1e-7, 1 - 1e-7)
    t = np.asarray(temperatures, dtype=np.float64)[: conf.shape[-1]]
    return 1.0 / (1.0 + np.exp(-(np.log(conf) - np.log1p(-conf)) / t))


def read_temperatures(drafter_dir: Path) -> list[float] | None:
    """The temperatures stored beside a drafter (None when it was never calibrated)."""
    path = drafter_dir / CALIBRATION_JSON
    if not path.is_file():
        return None
    return [float(v) for v in json.loads(path.read_text(encoding="utf-8"))[FIELD]]


def write_temperatures(
    drafter_dir: Path, temperatures: Sequence[float], *, fitted_on: dict[str, object]
) -> None:
    """Store the temperatures and what they were fitted on in ``calibration.json``."""
    record = {FIELD: [round(float(t), 6) for t in temperatures], "fitted_on": fitted_on}
    path = drafter_dir / CALIBRATION_JSON
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
