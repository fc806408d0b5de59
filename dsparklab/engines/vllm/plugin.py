"""The vLLM general-plugin entry point of dsparklab's tracing taps.

Entry point ``dsparklab = "dsparklab.engines.vllm.plugin:register"`` in the group
``vllm.general_plugins``: vLLM calls :func:`register` in every process it starts (API
server, engine core, workers). With ``DSPARKLAB_TRACE_DIR`` unset it returns at once
and this module has imported nothing beyond the standard library (no torch, no pandas,
no vLLM), so an untraced vLLM pays only for reading one environment variable.

With it set, the taps are installed (:mod:`dsparklab.engines.vllm.patching`). Where the
rest lives, one concern per file:

- :mod:`~dsparklab.engines.vllm.patching`: patch points, compatibility check, install;
- :mod:`~dsparklab.engines.vllm.dspark_taps`: the in-graph DSpark taps (V2);
- :mod:`~dsparklab.engines.vllm.staging`: host staging around ``propose``, fail open;
- :mod:`~dsparklab.engines.vllm.v2` / :mod:`~dsparklab.engines.vllm.v1`: what each model
  runner's ``propose`` hands over;
- :mod:`~dsparklab.engines.vllm.steps`: Model Runner V1's engine-step clock (the steps'
  costs) and target-only steps;
- :mod:`~dsparklab.engines.vllm.runs`: run directories, run.json, recorder lifecycle.

Multi-GPU: drafts are replicated across tensor-parallel ranks, so by default only TP
rank 0 of each data-parallel replica records (one run directory per DP replica,
``...-dp<k>``); ``DSPARKLAB_WRITER_RANKS=all`` makes every rank write its own directory
(``...-dp<k>-tp<j>``). Pipeline parallelism drafts on the last PP rank only, which is
where the speculator lives.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

# Same name as dsparklab.engines.vllm.config.ENV_TRACE_DIR, which is not imported here
# so that an untraced process stays at the standard library.
ENV_TRACE_DIR = "DSPARKLAB_TRACE_DIR"
# vLLM copies VLLM_* (and a few other) variables to its Ray workers, not DSPARKLAB_* or
# AWS_* (vllm/ray/ray_env.py, get_env_vars_to_copy, vLLM 0.32.0); this registered vLLM
# variable adds prefixes to that list, and travels to the workers itself.
RAY_PREFIXES_ENV = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
TRACE_PREFIX = "DSPARKLAB_"

logger = logging.getLogger(__name__)
_warned_untraced_worker = False


def _prefixes(environ: MutableMapping[str, str]) -> list[str]:
    return [p.strip() for p in environ.get(RAY_PREFIXES_ENV, "").split(",") if p.strip()]


def share_with_ray_workers(environ: MutableMapping[str, str] = os.environ) -> None:
    """In a traced process: have vLLM copy ``DSPARKLAB_*`` (and, for an ``s3://`` root,
    ``AWS_*``) to the Ray workers it starts, by adding them to :data:`RAY_PREFIXES_ENV`."""
    prefixes = _prefixes(environ)
    wanted = [TRACE_PREFIX]
    if environ.get(ENV_TRACE_DIR, "").strip().startswith("s3://"):
        wanted.append("AWS_")
    for prefix in wanted:
        if prefix not in prefixes:
            prefixes.append(prefix)
    environ[RAY_PREFIXES_ENV] = ",".join(prefixes)


def untraced_worker_warning(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """The warning for a process that a traced driver started (its prefixes name
    ``DSPARKLAB_``) but that has no trace root: its variables did not travel."""
    if environ.get(ENV_TRACE_DIR, "").strip() or TRACE_PREFIX not in _prefixes(environ):
        return None
    return (
        f"dsparklab: this vLLM process (pid {os.getpid()}) has no {ENV_TRACE_DIR}, but its "
        f"driver traces ({RAY_PREFIXES_ENV} names {TRACE_PREFIX}): nothing is recorded here. "
        f"Start vLLM with {RAY_PREFIXES_ENV} including DSPARKLAB_ and AWS_, or pass them in "
        "Ray's runtime_env env_vars"
    )


def tracing_requested() -> bool:
    """Whether ``DSPARKLAB_TRACE_DIR`` names a directory (the taps' only switch)."""
    return bool(os.environ.get(ENV_TRACE_DIR, "").strip())


def register() -> None:
    """vLLM general-plugin entry point: install the taps when tracing is switched on.

    Idempotent; does nothing unless ``DSPARKLAB_TRACE_DIR`` is set. An unsupported vLLM
    or a bad setting is logged as an error (naming what is missing) and leaves vLLM
    untouched where the taps cannot work.
    """
    global _warned_untraced_worker
    if not tracing_requested():
        warning = untraced_worker_warning()
        if warning and not _warned_untraced_worker:
            _warned_untraced_worker = True
            logger.warning(warning)
        return
    share_with_ray_workers()
    from dsparklab.engines.vllm import patching

    patching.register_from_env()
