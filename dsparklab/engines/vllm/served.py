"""What a running ``vllm serve`` runs, as the server and its taps report it.

A served run is labelled by what served it, so ``dsparklab collect --engine vllm-serve``
asks before it sends a prompt. What vLLM 0.32's API server exposes, and where:

- ``GET /version``: ``{"version": "0.32.0"}``
  (``vllm/entrypoints/serve/instrumentator/basic.py``);
- ``GET /v1/models``: the served model's ``id``, ``root`` (the path or hub id it loaded)
  and ``max_model_len`` (``ModelCard``, ``vllm/entrypoints/serve/engine/protocol.py``);
- ``GET /metrics``: one ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position=i}``
  counter per drafted position, from startup on (``SpecDecodingProm``,
  ``vllm/v1/spec_decode/metrics.py``), so n; no ``vllm:spec_decode_*`` counter at all
  when the server does not speculate;
- a response's ``metrics.speculative_decoding.num_spec_tokens`` (``RequestSpecDecodeMetrics``,
  ``vllm/v1/metrics/stats.py``), with ``--per-request-spec-decode-metrics``: n again.

No public endpoint names the speculative *method* or the drafter (``/server_info`` only
exists with ``VLLM_SERVER_DEV_MODE=1``). The plugin's taps do: each worker's tap run.json
records ``method``, ``num_speculative_tokens``, the drafter's and target's paths, vLLM's
version and its speculative settings. A tap run is opened at a worker's first verified
draft, so :func:`discover` sends one probe request (two tokens, ``X-Request-Id``
``dsparklab-probe-<hex>``, which a sampling server records whatever its fraction; it stays
in the tap store like any other traffic) and reads the tap run that recorded it. Every
source that answers must agree.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsparklab.errors import ConfigError, DSparkLabError
from dsparklab.store.location import Location
from dsparklab.store.reader import store_runs
from dsparklab.store.sampling import ALWAYS_RECORDED

logger = logging.getLogger(__name__)

# the server's API key, read as `vllm serve` reads it when --api-key is not given; never an
# option of ours (a command line is recorded in run.json)
API_KEY_ENV = "VLLM_API_KEY"
PROBE_PROMPT = "dsparklab probe"
PROBE_TOKENS = 2  # the prefill's token, then one verified draft
HTTP_TIMEOUT_S = 30.0


class CollectError(DSparkLabError, RuntimeError):
    """vLLM or the taps did not produce what a run needs (named in the message)."""


class ServedMismatchError(ConfigError):
    """The options ask for a (method, n) that the server does not run."""


def http_json(
    url: str,
    payload: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = HTTP_TIMEOUT_S,
) -> Any:
    """GET (no payload) or POST ``payload`` as JSON; the decoded JSON answer."""
    return json.loads(http_text(url, payload, headers, timeout))


def http_text(
    url: str,
    payload: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = HTTP_TIMEOUT_S,
) -> str:
    """GET (no payload) or POST ``payload`` as JSON; the answer's text. With
    ``$VLLM_API_KEY`` set, the request carries it as a bearer token (a server started with
    ``--api-key`` refuses requests without it)."""
    data = None if payload is None else json.dumps(payload).encode()
    auth = {"Authorization": f"Bearer {key}"} if (key := os.environ.get(API_KEY_ENV)) else {}
    request = urllib.request.Request(
        url,
        data=data,
        headers={"Content-Type": "application/json", **auth, **dict(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return str(response.read().decode())
    except urllib.error.HTTPError as err:
        body = err.read().decode(errors="replace")[:500]
        raise CollectError(f"{url}: HTTP {err.code}: {body}") from err
    except urllib.error.URLError as err:
        raise CollectError(f"{url}: cannot reach the vLLM server ({err.reason})") from err
    except TimeoutError as err:
        raise CollectError(f"{url}: no answer within {timeout:.0f} s") from err


@dataclass(frozen=True)
class ServedConfig:
    """What one ``vllm serve`` runs, and which source said so (``sources``)."""

    url: str
    vllm_version: str
    model: str  # the served model id requests name
    target: str  # the path or hub id the server loaded (ModelCard.root)
    max_model_len: int | None
    n: int  # speculative tokens; 0: no speculation
    method: str | None  # 'none' when n == 0; None: no source named it
    drafter: str | None = None
    tap_run: Location | None = None
    model_runner: str | None = None
    speculative: Mapping[str, Any] | None = None
    hardware: Mapping[str, Any] | None = None  # the server's, from its tap run
    sources: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """``eagle3 with n = 3 (drafter ..., target ..., vLLM 0.32.0)``."""
        if self.n == 0:
            what = "no speculative decoding"
        else:
            what = f"{self.method or 'an unknown method'} with n = {self.n}"
        drafter = f"drafter {self.drafter}, " if self.drafter else ""
        return f"{what} ({drafter}target {self.target}, vLLM {self.vllm_version})"

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "vllm_version": self.vllm_version,
            "model": self.model,
            "target": self.target,
            "max_model_len": self.max_model_len,
            "method": self.method,
            "num_speculative_tokens": self.n,
            "drafter": self.drafter,
            "tap_run": None if self.tap_run is None else str(self.tap_run),
            "model_runner": self.model_runner,
            "sources": dict(self.sources),
        }


def speculative_tokens_from_metrics(text: str) -> int | None:
    """n from a ``/metrics`` page: its per-position counters (0: no spec-decode counters
    on a vLLM page; None: not a vLLM page, or one without stats, ``--disable-log-stats``)."""
    from dsparklab.prometheus import parse_exposition, spec_decode_counters

    try:
        return spec_decode_counters(text, "/metrics").n
    except DSparkLabError:
        try:
            samples = parse_exposition(text, "/metrics")
        except DSparkLabError:
            return None
        return 0 if any(s.name.startswith("vllm:") for s in samples) else None


def _request_ids_match(request_id: str, tap_prompt_id: str) -> bool:
    """vLLM's external id embeds the caller's X-Request-Id between dashes."""
    return f"-{request_id}-" in f"-{tap_prompt_id}-"


def tap_run_of(tap_dir: Location, request_id: str) -> Location | None:
    """The tap run below ``tap_dir`` that recorded ``request_id`` (None: none yet)."""
    from dsparklab.store import read_trace

    for run_dir in store_runs(tap_dir):  # each writing process's run, below _runs only
        try:
            ids = read_trace(run_dir, "requests", columns=["prompt_id"])
        except DSparkLabError:  # a run being created
            continue
        if any(_request_ids_match(request_id, str(p)) for p in ids.get("prompt_id", ())):
            return run_dir
    return None


def _probe(url: str, model: str, request_id: str, timeout: float) -> Mapping[str, Any]:
    body = http_json(
        f"{url}/v1/completions",
        {
            "model": model,
            "prompt": PROBE_PROMPT,
            "max_tokens": PROBE_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
        },
        {"X-Request-Id": request_id},
        timeout,
    )
    return ((body.get("metrics") or {}).get("speculative_decoding")) or {}


def discover(
    url: str,
    tap_dir: Location | None,
    *,
    tap_timeout: float = 60.0,
    timeout: float = HTTP_TIMEOUT_S,
    poll: float = 0.5,
) -> ServedConfig:
    """Ask the server at ``url`` (and its taps in ``tap_dir``) what it runs.

    Raises CollectError when the server cannot be reached or its sources disagree.
    """
    url = url.rstrip("/")
    version = str(http_json(f"{url}/version", timeout=timeout).get("version", "unknown"))
    cards = http_json(f"{url}/v1/models", timeout=timeout).get("data") or []
    if not cards:
        raise CollectError(f"{url}/v1/models lists no model")
    card = cards[0]
    model = str(card["id"])
    sources: dict[str, str] = {"vllm_version": "GET /version", "target": "GET /v1/models"}
    try:
        n_metrics = speculative_tokens_from_metrics(http_text(f"{url}/metrics", timeout=timeout))
    except CollectError:
        n_metrics = None
    said: dict[str, int] = {} if n_metrics is None else {"GET /metrics": n_metrics}
    tap_meta: dict[str, Any] = {}
    tap_run = None
    if n_metrics != 0:
        probe_id = f"{ALWAYS_RECORDED}{uuid.uuid4().hex[:10]}"  # recorded by a sampling server
        spec = _probe(url, model, probe_id, timeout)
        if spec.get("num_spec_tokens") is not None:
            said["the probe's metrics.speculative_decoding"] = int(spec["num_spec_tokens"])
        if tap_dir is not None:
            deadline = time.monotonic() + tap_timeout
            while (tap_run := tap_run_of(tap_dir, probe_id)) is None:
                if time.monotonic() >= deadline:
                    logger.warning(
                        "no tap run under %s recorded the probe %s within %.0f s (is it the "
                        "server's DSPARKLAB_TRACE_DIR, with the plugin installed there?)",
                        tap_dir,
                        probe_id,
                        tap_timeout,
                    )
                    break
                time.sleep(poll)
        if tap_run is not None:
            from dsparklab.store import read_run_json

            tap_meta = read_run_json(tap_run)
            said[f"the taps' {tap_run / 'run.json'}"] = int(tap_meta["num_speculative_tokens"])
    if len(set(said.values())) > 1:
        raise CollectError(
            f"the server at {url} reports different speculative token counts: "
            + ", ".join(f"{k}: {v}" for k, v in said.items())
        )
    if not said:
        raise CollectError(
            f"cannot tell whether the server at {url} speculates: /metrics has no vLLM "
            "counters (--disable-log-stats?), the response carried no speculative metrics "
            "(start it with --per-request-spec-decode-metrics detailed) and no tap run "
            "recorded the probe"
        )
    n = next(iter(said.values()))
    sources["num_speculative_tokens"] = " = ".join(said)
    method: str | None = None
    if n == 0:
        method = "none"
        sources["method"] = sources["num_speculative_tokens"]
    elif tap_meta:
        method = str(tap_meta["method"])
        sources["method"] = sources["drafter"] = f"the taps' {tap_run / 'run.json'}"  # type: ignore[operator]
    drafter = (tap_meta.get("drafter") or {}).get("path") if tap_meta else None
    return ServedConfig(
        url=url,
        vllm_version=version,
        model=model,
        target=str(card.get("root") or model),
        max_model_len=card.get("max_model_len"),
        n=n,
        method=method,
        drafter=None if drafter is None else str(drafter),
        tap_run=tap_run,
        model_runner=(tap_meta.get("engine") or {}).get("model_runner") if tap_meta else None,
        speculative=tap_meta.get("speculative") if tap_meta else None,
        hardware=tap_meta.get("hardware") if tap_meta else None,
        sources=sources,
    )


def served_run(served: ServedConfig, methods: Sequence[str], ns: Sequence[int]) -> tuple[str, int]:
    """The (method, n) to collect: the server's; ``methods`` / ``ns`` (empty: not given)
    must name exactly it, else :class:`ServedMismatchError` says what the server runs.

    A method no source names (no tap run recorded the probe) is taken from ``methods``,
    with a warning; without one it is an error.
    """
    given = []
    if methods:
        given.append(f"--method {','.join(methods)}")
    if ns:
        given.append(f"--n {','.join(map(str, ns))}")
    method = served.method
    if method is None:
        if len(methods) != 1:
            raise ConfigError(
                f"cannot tell which method the server at {served.url} runs "
                f"({served.describe()}): no tap run recorded the probe; pass --method, or "
                "--tap-dir the server's DSPARKLAB_TRACE_DIR"
            )
        method = methods[0]
        logger.warning(
            "the server's method is not known (no tap run recorded the probe); the run is "
            "labelled %r as --method says",
            method,
        )
    wrong_method = bool(methods) and list(methods) != [method]
    # the baseline drafts nothing: --method none --n K asks for no n
    wrong_n = bool(ns) and list(ns) != [served.n] and list(methods) != ["none"]
    if wrong_method or wrong_n:
        raise ServedMismatchError(
            f"the server at {served.url} runs {served.describe()}; {' '.join(given)} "
            "disagrees (leave it out to take the server's, or restart the server with it)"
        )
    return method, served.n


__all__ = [
    "CollectError",
    "ServedConfig",
    "ServedMismatchError",
    "discover",
    "http_json",
    "http_text",
    "served_run",
    "speculative_tokens_from_metrics",
    "tap_run_of",
]
