"""Which trace fields a tap run records on its path through vLLM, and why the others are null.

run.json's ``recorded_fields`` maps every ``steps`` cost column and every ``positions``
drafter column to ``"recorded"`` or ``"null: <why>"``, from what the run is (method, model
runner, tap level) and which patches went in (:mod:`~dsparklab.engines.vllm.patching`).
Taps that find out more while running replace an entry with :func:`null` (a draft top-k,
a model's own sampling path) or :func:`partial` (``"partial: <which rows>"``: the
batch-sharded path, where a rank records the rows it samples); the log says it once. So a
null in the trace is never silent: run.json says why.
"""

from __future__ import annotations

from collections.abc import Collection

from dsparklab.engines.vllm.core import LEVEL_FIELDS, TAP_FIELDS

RECORDED = "recorded"


def null(why: str) -> str:
    return f"null: {why}"


def partial(which: str) -> str:
    return f"partial: {which}"


def _patched(installed: Collection[str], *names: str) -> bool:
    return all(any(p.endswith(name) for p in installed) for name in names)


def step_cost_fields(model_runner: str, method: str, installed: Collection[str]) -> dict[str, str]:
    """The ``steps`` cost columns on this runner, given the patched methods' names."""
    runner = (
        "gpu.model_runner.GPUModelRunner"
        if model_runner == "v2"
        else "gpu_model_runner.GPUModelRunner"
    )
    timed = _patched(installed, f"{runner}.execute_model", f"{runner}.sample_tokens")
    apart = model_runner == "v2" and _patched(
        installed, f"{runner}.sample", "StepTimingCollector.forward_start"
    )
    out = {
        "draft_time_s": null("target-only: no draft pass") if method == "none" else RECORDED,
    }
    if not timed:
        untimed = null(f"the engine step is not timed ({runner}.sample_tokens not patched)")
        return out | {"verify_time_s": untimed, "other_time_s": untimed}
    if apart:
        return out | {"verify_time_s": RECORDED, "other_time_s": RECORDED}
    if model_runner == "v2":
        why = "the forward and the sampler are not marked (GPUModelRunner.sample not patched)"
        return out | {"verify_time_s": null(why), "other_time_s": null(why)}
    return out | {
        "verify_time_s": RECORDED,
        "other_time_s": null(
            "Model Runner V1 does not mark its forward and sampler: inside verify_time_s"
        ),
    }


def position_fields(method: str, level: str) -> dict[str, str]:
    """The ``positions`` drafter columns a method records at a tap level."""
    if method == "none":
        return {}
    kept = LEVEL_FIELDS.get(level, frozenset())
    out = {}
    for name in TAP_FIELDS:
        if method == "eagle3" and name != "draft_logprob":
            why = "no confidence head" if name == "confidence" else "no Markov head"
            out[name] = null(f"Eagle3 has {why}")
        elif name not in kept:
            out[name] = null(f"tap level {level!r}")
        else:
            out[name] = RECORDED
    return out


def recorded_fields(
    method: str, model_runner: str, level: str, installed: Collection[str]
) -> dict[str, str]:
    """run.json's ``recorded_fields`` at the start of a tap run."""
    return step_cost_fields(model_runner, method, installed) | position_fields(method, level)
