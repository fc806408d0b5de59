"""Checkpoint cards: ``CARD.md`` (for people) and ``card.json`` (same figures, for code).

A card records the command, corpus, sizes, training time and evaluation of one
checkpoint. Stages that were not retrained keep the training section of their previous
``card.json``; the evaluation is always the latest. This module holds what every tier's
cards share; each tier draws its own (``dsparklab.zoo.tiny.card``,
``dsparklab.zoo.smol.card``) and :mod:`dsparklab.zoo.tiers` registers the renderers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

CARD_JSON = "card.json"
CARD_MD = "CARD.md"


def read_card(checkpoint_dir: Path | str) -> dict[str, Any]:
    """The ``card.json`` of a checkpoint directory ({} when there is none)."""
    path = Path(checkpoint_dir) / CARD_JSON
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def checkpoint_files(path: Path) -> dict[str, int]:
    return {
        p.name: p.stat().st_size
        for p in sorted(path.iterdir())
        if p.is_file() and p.name not in (CARD_JSON, CARD_MD)
    }


def fmt_number(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def acceptance_table(summary: dict[str, Any]) -> str:
    """Markdown: per-position conditional acceptance a_i, survival s_i, confidence."""
    if not summary:
        return "(not evaluated)\n"
    has_conf = "confidence_mean" in summary
    head = "| position i | a_i (accepted given reached) | s_i (survival) |"
    rule = "|---|---|---|"
    if has_conf:
        head += " mean confidence |"
        rule += "---|"
    lines = [head, rule]
    for i, (a, s) in enumerate(zip(summary["conditional"], summary["survival"], strict=True)):
        row = f"| {i} | {fmt_number(a)} | {fmt_number(s)} |"
        if has_conf:
            row += f" {fmt_number(summary['confidence_mean'][i])} |"
        lines.append(row)
    lines.append("")
    lens = summary["accept_len"]
    keys = [k for k in sorted(lens, key=int) if int(k) >= 3]
    lines.append("| n | " + " | ".join(str(k) for k in keys) + " |")
    lines.append("|---|" + "---|" * len(keys))
    lines.append(
        "| mean acceptance length AL(n) | " + " | ".join(fmt_number(lens[k]) for k in keys) + " |"
    )
    lines.append("")
    lines.append(f"Start positions evaluated: {summary['num_starts']}.")
    return "\n".join(lines) + "\n"


# --- decode-time acceptance (from reference-engine runs) -------------------------------


def decode_time_acceptance(checkpoint_dir: Path, runs_root: Path) -> dict[str, Any]:
    """Decode-time acceptance of one drafter, from the run.json tallies of its runs.

    Runs are those below ``runs_root`` whose drafter ``content_hash`` is the
    checkpoint's (so stale runs of an older checkpoint never count), complete, greedy.
    Per dataset and n: :math:`AL(n) = 1 + \\sum_s a_s / S` over the S verify steps and
    :math:`a_i = \\#\\{a_s \\ge i\\} / \\#\\{a_s \\ge i - 1\\}` (accepted given reached).
    """
    from dsparklab.analysis.definitions import accept_len_from_marginal, conditional_from_marginal
    from dsparklab.provenance import checkpoint_hash
    from dsparklab.store import Catalog

    want = checkpoint_hash(checkpoint_dir)
    table: dict[str, dict[str, Any]] = {}
    for meta in Catalog.of(runs_root).metas.values():
        drafter = meta.get("drafter") or {}
        stats = meta.get("stats") or {}
        if (
            drafter.get("content_hash") != want
            or meta.get("status") != "complete"
            or meta["sampling"].get("temperature", 0.0) != 0.0
            or not stats.get("num_steps")
        ):
            continue
        # survival s_i = #{a_s > i} / S (run.json's accepted_per_pos over num_steps)
        survival = [count / stats["num_steps"] for count in stats["accepted_per_pos"]]
        table.setdefault(meta["dataset"], {})[str(meta["num_speculative_tokens"])] = {
            "accept_len": round(accept_len_from_marginal(survival), 4),
            "conditional": [
                None if math.isnan(a) else round(float(a), 4)
                for a in conditional_from_marginal(survival)
            ],
            "steps": stats["num_steps"],
            "requests": meta.get("num_requests"),
        }
    return {"runs": str(runs_root), "sets": table} if table else {}


def decode_time_lines(evaluation: dict[str, Any]) -> list[str]:
    """Markdown: per dataset, AL(n) and a_i for each n the reference engine ran."""
    decode = evaluation.get("decode_time") or {}
    if not decode:
        return ["Decode-time acceptance: not measured yet (`dsparklab zoo cards --runs DIR`)."]
    lines = [
        "",
        "### Decode time (reference engine, greedy verification)",
        "",
        f"From the runs in `{decode['runs']}` (`dsparklab collect --engine reference`), "
        "recorded by `dsparklab zoo cards`. a_i = accepted given reached.",
    ]
    for dataset, by_n in sorted(decode["sets"].items()):
        width = max(len(v["conditional"]) for v in by_n.values())
        lines += [
            "",
            f"{dataset}:",
            "",
            "| n | AL(n) | steps | " + " | ".join(f"a_{i}" for i in range(width)) + " |",
            "|---|---|---|" + "---|" * width,
        ]
        for n, v in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            cells = [fmt_number(c) for c in v["conditional"]] + [""] * (
                width - len(v["conditional"])
            )
            lines.append(
                f"| {n} | {fmt_number(v['accept_len'])} | {v['steps']} | "
                + " | ".join(cells)
                + " |"
            )
    return lines
