"""Cards for the smol drafters: ``card.json`` and ``CARD.md`` (same figures)."""

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
    read_card,
    write_atomic,
)
from dsparklab.zoo.smol.config import DSPARK_NAME, EAGLE3_NAME, SmolConfig
from dsparklab.zoo.smol.prepare import GGUF_MEMBER, TARGET_NAME, WHEEL_REQUIREMENT


def write_smol_cards(
    cfg: SmolConfig,
    zoo_dir: Path,
    data: dict[str, Any],
    reports: dict[str, dict[str, Any]],
    evaluation: dict[str, Any],
    *,
    command: str | None = None,
) -> None:
    """Write the cards of ``smol-dspark`` and ``smol-eagle3``."""
    for stage, name in (("dspark", DSPARK_NAME), ("eagle3", EAGLE3_NAME)):
        path = zoo_dir / name
        if not (path / "config.json").is_file():
            continue
        sets = evaluation.get("sets", {})
        previous = read_card(path).get("evaluation", {}).get("decode_time")
        card = {
            "name": name,
            "kind": stage,
            "tier": cfg.tier,
            "command": command,
            "target": {"name": TARGET_NAME, "source": WHEEL_REQUIREMENT, "gguf": GGUF_MEMBER},
            "recipe": {
                "prompts": cfg.prompts.model_dump(),
                "responses": cfg.responses.model_dump(),
                stage: getattr(cfg, stage).model_dump(),
                "eval": cfg.eval.model_dump(),
            },
            "data": data,
            "training": reports.get(stage, {}),
            "files": checkpoint_files(path),
            "evaluation": {
                "chance_position0": evaluation.get("chance_position0"),
                "gen_len": evaluation.get("gen_len"),
                "sets": {
                    set_name: {
                        **{k: v for k, v in s.items() if k != "acceptance"},
                        "offline_acceptance": s["acceptance"].get(stage, {}),
                    }
                    for set_name, s in sets.items()
                },
                **({"decode_time": previous} if previous else {}),
            },
        }
        write_atomic(path / CARD_JSON, json.dumps(card, indent=2) + "\n")
        write_atomic(path / CARD_MD, render_smol_card(card))


def render_smol_card(card: dict[str, Any]) -> str:
    """The Markdown card of a smol drafter."""
    recipe, data, t = card["recipe"], card["data"], card["training"]
    section = recipe[card["kind"]]
    kind = {"dspark": "DSpark", "eagle3": "Eagle3"}[card["kind"]]
    lines = [
        f"# {card['name']}",
        "",
        f"{kind} drafter for SmolLM2-135M-Instruct (`{card['target']['source']}`, the Q4_1 "
        "GGUF dequantised to float32 by `dsparklab zoo prepare --tier smol`), trained with "
        f"`speculators`: {section.get('num_layers')} draft layer(s), aux layers "
        f"{section.get('target_layer_ids')} (vLLM `target_layer_ids` = these minus one), "
        f"draft vocabulary {data.get('draft_vocab_size')} tokens (`d2t`/`t2d` in the "
        "checkpoint; vLLM maps drafted ids back with `d2t`), weights in bf16.",
        "",
        "## Reproduce",
        "",
        "```",
        "dsparklab zoo prepare --tier smol",
        "dsparklab zoo train --tier smol",
        "```",
        "",
        f"Made by `{card.get('command')}`; recipe `dsparklab/zoo/smol/`, fixed seeds, CPU.",
        "",
        "## Data",
        "",
        f"- {data.get('prompts')} training prompts assembled by `dsparklab.instruct_prompts` "
        f"({', '.join(f'{k} {v}' for k, v in data.get('prompt_kinds', {}).items())}); "
        "held-out templates and topics never trained on; HumanEval never trained on.",
        f"- The target's greedy answers: {data.get('answer_tokens'):,} tokens "
        f"(at most {recipe['responses'].get('max_new_tokens')} per answer; "
        f"{data.get('answers_ending_in_eos')} end in EOS), generated in "
        f"{data.get('answer_seconds', 0):.0f} s; hidden states "
        f"{data.get('hidden_state_seconds', 0):.0f} s.",
        f"- Draft vocabulary: the {data.get('draft_vocab_size')} most frequent answer tokens, "
        f"covering {100 * data.get('draft_vocab_coverage', 0):.1f}% of answer tokens.",
        "",
        "## Training",
        "",
    ]
    if t:
        metrics = ", ".join(f"{k} {v:.3f}" for k, v in t.get("last_step_metrics", {}).items())
        lines += [
            f"- Wall time {t.get('seconds', 0):.0f} s ({t.get('threads')} thread; DSpark and "
            "Eagle3 trained in parallel, one core each); CPU time "
            f"{t.get('cpu_seconds', 0):.0f} s.",
            f"- Steps {t.get('steps')}, loss {t.get('loss_first', 0):.3f} -> "
            f"{t.get('loss_last', 0):.3f} (mean of the last 20 steps).",
            f"- Parameters {t.get('params'):,} ({t.get('trainable_params'):,} trained).",
            f"- Last training step (speculators metrics): {metrics}",
        ]
    else:
        lines.append("(no training record)")
    lines += ["", "## Files", ""]
    lines += [f"- `{n}`: {size / 1e6:.2f} MB" for n, size in card["files"].items()]
    lines += ["", "## Evaluation (offline, held-out)", ""]
    ev = card["evaluation"]
    lines.append(
        "Each held-out prompt is answered greedily by the target (up to "
        f"{ev.get('gen_len')} tokens or EOS); every answer position is a start, and "
        "teacher-forced drafting given an accepted prefix reproduces greedy verification "
        "(`dsparklab/zoo/evaluate.py`). Drafted ids are compared in target ids. "
        "Decode-time acceptance: the shipped traces in `data/traces/smol`."
    )
    for set_name, s in ev.get("sets", {}).items():
        lines += [
            "",
            f"### {set_name}",
            "",
            f"{s['prompts']} prompts ({s['answers_evaluated']} answers long enough), mean answer "
            f"{s['answer_tokens_mean']} tokens, target distinct-token ratio mean "
            f"{s['distinct_ratio_mean']:.3f} (median {s['distinct_ratio_median']:.3f}).",
            "",
            acceptance_table(s["offline_acceptance"]),
        ]
    lines += decode_time_lines(ev)
    return "\n".join(lines) + "\n"
