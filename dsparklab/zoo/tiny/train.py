"""The tiny tier's recipe: corpus -> tokenizer -> target LM -> DSpark and Eagle3 drafters.

Everything runs on CPU in float32 with fixed seeds:

1. Corpus: the Python standard-library sources of the running interpreter (no tests,
   no ``site-packages``, no ``pydoc_data``) for code, and the training split of the
   prose set (:func:`dsparklab.prompts.prose_corpus`). Evaluation prompts (HumanEval,
   held-out prose) are checked to be absent.
2. Tokenizer: byte-level BPE trained with ``tokenizers`` (``<|endoftext|>`` = 0,
   ``<|mask|>`` = 1, the DSpark mask token).
3. Target: a transformers Qwen3 LM (tied embeddings, head_dim 64) trained on random
   windows of the token stream.
4. Draft data: the target's own greedy continuations of corpus prefixes, with the
   target's hidden states (aux layers and pre-norm last layer).
5. DSpark: ``speculators``' ``DSparkDraftModel`` (DFlash block backbone + vanilla
   Markov head + confidence head with the Markov embedding), sdpa attention, eager
   KL and TV losses.
6. Eagle3: ``speculators``' ``Eagle3DraftModel`` (llama layer), sdpa, eager KL loss,
   training-time-test unrolled ``ttt_steps``.
7. Evaluation and cards: degeneracy of 128-token greedy continuations on held-out
   prompts, offline per-position acceptance on held-out HumanEval.
"""

from __future__ import annotations

import logging
import random
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dsparklab.errors import ProvenanceError
from dsparklab.prompts import load_prompts, prose_corpus
from dsparklab.zoo.evaluate import distinct_ratio, evaluate_drafters, greedy_continuation
from dsparklab.zoo.hidden import capture_hidden_states
from dsparklab.zoo.load import (
    load_dspark_drafter,
    load_eagle3_drafter,
    load_target,
)
from dsparklab.zoo.tiny.config import (
    DSPARK_NAME,
    EAGLE3_NAME,
    EOS_TOKEN,
    MASK_TOKEN,
    STAGES,
    TARGET_NAME,
    CorpusConfig,
    Stage,
    TinyConfig,
)
from dsparklab.zoo.training.config import DSparkConfig, Eagle3Config
from dsparklab.zoo.training.data import DraftData, select_layers
from dsparklab.zoo.training.drafters import DrafterRun, train_dspark, train_eagle3
from dsparklab.zoo.training.loop import (
    bf16_autocast,
    count_params,
    make_optimizer,
    optimizer_step,
)
from dsparklab.zoo.training.report import StageReport, smoothed, stage_clock

logger = logging.getLogger(__name__)

# stdlib directories that are tests, vendored packages or the prose set's source.
EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "pydoc_data", "__pycache__"}
)


# --- corpus ---------------------------------------------------------------------------


@dataclass
class Corpus:
    """The training documents and where they came from."""

    code_docs: list[str]
    prose_docs: list[str]
    code_root: str
    code_files: int

    @property
    def code_bytes(self) -> int:
        return sum(len(d.encode("utf-8")) for d in self.code_docs)

    @property
    def prose_bytes(self) -> int:
        return sum(len(d.encode("utf-8")) for d in self.prose_docs)


def stdlib_sources(cfg: CorpusConfig) -> tuple[Path, list[Path]]:
    """The interpreter's stdlib ``.py`` files used for training, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        if rel.name.startswith("test_") or rel.name == "__main__.py":
            continue
        if path.stat().st_size > cfg.code_max_file_bytes:
            continue
        files.append(path)
    return root, files


def build_corpus(cfg: CorpusConfig) -> Corpus:
    """Read the code and prose training documents (deterministic order)."""
    root, files = stdlib_sources(cfg)
    code_docs: list[str] = []
    total = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if cfg.code_max_total_bytes is not None and total >= cfg.code_max_total_bytes:
            break
        code_docs.append(text)
        total += len(text.encode("utf-8"))
    corpus = Corpus(code_docs, prose_corpus("train"), str(root), len(code_docs))
    check_no_eval_leak(corpus)
    logger.info(
        "corpus: %d stdlib files (%.1f MB), prose %.2f MB",
        corpus.code_files,
        corpus.code_bytes / 1e6,
        corpus.prose_bytes / 1e6,
    )
    return corpus


def check_no_eval_leak(corpus: Corpus, *, probe_chars: int = 120) -> None:
    """Raise ProvenanceError if an evaluation prompt's text occurs in the training corpus.

    Probes each HumanEval prompt's docstring-bearing tail and each held-out prose
    paragraph's head (``probe_chars`` characters) against the concatenated corpus.
    """
    haystack = "\n".join(corpus.code_docs) + "\n".join(corpus.prose_docs)
    for prompt in load_prompts("humaneval") + load_prompts("prose"):
        text = prompt.text.strip()
        probe = text[-probe_chars:] if prompt.dataset == "humaneval" else text[:probe_chars]
        if len(probe) >= 40 and probe in haystack:
            raise ProvenanceError(
                f"evaluation prompt {prompt.prompt_id} occurs in the training corpus; "
                "exclude its source from the corpus"
            )


# --- tokenizer ------------------------------------------------------------------------


def train_tokenizer(corpus: Corpus, vocab_size: int, min_frequency: int) -> Any:
    """Byte-level BPE on code + prose; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Every "\n" is its own pre-token, so a prompt that ends a line (HumanEval ends with
    # '"""\n') stops at a boundary the model saw in training; indentation and words then
    # follow GPT-2's byte-level split.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, MASK_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.code_docs + corpus.prose_docs, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        model_max_length=1 << 30,
    )
    fast.clean_up_tokenization_spaces = False
    return fast


def token_stream(corpus: Corpus, tokenizer: Any, *, prose_repeat: int, seed: int) -> np.ndarray:
    """All documents tokenized and joined by EOS, in a seeded shuffled order."""
    docs = list(corpus.code_docs) + list(corpus.prose_docs) * prose_repeat
    random.Random(seed).shuffle(docs)
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    encoded = tokenizer(docs, add_special_tokens=False)["input_ids"]
    parts = []
    for ids in encoded:
        parts.append(np.asarray(ids, dtype=np.int32))
        parts.append(np.asarray([eos], dtype=np.int32))
    return np.concatenate(parts)


# --- target ---------------------------------------------------------------------------


def train_target(
    cfg: TinyConfig, corpus: Corpus, out_dir: Path
) -> tuple[Any, Any, np.ndarray, StageReport]:
    """Train the tokenizer and the target LM; save both to ``out_dir``."""
    from transformers import GenerationConfig

    with stage_clock(StageReport("target")) as report:
        model, tokenizer, train_ids, val_ids = _train_target_model(cfg, corpus, report)
        report.extra["val_loss"] = round(_val_loss(model, val_ids, cfg.target.seq_len), 4)
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    target_dir = out_dir / TARGET_NAME
    target_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    GenerationConfig(
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, do_sample=False
    ).save_pretrained(target_dir)
    logger.info(
        "target: loss %.3f, val %.3f, %.0fs",
        report.loss_last,
        report.extra["val_loss"],
        report.seconds,
    )
    return model, tokenizer, train_ids, report


def _train_target_model(
    cfg: TinyConfig, corpus: Corpus, report: StageReport
) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """Tokenizer, then the LM on the training stream; the validation tail is returned."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    start = time.time()
    tc = cfg.target
    tokenizer = train_tokenizer(corpus, cfg.tokenizer.vocab_size, cfg.tokenizer.min_frequency)
    stream = token_stream(corpus, tokenizer, prose_repeat=cfg.corpus.prose_repeat, seed=tc.seed)
    n_val = max(tc.seq_len + 1, int(len(stream) * cfg.corpus.val_fraction))
    train_ids, val_ids = stream[:-n_val], stream[-n_val:]
    report.extra["tokenizer_seconds"] = round(time.time() - start, 1)
    report.extra["stream_tokens"] = int(len(stream))
    report.extra["val_tokens"] = int(n_val)
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    model_cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_hidden_layers=tc.num_hidden_layers,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        head_dim=tc.head_dim,
        max_position_embeddings=tc.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": tc.rope_theta},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        use_cache=True,
    )
    model_cfg._attn_implementation = "sdpa"
    torch.manual_seed(tc.seed)
    model = Qwen3ForCausalLM(model_cfg)
    model.train()
    report.params = count_params(model)
    opt, sched = make_optimizer(
        model.parameters(), tc.lr, tc.weight_decay, tc.warmup_steps, lambda: tc.steps
    )
    gen = np.random.default_rng(tc.seed)
    losses: list[float] = []

    def forward(batch: torch.Tensor) -> torch.Tensor:
        with bf16_autocast(cfg.autocast_bf16):
            return model(input_ids=batch, labels=batch).loss

    step_fn = torch.compile(forward, dynamic=False) if tc.compile else forward
    bar = tqdm(range(tc.steps), desc="target", unit="step")
    for step in bar:
        starts = gen.integers(0, len(train_ids) - tc.seq_len - 1, size=tc.batch_size)
        batch = torch.from_numpy(
            np.stack([train_ids[s : s + tc.seq_len] for s in starts]).astype(np.int64)
        )
        if step == 0 and step_fn is not forward:
            try:
                loss = step_fn(batch)
            except Exception as err:  # no C++ compiler, unsupported op...: train eagerly
                logger.warning("torch.compile failed (%s); training eagerly", err)
                step_fn = forward
                loss = step_fn(batch)
        else:
            loss = step_fn(batch)
        losses.append(optimizer_step(model, loss, opt, sched))
        bar.set_postfix(loss=f"{smoothed(losses):.3f}")
    model.eval()
    report.steps = tc.steps
    report.loss_first, report.loss_last = losses[0], smoothed(losses)
    report.extra["train_tokens_seen"] = tc.steps * tc.batch_size * tc.seq_len
    return model, tokenizer, train_ids, val_ids


@torch.no_grad()
def _val_loss(model: Any, val_ids: np.ndarray, seq_len: int, max_windows: int = 16) -> float:
    windows = [val_ids[s : s + seq_len] for s in range(0, len(val_ids) - seq_len, seq_len)][
        :max_windows
    ]
    batch = torch.from_numpy(np.stack(windows).astype(np.int64))
    return float(model(input_ids=batch, labels=batch).loss)


# --- draft data -----------------------------------------------------------------------


@torch.no_grad()
def make_draft_data(
    cfg: TinyConfig, model: Any, train_ids: np.ndarray, layer_ids: Sequence[int]
) -> DraftData:
    """The target's greedy continuations of random corpus prefixes, with hidden states."""
    from transformers import DynamicCache

    dc = cfg.distill
    gen = np.random.default_rng(dc.seed)
    seqs = []
    bar = tqdm(total=dc.num_sequences, desc="draft data", unit="seq")
    for first in range(0, dc.num_sequences, dc.batch_size):
        count = min(dc.batch_size, dc.num_sequences - first)
        starts = gen.integers(0, len(train_ids) - dc.prefix_len, size=count)
        ids = torch.from_numpy(
            np.stack([train_ids[s : s + dc.prefix_len] for s in starts]).astype(np.int64)
        )
        out = model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
        tokens = [ids]
        for step in range(dc.gen_len):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(nxt)
            if step + 1 < dc.gen_len:
                out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        seqs.append(torch.cat(tokens, dim=1))
        bar.update(count)
    bar.close()
    input_ids = torch.cat(seqs)
    auxs, lasts = [], []
    for first in range(0, len(input_ids), dc.batch_size):
        aux, last, _ = capture_hidden_states(
            model, input_ids[first : first + dc.batch_size], layer_ids
        )
        auxs.append(aux)
        lasts.append(last)
    return DraftData(input_ids, torch.cat(auxs), torch.cat(lasts), tuple(layer_ids), dc.prefix_len)


# --- evaluation -----------------------------------------------------------------------


def evaluate_zoo(
    cfg: TinyConfig, target: Any, tokenizer: Any, dspark: Any | None, eagle3: Any | None
) -> dict[str, Any]:
    """Degeneracy on held-out prompts and offline drafter acceptance on HumanEval."""
    ec = cfg.eval
    start = time.time()
    sets = {
        "humaneval": load_prompts("humaneval", limit=ec.humaneval_prompts),
        "prose": load_prompts("prose", limit=ec.prose_prompts),
    }
    degeneracy: dict[str, Any] = {}
    humaneval_sequences = []
    for name, prompts in sets.items():
        ratios, lengths = [], []
        for prompt in tqdm(prompts, desc=f"greedy {name}", unit="prompt"):
            ids = tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
            cont = greedy_continuation(target, ids, ec.gen_len)
            ratios.append(distinct_ratio(cont))
            lengths.append(len(ids))
            if name == "humaneval":
                humaneval_sequences.append((ids + cont, len(ids)))
        degeneracy[name] = {
            "prompts": len(prompts),
            "distinct_ratio_mean": round(float(np.mean(ratios)), 4),
            "distinct_ratio_median": round(float(np.median(ratios)), 4),
            "share_below_0.3": round(float(np.mean(np.asarray(ratios) < 0.3)), 4),
            "prompt_tokens_mean": round(float(np.mean(lengths)), 1),
            "prompt_tokens_max": int(np.max(lengths)),
        }
    acceptance = evaluate_drafters(target, humaneval_sequences, ec, dspark=dspark, eagle3=eagle3)
    return {
        "degeneracy": degeneracy,
        "acceptance": acceptance,
        "chance_position0": 1.0 / len(tokenizer),
        "gen_len": ec.gen_len,
        "acceptance_sequences": len(humaneval_sequences),
        "max_n": ec.max_n,
        "seconds": round(time.time() - start, 1),
    }


# --- orchestration --------------------------------------------------------------------


@dataclass
class TrainResult:
    """Where the checkpoints went and what the run measured."""

    out_dir: Path
    stages: dict[str, StageReport]
    evaluation: dict[str, Any]
    corpus: dict[str, Any]


def train_tier(
    cfg: TinyConfig,
    out_dir: Path | str,
    *,
    stages: Sequence[Stage] = STAGES,
    evaluate: bool = True,
    command: str | None = None,
) -> TrainResult:
    """Run the recipe: train the requested stages, evaluate, write the cards.

    Parameters
    ----------
    cfg : TinyConfig
        The recipe (``TinyConfig()`` for the committed tier).
    out_dir : path-like
        Receives ``tiny-target/``, ``tiny-dspark/``, ``tiny-eagle3/``.
    stages : sequence of {"target", "dspark", "eagle3"}
        Stages to (re)train; the others are loaded from ``out_dir``. The drafters
        depend on the target: retrain them after retraining it.
    evaluate : bool
        Run the evaluation and write the cards.
    command : str, optional
        The command line recorded on the cards.

    Returns
    -------
    TrainResult
    """
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; valid: {', '.join(STAGES)}")
    stage_set = set(stages)
    if "target" in stage_set and stage_set != set(STAGES):
        logger.warning("retraining the target without both drafters leaves them stale")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    reports: dict[str, StageReport] = {}
    target_dir = out_dir / TARGET_NAME
    corpus = build_corpus(cfg.corpus)
    corpus_info = {
        "code_root": corpus.code_root,
        "code_files": corpus.code_files,
        "code_bytes": corpus.code_bytes,
        "prose_documents": len(corpus.prose_docs),
        "prose_bytes": corpus.prose_bytes,
        "python": sys.version.split()[0],
    }
    if "target" in stage_set:
        target, tokenizer, train_ids, reports["target"] = train_target(cfg, corpus, out_dir)
    else:
        target, tokenizer = load_target(target_dir)
        train_ids = token_stream(
            corpus, tokenizer, prose_repeat=cfg.corpus.prose_repeat, seed=cfg.target.seed
        )
    dspark = eagle3 = None
    if stage_set & {"dspark", "eagle3"}:
        layer_ids = sorted(set(cfg.dspark.target_layer_ids) | set(cfg.eagle3.target_layer_ids))
        start = time.time()
        data = make_draft_data(cfg, target, train_ids, layer_ids)
        data_seconds = time.time() - start
        mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)

        def run_for(section: DSparkConfig | Eagle3Config, name: str) -> DrafterRun:
            sub = select_layers(data, section.target_layer_ids)
            return DrafterRun(sub, target_dir, out_dir / name, autocast_bf16=cfg.autocast_bf16)

        if "dspark" in stage_set:
            run = run_for(cfg.dspark, DSPARK_NAME)
            dspark, reports["dspark"] = train_dspark(cfg.dspark, run, mask_id)
        if "eagle3" in stage_set:
            eagle3, reports["eagle3"] = train_eagle3(cfg.eagle3, run_for(cfg.eagle3, EAGLE3_NAME))
        for stage in stage_set & {"dspark", "eagle3"}:
            reports[stage].extra["draft_data_seconds"] = round(data_seconds, 1)
        del data
    from dsparklab.zoo.tiny.card import write_cards

    write_cards(cfg, out_dir, reports, None, corpus_info, command=command)
    evaluation: dict[str, Any] = {}
    if evaluate:
        # Evaluate what was saved, as the engines will load it.
        target, tokenizer = load_target(target_dir)
        dspark = load_dspark_drafter(out_dir / DSPARK_NAME)
        eagle3 = load_eagle3_drafter(out_dir / EAGLE3_NAME)
        evaluation = evaluate_zoo(cfg, target, tokenizer, dspark, eagle3)
        write_cards(cfg, out_dir, reports, evaluation, corpus_info, command=command)
    return TrainResult(out_dir, reports, evaluation, corpus_info)
