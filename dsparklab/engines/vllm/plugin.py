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

# Same name as dsparklab.engines.vllm.config.ENV_TRACE_DIR, which is not imported here
# so that an untraced process stays at the standard library.
ENV_TRACE_DIR = "DSPARKLAB_TRACE_DIR"

logger = logging.getLogger(__name__)


def tracing_requested() -> bool:
    """Whether ``DSPARKLAB_TRACE_DIR`` names a directory (the taps' only switch)."""
    return bool(os.environ.get(ENV_TRACE_DIR, "").strip())


def register() -> None:
    """vLLM general-plugin entry point: install the taps when tracing is switched on.

    Idempotent; does nothing unless ``DSPARKLAB_TRACE_DIR`` is set. An unsupported vLLM
    or a bad setting is logged as an error (naming what is missing) and leaves vLLM
    untouched where the taps cannot work.
    """
    if not tracing_requested():
        return
    from dsparklab.engines.vllm import patching

    patching.register_from_env()
