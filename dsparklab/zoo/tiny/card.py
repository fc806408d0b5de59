"""The tiny tier's cards: ``card.json`` and ``CARD.md`` for its target and both drafters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsparklab.zoo.card import (
    CARD_JSON,
    CARD_MD,
    acceptance_table,
    checkpoint_files,
    decode_time_lines,
    fmt_number,
    read_card,
    write_atomic,
)
from dsparklab.zoo.tiny.config import DSPARK_NAME, EAGLE3_NAME, TARGET_NAME, TinyConfig


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
    from dsparklab.zoo.training.report import stage_json

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
            f"- Steps: {t.get('steps')}; loss {fmt_number(t.get('loss_first'))} -> "
            f"{fmt_number(t.get('loss_last'))} (mean of the last 20 steps)",
            f"- Parameters: {t.get('params'):,} ({t.get('trainable_params') or t.get('params'):,}"
            " trained)",
        ]
        if "val_loss" in t:
            lines.append(
                f"- Validation loss {fmt_number(t['val_loss'])} nats/token; "
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
                f"| {name} | {d['prompts']} | {fmt_number(d['distinct_ratio_mean'])} | "
                f"{fmt_number(d['distinct_ratio_median'])} | {fmt_number(d['share_below_0.3'])} | "
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
        f"position 1: {fmt_number(ev.get('chance_position0'), 5)} (1/vocab).",
        "",
        acceptance_table(summary),
        *decode_time_lines(ev),
    ]
