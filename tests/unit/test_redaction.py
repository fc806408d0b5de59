"""No secret in a run.json: provenance's argv, engine keyword arguments and run settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparklab.provenance import (
    REDACTED,
    names_a_secret,
    provenance,
    redact_argv,
    redact_mapping,
)
from dsparklab.store import TraceWriter
from tests.conftest import make_run_json


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("--api-key", True),
        ("--hf-token", True),
        ("hf_token", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("--db-password", True),
        ("--max-num-batched-tokens", False),
        ("num_speculative_tokens", False),
        ("--ssl-keyfile", False),
        ("--tokenizer", False),
        ("eos_token_id", False),
        ("num_key_value_heads", False),
        ("time_to_first_token_ms", False),
        ("auth_token", True),
    ],
)
def test_which_names_are_secrets(name: str, secret: bool) -> None:
    assert names_a_secret(name) is secret


def test_argv_keeps_everything_but_the_secrets() -> None:
    argv = [
        "dsparklab",
        "serve",
        "model",
        "--api-key",
        "sk-live-123",
        "--hf-token=hf_abc",
        "--max-num-batched-tokens",
        "2048",
        "--trace-dir",
        "s3://AKIA:wJalr@store.example:8333/traces",
    ]
    out = redact_argv(argv)
    assert out == [
        "dsparklab",
        "serve",
        "model",
        "--api-key",
        REDACTED,
        f"--hf-token={REDACTED}",
        "--max-num-batched-tokens",
        "2048",
        "--trace-dir",
        f"s3://{REDACTED}@store.example:8333/traces",
    ]
    assert not {"sk-live-123", "hf_abc", "wJalr", "AKIA"} & {p for a in out for p in a.split(":")}


def test_a_run_json_holds_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Served with --api-key, engine kwargs with an HF token: the written run.json has none."""
    secrets = ("sk-live-123", "hf_abc", "pw-1")
    monkeypatch.setattr("sys.argv", ["dsparklab", "serve", "m", "--api-key", "sk-live-123"])
    assert "sk-live-123" not in json.dumps(provenance())
    meta = make_run_json(  # new_run_json, with the settings a served run keeps
        config={"engine_kwargs": {"hf_token": "hf_abc", "url": "http://u:pw-1@h/x"}}
    )
    with TraceWriter(tmp_path / "store", meta):
        pass
    written = "".join(p.read_text() for p in (tmp_path / "store").rglob("run.json"))
    assert written and not any(s in written for s in secrets)
    assert redact_mapping({"n": 3, "items": [{"api_key": "x"}]}) == {
        "n": 3,
        "items": [{"api_key": REDACTED}],
    }
