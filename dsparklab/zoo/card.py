"""Checkpoint cards: ``CARD.md`` (for people) and ``card.json`` (same figures, for code).

A card records the command, corpus, sizes, training time and evaluation of one
checkpoint. Stages that were not retrained keep the training section of their previous
``card.json``; the evaluation is always the latest.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from dsparklab.zoo.tiny.config import DSPARK_NAME, EAGLE3_NAME, TARGET_NAME, TinyConfig

logger = logging.getLogger(__name__)

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
    os.replace(tmp, path)


def checkpoint_files(path: Path) -> dict[str, int]:
    return {
        p.name: p.stat().st_size
        for p in sorted(path.iterdir())
        if p.is_file() and p.name not in (CARD_JSON, CARD_MD)
    }


def write_cards(
    cfg: TinyConfig,
    out_dir: Path,
    reports: dict[str, Any],
    evaluation: dict[str, Any] | None,
    corpus: dict[str, Any],
    *,
    command: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Write ``card.json`` and ``CARD.md`` into each of the tier's checkpoints present.

    Stages in ``reports`` get a new training section (and command, recipe); the others
    keep their previous one. ``evaluation=None`` keeps the previous evaluation.
    """
    from dsparklab.zoo.drafter_training import stage_json

    sections = {TARGET_NAME: "target", DSPARK_NAME: "dspark", EAGLE3_NAME: "eagle3"}
    config_sections = {
        "target": {
            "corpus": cfg.corpus.model_dump(),
            "tokenizer": cfg.tokenizer.model_dump(),
            "target": cfg.target.model_dump(),
        },
        "dspark": {"distill": cfg.distill.model_dump(), "dspark": cfg.dspark.model_dump()},
        "eagle3": {"distill": cfg.distill.model_dump(), "eagle3": cfg.eagle3.model_dump()},
    }
    cards = {}
    for name, stage in sections.items():
        path = out_dir / name
        if not (path / "config.json").is_file():
            continue
        previous = read_card(path)
        if stage in reports:
            training = stage_json(reports[stage])
            card_command = command
            recipe = {**config_sections[stage], "eval": cfg.eval.model_dump(), "tier": cfg.tier}
        else:
            training = previous.get("training", {})
            card_command = previous.get("command", command)
            recipe = previous.get("recipe", {})
        card = {
            "name": name,
            "kind": stage,
            "tier": cfg.tier,
            "command": card_command,
            "corpus": corpus,
            "recipe": recipe,
            "training": training,
            "files": checkpoint_files(path),
            "evaluation": (
                previous.get("evaluation", {})
                if evaluation is None
                else _evaluation_for(stage, evaluation)
            ),
        }
        write_atomic(path / CARD_JSON, json.dumps(card, indent=2, sort_keys=False) + "\n")
        write_atomic(path / CARD_MD, render_card(card))
        cards[name] = card
    return cards


def _evaluation_for(stage: str, evaluation: dict[str, Any]) -> dict[str, Any]:
    if stage == "target":
        return {
            "degeneracy": evaluation.get("degeneracy", {}),
            "gen_len": evaluation.get("gen_len"),
        }
    return {
        "offline_acceptance_humaneval": evaluation.get("acceptance", {}).get(stage, {}),
        "chance_position0": evaluation.get("chance_position0"),
        "gen_len": evaluation.get("gen_len"),
        "acceptance_sequences": evaluation.get("acceptance_sequences"),
        "target_degeneracy": evaluation.get("degeneracy", {}),
    }


def _fmt(x: Any, digits: int = 3) -> str:
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
        row = f"| {i + 1} | {_fmt(a)} | {_fmt(s)} |"
        if has_conf:
            row += f" {_fmt(summary['confidence_mean'][i])} |"
        lines.append(row)
    lines.append("")
    lens = summary["accept_len"]
    keys = [k for k in sorted(lens, key=int) if int(k) >= 3]
    lines.append("| n | " + " | ".join(str(k) for k in keys) + " |")
    lines.append("|---|" + "---|" * len(keys))
    lines.append(
        "| mean acceptance length AL(n) | " + " | ".join(_fmt(lens[k]) for k in keys) + " |"
    )
    lines.append("")
    lines.append(f"Start positions evaluated: {summary['num_starts']}.")
    return "\n".join(lines) + "\n"


def render_card(card: dict[str, Any]) -> str:
    """The Markdown card for one checkpoint."""
    t = card["training"]
    c = card["corpus"]
    lines = [f"# {card['name']}", ""]
    lines += _summary_lines(card)
    lines += [
        "",
        "## Reproduce",
        "",
        "```",
        f"dsparklab zoo train --tier {card['tier']} --out DIR   # all stages, then the cards",
        "```",
        "",
        f"This checkpoint was made by `{card.get('command')}`. Fixed seeds; recipe "
        f"`dsparklab/zoo/tiny/` (tier `{card['tier']}`); CPU, one thread, bf16 autocast for "
        "training, weights float32.",
        "",
        "## Corpus",
        "",
        f"- Code: {c.get('code_files')} Python standard-library sources "
        f"({c.get('code_bytes', 0) / 1e6:.1f} MB) of the interpreter that ran the recipe "
        f"(Python {c.get('python')}, `{c.get('code_root')}`), without tests, "
        "`site-packages` and `pydoc_data`.",
        f"- Prose: the training split of `pydoc_data.topics` ({c.get('prose_documents')} "
        f"topics, {c.get('prose_bytes', 0) / 1e6:.2f} MB); one paragraph in 8 (by text hash) "
        "is held out as the `prose` prompt set.",
        "- Never trained on: HumanEval (checked: no prompt occurs in the corpus) and the "
        "held-out prose paragraphs.",
    ]
    if card["kind"] != "target":
        recipe = card.get("recipe", {}).get("distill", {})
        lines.append(
            f"- Drafter data: {recipe.get('num_sequences')} greedy continuations by the "
            f"target ({recipe.get('gen_len')} tokens) of {recipe.get('prefix_len')}-token "
            "corpus prefixes, with the target's hidden states."
        )
    lines += ["", "## Training", ""]
    if t:
        lines += [
            f"- Wall time: {t.get('seconds', 0):.0f} s"
            + (f", CPU time {t['cpu_seconds']:.0f} s" if "cpu_seconds" in t else "")
            + (f" (tokenizer {t['tokenizer_seconds']:.0f} s)" if "tokenizer_seconds" in t else "")
            + (
                f"; draft data generation {t['draft_data_seconds']:.0f} s, shared by both drafters"
                if "draft_data_seconds" in t
                else ""
            ),
            f"- Steps: {t.get('steps')}; loss {_fmt(t.get('loss_first'))} -> "
            f"{_fmt(t.get('loss_last'))} (mean of the last 20 steps)",
            f"- Parameters: {t.get('params'):,} ({t.get('trainable_params') or t.get('params'):,}"
            " trained)",
        ]
        if "val_loss" in t:
            lines.append(
                f"- Validation loss {_fmt(t['val_loss'])} nats/token; "
                f"{t.get('train_tokens_seen'):,} training tokens seen of a "
                f"{t.get('stream_tokens'):,}-token stream"
            )
        if "last_step_metrics" in t:
            metrics = ", ".join(f"{k} {v:.3f}" for k, v in t["last_step_metrics"].items())
            lines.append(f"- Last training step (speculators metrics): {metrics}")
    else:
        lines.append("(no training record)")
    lines += ["", "## Files", ""]
    total = sum(card["files"].values())
    lines += [f"- `{n}`: {size / 1e6:.2f} MB" for n, size in card["files"].items()]
    lines.append(f"- Total: {total / 1e6:.2f} MB")
    lines += ["", "## Evaluation", ""]
    lines += _evaluation_lines(card)
    return "\n".join(lines) + "\n"


def _summary_lines(card: dict[str, Any]) -> list[str]:
    recipe = card.get("recipe", {})
    if card["kind"] == "target":
        tc = recipe.get("target", {})
        return [
            "The tiny tier's target LM: a Hugging Face `Qwen3ForCausalLM` "
            f"({tc.get('num_hidden_layers')} layers, hidden {tc.get('hidden_size')}, "
            f"{tc.get('num_attention_heads')} query / {tc.get('num_key_value_heads')} KV "
            f"heads of head_dim {tc.get('head_dim')}, MLP {tc.get('intermediate_size')}, "
            "tied embeddings) with a byte-level BPE tokenizer "
            f"({recipe.get('tokenizer', {}).get('vocab_size')} tokens; `<|endoftext|>` = 0 is "
            "EOS, `<|mask|>` = 1 is the DSpark mask token). Loads in transformers and vLLM "
            "(`tests/zoo/test_vllm_zoo.py`).",
        ]
    if card["kind"] == "dspark":
        dc = recipe.get("dspark", {})
        return [
            "DSpark drafter for `tiny-target`, trained with `speculators`' `DSparkDraftModel`: "
            f"a {dc.get('num_layers')}-layer DFlash block backbone (non-causal attention over "
            f"target hidden states of aux layers {dc.get('target_layer_ids')}, shared target "
            f"embedding and LM head), block size {dc.get('block_size')}, a vanilla Markov head "
            f"of rank {dc.get('markov_rank')} and a confidence head fed the Markov embedding. "
            "Config: `architectures: [Qwen3DSparkModel]`, `sample_from_anchor: "
            f"{str(dc.get('sample_from_anchor')).lower()}` (written explicitly), "
            "`mask_token_id: 1`, `aux_hidden_state_layer_ids` (vLLM `target_layer_ids` = "
            "these minus one). The target path in the config is relative to this directory "
            "(`../tiny-target`).",
        ]
    ec = recipe.get("eagle3", {})
    return [
        "Eagle3 drafter for `tiny-target`, trained with `speculators`' `Eagle3DraftModel` "
        f"({ec.get('num_layers')} llama decoder layer, aux layers "
        f"{ec.get('target_layer_ids')}, {ec.get('ttt_steps')} training-time-test steps, "
        "norm_before_fc, norm_output). Speculators `eagle3` format; loads in `vllm.LLM` with "
        '`{"method": "eagle3", "model": DIR}` (`tests/zoo/test_vllm_zoo.py`). '
        "`embed_tokens` and `lm_head` are left out of the checkpoint: they are frozen copies "
        "of the target's, which speculators reloads and vLLM shares.",
    ]


def _evaluation_lines(card: dict[str, Any]) -> list[str]:
    ev = card["evaluation"]
    if card["kind"] == "target":
        deg = ev.get("degeneracy", {})
        lines = [
            f"Degeneracy: distinct-token ratio of {ev.get('gen_len')}-token greedy "
            "continuations (argmax, EOS ignored) of held-out prompts (HumanEval, held-out "
            "prose); 1.0 = no token repeats, aim >= 0.3.",
            "",
            "| prompt set | prompts | mean | median | share below 0.3 | prompt tokens "
            "(mean / max) |",
            "|---|---|---|---|---|---|",
        ]
        for name, d in deg.items():
            lines.append(
                f"| {name} | {d['prompts']} | {_fmt(d['distinct_ratio_mean'])} | "
                f"{_fmt(d['distinct_ratio_median'])} | {_fmt(d['share_below_0.3'])} | "
                f"{d['prompt_tokens_mean']} / {d['prompt_tokens_max']} |"
            )
        return lines
    summary = ev.get("offline_acceptance_humaneval", {})
    return [
        f"Offline per-position acceptance on held-out HumanEval ({ev.get('acceptance_sequences')}"
        " prompts, each followed by the target's own "
        f"{ev.get('gen_len')}-token greedy continuation; every position of the continuation "
        "is a start). Teacher forcing given an accepted prefix reproduces "
        "decode-time greedy verification (see `dsparklab/zoo/evaluate.py`). Chance at "
        f"position 1: {_fmt(ev.get('chance_position0'), 5)} (1/vocab).",
        "",
        acceptance_table(summary),
        *decode_time_lines(ev),
    ]


# --- decode-time acceptance (from reference-engine runs) -------------------------------


def decode_time_acceptance(checkpoint_dir: Path, runs_root: Path) -> dict[str, Any]:
    """Decode-time acceptance of one drafter, from the run.json tallies of its runs.

    Runs are those below ``runs_root`` whose drafter ``content_hash`` is the
    checkpoint's (so stale runs of an older checkpoint never count), complete, greedy.
    Per dataset and n: :math:`AL(n) = 1 + \\sum_s a_s / S` over the S verify steps and
    :math:`a_i = \\#\\{a_s \\ge i\\} / \\#\\{a_s \\ge i - 1\\}` (accepted given reached).
    """
    from dsparklab.engines.stats import DraftStats
    from dsparklab.provenance import checkpoint_hash
    from dsparklab.store import find_runs, read_run_json

    want = checkpoint_hash(checkpoint_dir)
    table: dict[str, dict[str, Any]] = {}
    for run_dir in find_runs(runs_root):
        meta = read_run_json(run_dir)
        drafter = meta.get("drafter") or {}
        stats = meta.get("stats") or {}
        if (
            drafter.get("content_hash") != want
            or meta.get("status") != "complete"
            or meta["sampling"].get("temperature", 0.0) != 0.0
            or not stats.get("num_steps")
        ):
            continue
        tally = DraftStats(
            num_steps=stats["num_steps"],
            num_drafted=stats["num_drafted"],
            num_accepted=stats["num_accepted"],
            num_emitted=stats["num_emitted"],
            accepted_per_pos=list(stats["accepted_per_pos"]),
        )
        table.setdefault(meta["dataset"], {})[str(meta["num_speculative_tokens"])] = {
            "accept_len": round(tally.mean_acceptance_length, 4),
            "conditional": [
                None if a is None else round(a, 4) for a in tally.conditional_acceptance_per_pos
            ],
            "steps": stats["num_steps"],
            "requests": meta.get("num_requests"),
        }
    return {"runs": str(runs_root), "sets": table} if table else {}


def add_decode_time(checkpoint_dir: Path, runs_root: Path) -> bool:
    """Write :func:`decode_time_acceptance` into a drafter's card; False if no runs match."""
    card = read_card(checkpoint_dir)
    decode = decode_time_acceptance(checkpoint_dir, runs_root)
    if not card or not decode:
        return False
    card.setdefault("evaluation", {})["decode_time"] = decode
    write_atomic(checkpoint_dir / CARD_JSON, json.dumps(card, indent=2) + "\n")
    if card.get("tier") == "tiny":
        text = render_card(card)
    else:
        from dsparklab.zoo.smol.card import render_smol_card

        text = render_smol_card(card)
    write_atomic(checkpoint_dir / CARD_MD, text)
    return True


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
            "| n | AL(n) | steps | " + " | ".join(f"a_{i + 1}" for i in range(width)) + " |",
            "|---|---|---|" + "---|" * width,
        ]
        for n, v in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            cells = [_fmt(c) for c in v["conditional"]] + [""] * (width - len(v["conditional"]))
            lines.append(
                f"| {n} | {_fmt(v['accept_len'])} | {v['steps']} | " + " | ".join(cells) + " |"
            )
    return lines
