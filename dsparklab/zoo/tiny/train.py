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

import json
import logging
import math
import os
import random
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
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
    DRAFTER_ATTN_IMPLEMENTATION,
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
    DSparkConfig,
    Eagle3Config,
    Stage,
    TinyConfig,
)

logger = logging.getLogger(__name__)

# stdlib directories that are tests, vendored packages or the prose set's source.
EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "pydoc_data", "__pycache__"}
)
# The verifier path written into drafter configs, relative to the drafter's directory.
RELATIVE_TARGET = f"../{TARGET_NAME}"


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


# --- training helpers -----------------------------------------------------------------


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warmup to 1, then cosine down to 0.1."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float, warmup: int, steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    trainable = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(warmup, steps))


def _autocast(enabled: bool) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def _num_params(module: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


@dataclass
class StageReport:
    """What a stage did: wall time, steps, losses, sizes; written into the cards."""

    name: str
    seconds: float = 0.0
    steps: int = 0
    params: int = 0
    trainable_params: int = 0
    loss_first: float | None = None
    loss_last: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _smoothed(values: Sequence[float], n: int = 20) -> float:
    tail = values[-n:]
    return float(sum(tail) / len(tail))


# --- target ---------------------------------------------------------------------------


def train_target(
    cfg: TinyConfig, corpus: Corpus, out_dir: Path
) -> tuple[Any, Any, np.ndarray, StageReport]:
    """Train the tokenizer and the target LM; save both to ``out_dir``."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    report = StageReport("target")
    start = time.time()
    cpu_start = time.process_time()
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
    report.params = _num_params(model)
    opt, sched = _optimizer(model.parameters(), tc.lr, tc.weight_decay, tc.warmup_steps, tc.steps)
    gen = np.random.default_rng(tc.seed)
    losses: list[float] = []

    def forward(batch: torch.Tensor) -> torch.Tensor:
        with _autocast(cfg.autocast_bf16):
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
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{_smoothed(losses):.3f}")
    model.eval()
    report.steps = tc.steps
    report.loss_first, report.loss_last = losses[0], _smoothed(losses)
    report.extra["val_loss"] = round(_val_loss(model, val_ids, tc.seq_len), 4)
    report.extra["train_tokens_seen"] = tc.steps * tc.batch_size * tc.seq_len
    report.seconds = time.time() - start
    report.extra["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
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


@torch.no_grad()
def _val_loss(model: Any, val_ids: np.ndarray, seq_len: int, max_windows: int = 16) -> float:
    windows = [val_ids[s : s + seq_len] for s in range(0, len(val_ids) - seq_len, seq_len)][
        :max_windows
    ]
    batch = torch.from_numpy(np.stack(windows).astype(np.int64))
    return float(model(input_ids=batch, labels=batch).loss)


# --- draft data -----------------------------------------------------------------------


@dataclass
class DraftData:
    """The drafters' training set: sequences and the target's hidden states over them."""

    input_ids: torch.Tensor | list[torch.Tensor]  # [N, T], or N ragged [T_i]
    aux: torch.Tensor | list[torch.Tensor]  # [N, T, len(layer_ids) * H]
    last: torch.Tensor | list[torch.Tensor]  # [N, T, H]
    layer_ids: tuple[int, ...]
    prefix_len: int
    # Per sequence, the first position whose token is a training target (chat answers
    # start after the prompt); None: every position.
    loss_start: list[int] | None = None


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


def _pack(
    data: DraftData, rows: Sequence[int], *, shift: bool, mask_head: int = 0, mask_tail: int = 0
) -> dict[str, torch.Tensor]:
    """Pack sequences into one [1, total] batch with document ids and per-doc positions.

    Hidden states stored in bf16 (the smol tier's) are widened to float32 here.
    ``shift`` applies speculators' Eagle3 ``shift_batch`` per sequence (token t+1 with
    hidden t, positions from 1). ``mask_head``/``mask_tail`` zero the loss mask on each
    document's first/last positions so no target or block crosses a document boundary.
    """
    ids, aux, last, docs, pos, mask = [], [], [], [], [], []
    for doc, row in enumerate(rows):
        x, h, y = data.input_ids[row], data.aux[row].float(), data.last[row].float()
        if shift:
            x, h, y = x[1:], h[:-1], y[1:]
            p = torch.arange(1, len(x) + 1)
        else:
            p = torch.arange(len(x))
        m = torch.ones(len(x), dtype=torch.long)
        # The last prompt token is the first anchor of an answer, hence the -1.
        head = max(mask_head, data.loss_start[row] - 1 if data.loss_start else 0)
        if head:
            m[:head] = 0
        if mask_tail:
            m[-mask_tail:] = 0
        ids.append(x)
        aux.append(h)
        last.append(y)
        docs.append(torch.full((len(x),), doc, dtype=torch.long))
        pos.append(p)
        mask.append(m)
    return {
        "input_ids": torch.cat(ids).unsqueeze(0),
        "hidden_states": torch.cat(aux).unsqueeze(0),
        "verifier_last_hidden_states": torch.cat(last).unsqueeze(0),
        "document_ids": torch.cat(docs).unsqueeze(0),
        "position_ids": torch.cat(pos).unsqueeze(0),
        "loss_mask": torch.cat(mask).unsqueeze(0),
    }


def _verifier_config(target_dir: Path) -> Any:
    from speculators.config import VerifierConfig

    return VerifierConfig.from_pretrained(str(target_dir.resolve()))


def _draft_layer_kwargs(target_cfg: Any, num_layers: int) -> dict[str, Any]:
    return {
        "vocab_size": target_cfg.vocab_size,
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": target_cfg.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "head_dim": target_cfg.head_dim,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_parameters": dict(target_cfg.rope_parameters),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": target_cfg.bos_token_id,
        "eos_token_id": target_cfg.eos_token_id,
        "pad_token_id": target_cfg.pad_token_id,
    }


def _save_drafter(model: Any, out: Path, keep_relative: str, architectures: list[str]) -> None:
    """save_pretrained with the verifier path written relative to the drafter dir.

    ``save_pretrained`` stamps the Python class name into ``architectures`` and copies
    speculators' config source (``config.py`` + ``auto_map``); the saved config gets the
    architecture name vLLM reads instead, and no copied source.
    """
    verifier = model.config.speculators_config.verifier
    absolute = verifier.name_or_path
    verifier.name_or_path = keep_relative
    try:
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
    finally:
        verifier.name_or_path = absolute
    config_path = out / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["architectures"] = architectures
    config.pop("auto_map", None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (out / "config.py").unlink(missing_ok=True)


def _train_loop(
    name: str,
    model: Any,
    steps: int,
    lr: float,
    warmup: int,
    step_fn: Callable[[int], tuple[torch.Tensor, dict[str, Any]]],
    metric_fn: Callable[[dict[str, Any]], dict[str, float]],
    autocast_bf16: bool,
) -> tuple[list[float], dict[str, float]]:
    opt, sched = _optimizer(model.parameters(), lr, 0.0, warmup, steps)
    model.train()
    losses: list[float] = []
    last_metrics: dict[str, float] = {}
    bar = tqdm(range(steps), desc=name, unit="step")
    for step in bar:
        with _autocast(autocast_bf16):
            loss, metrics = step_fn(step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        last_metrics = metric_fn(metrics)
        bar.set_postfix(
            loss=f"{_smoothed(losses):.3f}",
            **{k: f"{v:.2f}" for k, v in list(last_metrics.items())[:2]},
        )
    model.eval()
    return losses, last_metrics


def _ratio(metrics: dict[str, Any], key: str) -> float:
    total = float(metrics[f"{key}_total"])
    return float(metrics[f"{key}_sum"]) / total if total else float("nan")


# --- DSpark ---------------------------------------------------------------------------


def train_dspark(
    cfg: DSparkConfig,
    data: DraftData,
    target_dir: Path,
    out_dir: Path,
    mask_token_id: int,
    *,
    autocast_bf16: bool = False,
    name: str = DSPARK_NAME,
    vocab: VocabMapping | None = None,
) -> tuple[Any, StageReport]:
    """Train the DSpark drafter on the draft data; save it in speculators format.

    ``vocab`` restricts the drafter to a draft vocabulary (its lm_head rows are the
    target's rows ``t2d``; vLLM maps drafted ids back with ``d2t``).
    """
    from speculators.config import SpeculatorsConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig, Qwen3Config

    report = StageReport("dspark")
    start = time.time()
    cpu_start = time.process_time()
    target_cfg = AutoConfig.from_pretrained(target_dir)
    layer_cfg = Qwen3Config(
        **_draft_layer_kwargs(target_cfg, cfg.num_layers),
        layer_types=["full_attention"] * cfg.num_layers,
    )
    layer_cfg._attn_implementation = DRAFTER_ATTN_IMPLEMENTATION
    speculative_tokens = cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1
    config = DSparkSpeculatorConfig(
        architectures=["Qwen3DSparkModel"],
        transformer_layer_config=layer_cfg,
        draft_vocab_size=target_cfg.vocab_size if vocab is None else vocab.size,
        target_hidden_size=target_cfg.hidden_size,
        block_size=cfg.block_size,
        aux_hidden_state_layer_ids=list(cfg.target_layer_ids),
        mask_token_id=mask_token_id,
        sample_from_anchor=cfg.sample_from_anchor,
        markov_rank=cfg.markov_rank,
        markov_head_type=cfg.markov_head_type,
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        speculators_config=SpeculatorsConfig(
            algorithm="dspark",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=speculative_tokens)],
            default_proposal_method="greedy",
            verifier=_verifier_config(target_dir),
        ),
    )
    model = _new_drafter(DSparkDraftModel, config, cfg.seed, vocab, report)
    loss_config = resolve_loss_config(cfg.loss_fn, "eager")
    tv_loss_fn = resolve_loss_config("tv", "eager")["tv"][0]
    rows = np.random.default_rng(cfg.seed)
    num = len(data.input_ids)

    def step_fn(_step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        pick = rows.choice(num, size=min(cfg.sequences_per_step, num), replace=False)
        batch = _pack(data, pick.tolist(), shift=False, mask_tail=cfg.block_size)
        _, loss, metrics = model(
            **batch,
            loss_config=loss_config,
            tv_loss_fn=tv_loss_fn,
            gamma=cfg.gamma,
            max_anchors=cfg.max_anchors,
            confidence_head_alpha=cfg.confidence_head_alpha,
        )
        return loss, metrics

    def metric_fn(m: dict[str, Any]) -> dict[str, float]:
        out = {"acc": _ratio(m, "full_acc"), "eal": _ratio(m, "eal")}
        out.update(
            {
                f"pos{p}": _ratio(m, f"position_{p}_acc")
                for p in range(cfg.block_size)
                if f"position_{p}_acc_sum" in m
            }
        )
        return out

    losses, last = _train_loop(
        "dspark", model, cfg.steps, cfg.lr, cfg.warmup_steps, step_fn, metric_fn, autocast_bf16
    )
    report.steps = cfg.steps
    report.loss_first, report.loss_last = losses[0], _smoothed(losses)
    report.extra["last_step_metrics"] = {k: round(v, 4) for k, v in last.items()}
    _save_drafter(model, out_dir / name, f"../{target_dir.name}", ["Qwen3DSparkModel"])
    if vocab is not None:
        _rewrite_checkpoint(
            out_dir / name / "model.safetensors", lambda t: _with_draft_vocabulary(model, t)
        )
    report.seconds = time.time() - start
    report.extra["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
    return model, report


# --- Eagle3 ---------------------------------------------------------------------------


def train_eagle3(
    cfg: Eagle3Config,
    data: DraftData,
    target_dir: Path,
    out_dir: Path,
    *,
    autocast_bf16: bool = False,
    name: str = EAGLE3_NAME,
    vocab: VocabMapping | None = None,
) -> tuple[Any, StageReport]:
    """Train the Eagle3 drafter on the draft data; save it in speculators eagle3 format.

    The checkpoint omits ``embed_tokens`` and, for a full-vocabulary drafter, ``lm_head``
    (frozen copies of the target's): speculators reloads them from the target, vLLM
    shares the target's. With ``vocab`` the lm_head is the draft-vocabulary slice and
    is kept, with ``d2t``/``t2d``.
    """
    from speculators.config import SpeculatorsConfig
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig, LlamaConfig

    report = StageReport("eagle3")
    start = time.time()
    cpu_start = time.process_time()
    target_cfg = AutoConfig.from_pretrained(target_dir)
    layer_cfg = LlamaConfig(**_draft_layer_kwargs(target_cfg, cfg.num_layers))
    layer_cfg._attn_implementation = DRAFTER_ATTN_IMPLEMENTATION
    config = Eagle3SpeculatorConfig(
        architectures=["LlamaForCausalLMEagle3"],
        transformer_layer_config=layer_cfg,
        draft_vocab_size=target_cfg.vocab_size if vocab is None else vocab.size,
        norm_before_residual=True,
        norm_before_fc=True,
        norm_output=True,
        eagle_aux_hidden_state_layer_ids=list(cfg.target_layer_ids),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=cfg.ttt_steps)],
            default_proposal_method="greedy",
            verifier=_verifier_config(target_dir),
        ),
    )
    model = _new_drafter(Eagle3DraftModel, config, cfg.seed, vocab, report)
    loss_config = resolve_loss_config(cfg.loss_fn, "eager")
    rows = np.random.default_rng(cfg.seed)
    num = len(data.input_ids)

    def step_fn(_step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        pick = rows.choice(num, size=min(cfg.sequences_per_step, num), replace=False)
        batch = _pack(data, pick.tolist(), shift=True, mask_head=cfg.ttt_steps)
        _, loss, metrics = model(
            **batch, ttt_steps=cfg.ttt_steps, ttt_step_loss_decay=1.0, loss_config=loss_config
        )
        return loss, metrics

    def metric_fn(m: dict[str, Any]) -> dict[str, float]:
        return {f"cond{k}": _ratio(m, f"cond_acc_{k}") for k in range(cfg.ttt_steps)}

    losses, last = _train_loop(
        "eagle3", model, cfg.steps, cfg.lr, cfg.warmup_steps, step_fn, metric_fn, autocast_bf16
    )
    report.steps = cfg.steps
    report.loss_first, report.loss_last = losses[0], _smoothed(losses)
    report.extra["last_step_metrics"] = {k: round(v, 4) for k, v in last.items()}
    out = out_dir / name
    _save_drafter(model, out, f"../{target_dir.name}", ["LlamaForCausalLMEagle3"])
    shared = (
        ("embed_tokens.weight",) if vocab is not None else ("embed_tokens.weight", "lm_head.weight")
    )

    def drop_shared_then_add_vocab(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        kept = {k: v for k, v in tensors.items() if k not in shared}
        return kept if vocab is None else _with_draft_vocabulary(model, kept)

    _rewrite_checkpoint(out / "model.safetensors", drop_shared_then_add_vocab)
    report.seconds = time.time() - start
    report.extra["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
    return model, report


def _new_drafter(
    model_class: Any, config: Any, seed: int, vocab: VocabMapping | None, report: StageReport
) -> Any:
    """A seeded speculators drafter with the target's embedding/LM head (and draft vocab)."""
    torch.manual_seed(seed)
    model = model_class(config)
    if vocab is not None:
        model.load_vocab_mappings(vocab.t2d, vocab.d2t)
    model.load_verifier_weights()
    model.float()
    report.params = _num_params(model)
    report.trainable_params = _num_params(model, trainable_only=True)
    return model


@dataclass(frozen=True)
class VocabMapping:
    """A draft vocabulary: ``d2t`` offsets ``[V_draft]`` and ``t2d`` mask ``[V_target]``."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.d2t.shape[0])


def _with_draft_vocabulary(model: Any, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Make a reduced-vocabulary checkpoint's tensors self-contained and bf16.

    vLLM cannot share the target's full lm_head with a draft-vocabulary drafter, so the
    sliced lm_head, ``d2t`` and ``t2d`` are written; float tensors are stored in bf16
    (loaders upcast).
    """
    tensors = dict(tensors)
    tensors.setdefault("lm_head.weight", model.lm_head.weight.detach().clone())
    tensors["d2t"] = model.d2t.detach().clone()
    tensors["t2d"] = model.t2d.detach().clone()
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}


def _rewrite_checkpoint(
    path: Path, edit: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
) -> None:
    """Replace a safetensors file by ``edit`` of its tensors, atomically."""
    from safetensors.torch import load_file, save_file

    tmp = path.with_suffix(".tmp")
    save_file(edit(load_file(path)), tmp, metadata={"format": "pt"})
    os.replace(tmp, path)


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
    acceptance = evaluate_drafters(
        target,
        humaneval_sequences,
        dspark=dspark,
        eagle3=eagle3,
        max_n=ec.max_n,
        dspark_anchors=ec.dspark_anchors,
        seed=ec.seed,
    )
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
        if "dspark" in stage_set:
            sub = _select_layers(data, cfg.dspark.target_layer_ids)
            dspark, reports["dspark"] = train_dspark(
                cfg.dspark, sub, target_dir, out_dir, mask_id, autocast_bf16=cfg.autocast_bf16
            )
            reports["dspark"].extra["draft_data_seconds"] = round(data_seconds, 1)
        if "eagle3" in stage_set:
            sub = _select_layers(data, cfg.eagle3.target_layer_ids)
            eagle3, reports["eagle3"] = train_eagle3(
                cfg.eagle3, sub, target_dir, out_dir, autocast_bf16=cfg.autocast_bf16
            )
            reports["eagle3"].extra["draft_data_seconds"] = round(data_seconds, 1)
        del data
    from dsparklab.zoo.card import write_cards

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


def _select_layers(data: DraftData, wanted: Sequence[int]) -> DraftData:
    """The draft data restricted to some aux layers (in the order given)."""
    if tuple(wanted) == data.layer_ids:
        return data
    if not isinstance(data.aux, torch.Tensor):
        raise ValueError("layer selection needs padded [N, T, F] draft data, not ragged lists")
    hidden = data.aux.shape[-1] // len(data.layer_ids)
    chunks = [
        data.aux[..., data.layer_ids.index(i) * hidden : (data.layer_ids.index(i) + 1) * hidden]
        for i in wanted
    ]
    aux = torch.cat(chunks, dim=-1)
    return DraftData(data.input_ids, aux, data.last, tuple(wanted), data.prefix_len)


def stage_json(report: StageReport) -> dict[str, Any]:
    """A StageReport as plain JSON."""
    return json.loads(
        json.dumps(
            {
                "seconds": round(report.seconds, 1),
                "steps": report.steps,
                "params": report.params,
                "trainable_params": report.trainable_params,
                "loss_first": report.loss_first,
                "loss_last": report.loss_last,
                **report.extra,
            }
        )
    )
