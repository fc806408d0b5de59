"""vLLM's Prometheus ``/metrics`` page: its text exposition parsed, and the speculative-decoding
counters of one scrape read and checked.

Provenance: ``SpecDecodingProm`` in ``vllm/v1/spec_decode/metrics.py`` (vLLM 0.32.0). Below both
users: the ``vllm-metrics`` and ``watch`` importers (:mod:`dsparklab.importers.prometheus`,
:mod:`dsparklab.importers.watch`) and the served collector, which asks a server's n of it
(:mod:`dsparklab.engines.vllm.served`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from dsparklab.errors import InputFormatError, input_error

PREFIX = "vllm:spec_decode_"
NUM_DRAFTS = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
COUNTERS = (NUM_DRAFTS, NUM_DRAFT_TOKENS, NUM_ACCEPTED, PER_POS)
SUMMED_LABELS = frozenset({"engine", "position"})

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    line: int

    def error(self, where: str, message: str) -> InputFormatError:
        """An error about this sample of the scrape ``where``: names its line and metric."""
        return input_error(where, message, line=self.line, field=self.name)


def parse_exposition(text: str, where: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (``# HELP`` / ``# TYPE`` skipped).

    Raises InputFormatError naming the line of a malformed sample.
    """
    samples = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise input_error(where, f"not a Prometheus sample line: {line[:80]!r}", line=number)
        labels: dict[str, str] = {}
        text_labels = match.group("labels") or ""
        pos = 0
        while pos < len(text_labels):
            label = _LABEL.match(text_labels, pos)
            if label is None:
                raise input_error(where, f"malformed labels {text_labels[:80]!r}", line=number)
            labels[label.group(1)] = (
                label.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            )
            pos = label.end()
        try:
            value = float(match.group("value"))
        except ValueError:
            raise input_error(
                where,
                f"sample value {match.group('value')!r} is not a number",
                line=number,
                field=match.group("name"),
            ) from None
        samples.append(Sample(match.group("name"), labels, value, number))
    return samples


@dataclass
class SpecDecodeCounters:
    """vLLM's spec-decode counters at one scrape, summed over engines."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    model_name: str | None = None
    engines: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.accepted_per_pos)

    def minus(self, before: SpecDecodeCounters, where: str) -> SpecDecodeCounters:
        """The counts between two scrapes; a counter that went backwards is an error."""
        if before.n != self.n:
            raise InputFormatError(
                f"the scrapes have {before.n} and {self.n} positions (different servers?)",
                path=where,
                field=f"{PER_POS}_total",
            )
        deltas = {
            f"{NUM_DRAFTS}_total": self.num_drafts - before.num_drafts,
            f"{NUM_DRAFT_TOKENS}_total": self.num_draft_tokens - before.num_draft_tokens,
            f"{NUM_ACCEPTED}_total": self.num_accepted_tokens - before.num_accepted_tokens,
        }
        per_pos = [
            a - b for a, b in zip(self.accepted_per_pos, before.accepted_per_pos, strict=True)
        ]
        for name, value in [
            *deltas.items(),
            *((f'{PER_POS}_total{{position="{i}"}}', v) for i, v in enumerate(per_pos)),
        ]:
            if value < 0:
                raise InputFormatError(
                    "counter went backwards between scrapes (the server restarted?)",
                    path=where,
                    field=name,
                )
        return SpecDecodeCounters(
            num_drafts=deltas[f"{NUM_DRAFTS}_total"],
            num_draft_tokens=deltas[f"{NUM_DRAFT_TOKENS}_total"],
            num_accepted_tokens=deltas[f"{NUM_ACCEPTED}_total"],
            accepted_per_pos=per_pos,
            model_name=self.model_name,
            engines=self.engines,
        )


def _base(name: str) -> str | None:
    """The counter a sample belongs to (``_total`` series only; ``_created`` skipped)."""
    if not name.startswith(PREFIX) or not name.endswith("_total"):
        return None
    base = name[: -len("_total")]
    return base if base in COUNTERS else None


def spec_decode_counters(text: str, where: str) -> SpecDecodeCounters:
    """Read the spec-decode counters of one scrape (``where`` names it in errors)."""
    samples = parse_exposition(text, where)
    found = SpecDecodeCounters()
    seen: set[str] = set()
    per_pos: dict[int, float] = {}
    models: set[str] = set()
    engines: set[str] = set()
    for sample in samples:
        base = _base(sample.name)
        if base is None:
            continue
        if not math.isfinite(sample.value) or sample.value < 0 or sample.value != int(sample.value):
            raise sample.error(where, f"counter value {sample.value} is not a non-negative integer")
        seen.add(base)
        models.update(v for k, v in sample.labels.items() if k == "model_name")
        engines.add(sample.labels.get("engine", ""))
        other = {k: v for k, v in sample.labels.items() if k not in SUMMED_LABELS | {"model_name"}}
        if other:
            raise sample.error(
                where, f"unexpected labels {other} (this importer sums over 'engine' only)"
            )
        value = int(sample.value)
        if base == PER_POS:
            if "position" not in sample.labels:
                raise sample.error(where, "per-position counter without a position label")
            try:
                position = int(sample.labels["position"])
            except ValueError:
                raise sample.error(
                    where, f"position label {sample.labels['position']!r} is not an integer"
                ) from None
            per_pos[position] = per_pos.get(position, 0) + value
        elif base == NUM_DRAFTS:
            found.num_drafts += value
        elif base == NUM_DRAFT_TOKENS:
            found.num_draft_tokens += value
        else:
            found.num_accepted_tokens += value
    if not seen:
        raise InputFormatError(
            "no vllm:spec_decode_* counters: not a vLLM /metrics page, or the server runs "
            "without speculative decoding (or with --disable-log-stats)",
            path=where,
            field=f"{NUM_DRAFTS}_total",
        )
    for base in COUNTERS:
        if base not in seen:
            raise InputFormatError("required counter missing", path=where, field=f"{base}_total")
    if len(models) > 1:
        raise InputFormatError(
            f"counters of several models {sorted(models)}; scrape a server that serves one",
            path=where,
            field="model_name",
        )
    positions = sorted(per_pos)
    if positions != list(range(len(positions))):
        raise InputFormatError(
            f"positions {positions} are not 0..k-1", path=where, field=f"{PER_POS}_total"
        )
    found.accepted_per_pos = [int(per_pos[i]) for i in positions]
    found.model_name = next(iter(models), None)
    found.engines = sorted(engines)
    _check_counters(found, where)
    return found


def _check_counters(c: SpecDecodeCounters, where: str) -> None:
    for i in range(1, c.n):
        if c.accepted_per_pos[i] > c.accepted_per_pos[i - 1]:
            raise InputFormatError(
                f"position {i} counts {c.accepted_per_pos[i]} accepted drafts, more than "
                f"position {i - 1} ({c.accepted_per_pos[i - 1]}): not a marginal count",
                path=where,
                field=f'{PER_POS}_total{{position="{i}"}}',
            )
    if c.n and c.accepted_per_pos[0] > c.num_drafts:
        raise InputFormatError(
            f"position 0 counts {c.accepted_per_pos[0]} accepted drafts of {c.num_drafts} drafts",
            path=where,
            field=f'{PER_POS}_total{{position="0"}}',
        )
    if c.num_accepted_tokens > c.num_draft_tokens:
        raise InputFormatError(
            f"{c.num_accepted_tokens} accepted of {c.num_draft_tokens} drafted tokens",
            path=where,
            field=f"{NUM_ACCEPTED}_total",
        )
