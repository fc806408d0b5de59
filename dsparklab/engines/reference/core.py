r"""The CPU reference engine: DSpark and Eagle3 draft-and-verify on a transformers target.

One request is decoded in steps. Before a step the sequence holds L tokens, the last
being the *anchor* (the bonus token of the previous step, or the prefill's token); the
target's KV cache holds the first L - 1. A step

1. drafts n tokens :math:`d_1..d_n` (DSpark: one non-causal block pass of the DFlash
   backbone, then the sequential Markov stage; Eagle3: one draft forward per token);
2. verifies them in one target forward over ``[anchor, d_1..d_n]``, giving the target's
   choice :math:`t_i` after each prefix;
3. accepts the longest prefix with :math:`d_i = t_{i-1}` (greedy) or by standard
   rejection sampling (T > 0), emits the accepted drafts plus one target token (the
   bonus), and crops the target's KV cache back over the rejected suffix.

The drafters keep their own state between steps the way vLLM does: DSpark a per-layer
context K/V cache fed with the target hidden states of accepted positions (vLLM's
``precompute_and_store_context_kv``), Eagle3 a KV cache whose speculative entries are
dropped after each step. Method ``"none"`` is plain target decoding, one forward per
token: the speedup baseline and the losslessness reference.

The target runner and the drafters live in :mod:`dsparklab.engines.reference.models`.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from dsparklab.engines.reference.config import ReferenceConfig
from dsparklab.engines.reference.markov import argmax_last, map_draft_to_target
from dsparklab.engines.reference.models import (
    TRACE_FIELDS,
    ContextUpdate,
    Drafter,
    DraftSettings,
    Proposal,
    TargetRunner,
    make_drafter,
    sample_token,
)
from dsparklab.engines.stats import DraftStats
from dsparklab.errors import ConfigError
from dsparklab.store.rows import emitted_tokens

logger = logging.getLogger(__name__)

ENGINE_NAME = "reference"


# --------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------
class StepRecord(NamedTuple):
    """One verified step (the ``steps`` table, without the request-level columns).

    ``emitted``: the output tokens the step added once the output is cut at
    ``max_new_tokens`` and at a stop token (at most ``accepted_len + 1``; 0 for a step
    whose tokens were all cut).
    """

    step: int
    context_len: int
    num_drafted: int
    num_verified: int
    accepted_len: int
    emitted: int
    batch_size: int  # one request at a time: its costs are the whole step's
    draft_time_s: float | None
    verify_time_s: float | None
    other_time_s: float | None  # after the verdict: the caches cropped, the context fed


class PositionRecord(NamedTuple):
    """One drafted position (the ``positions`` table, without ``request_id``)."""

    step: int
    position: int
    draft_token: int
    target_token: int | None
    accepted: bool
    draft_logprob: float | None
    base_logprob: float | None
    markov_bias: float | None
    markov_bias_norm: float | None
    markov_flip: bool | None
    confidence: float | None


def emitted_steps(steps: Sequence[StepRecord], n_output: int) -> list[StepRecord]:
    """``steps`` with ``emitted`` cut to what the output kept
    (:func:`dsparklab.store.rows.emitted_tokens`)."""
    kept = emitted_tokens([s.accepted_len for s in steps], n_output)
    return [s._replace(emitted=int(k or 0)) for s, k in zip(steps, kept, strict=True)]


def record_row(record: StepRecord | PositionRecord, **extra: Any) -> dict[str, Any]:
    """A record as a store row, with request-level columns added from ``extra``."""
    row = record._asdict()
    row.update(extra)
    return row


@dataclass(frozen=True)
class Generation:
    """One decoded request: its tokens, timings and (with tracing on) its trace."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    wall_time_s: float
    stats: DraftStats
    steps: list[StepRecord] = field(default_factory=list)
    positions: list[PositionRecord] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one drafted block.

    ``target_tokens[i]`` is the target's token at position i given the drafted prefix:
    the argmax under greedy verification; under rejection sampling the draft where
    accepted, the recovered token at the first rejection, and None after it.
    """

    accepted_len: int
    bonus_token: int
    target_tokens: list[int | None]


# --------------------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------------------
def verify_greedy(
    draft_tokens: Sequence[int],
    target_logits: torch.Tensor,  # [n + 1, V_target]
) -> Verdict:
    r"""Greedy verification: accept the longest prefix agreeing with the target's argmax.

    Notes
    -----
    With :math:`t_i = \arg\max` of the target's logits after ``[anchor, d_1..d_i]``,
    position i is accepted iff :math:`d_{j+1} = t_j` for all :math:`j \le i`; the bonus
    is :math:`t_a` for accepted length :math:`a`.
    """
    choices = argmax_last(target_logits).tolist()
    accepted = 0
    while accepted < len(draft_tokens) and draft_tokens[accepted] == choices[accepted]:
        accepted += 1
    return Verdict(accepted, choices[accepted], list(choices[: len(draft_tokens)]))


def verify_rejection(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,  # [n, V_target]
    target_logits: torch.Tensor,  # [n + 1, V_target]
    *,
    temperature: float,
    generator: torch.Generator | None,
) -> Verdict:
    r"""Standard speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

    Notes
    -----
    With target :math:`p_i = \mathrm{softmax}(z_i / T)` and drafter :math:`q_i`, draft
    :math:`d_{i+1}` is accepted with probability :math:`\min(1, p_i(d)/q_i(d))`; at the
    first rejection a token is drawn from :math:`\max(0, p_i - q_i)` (renormalised) and the
    step ends; if all n are accepted the bonus is drawn from :math:`p_n`. The emitted
    tokens are distributed exactly as sampling from the target.
    """
    probs = torch.softmax(target_logits.double() / temperature, dim=-1)
    q = draft_probs.double()
    uniforms = torch.rand(len(draft_tokens), generator=generator, dtype=torch.float64)
    targets: list[int | None] = []
    for i, token in enumerate(draft_tokens):
        p_x, q_x = probs[i, token].item(), q[i, token].item()
        if uniforms[i].item() * q_x < p_x:
            targets.append(token)
            continue
        residual = (probs[i] - q[i]).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: fall back to p
            residual = probs[i]
        recovered = int(torch.multinomial(residual, 1, generator=generator))
        targets.append(recovered)
        targets.extend([None] * (len(draft_tokens) - i - 1))
        return Verdict(i, recovered, targets)
    bonus = int(torch.multinomial(probs[len(draft_tokens)], 1, generator=generator))
    return Verdict(len(draft_tokens), bonus, targets)


# --------------------------------------------------------------------------------------
# engine
# --------------------------------------------------------------------------------------
def eos_ids(model: torch.nn.Module) -> frozenset[int]:
    """The model's end-of-sequence token ids (generation config and config)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def truncate_output(output: Sequence[int], max_new_tokens: int, eos: frozenset[int]) -> list[int]:
    """The output a server returns: at most ``max_new_tokens``, ending at the first
    end-of-sequence token (kept)."""
    output = list(output[:max_new_tokens])
    for index, token in enumerate(output):
        if token in eos:
            return output[: index + 1]
    return output


def request_seed(seed: int, request_id: str) -> int:
    """A stable per-request seed (independent of the order requests run in)."""
    return (seed * 1_000_003 + zlib.crc32(request_id.encode())) % (1 << 63)


class ReferenceEngine:
    """Decode requests with one method at one n, recording the trace.

    Parameters
    ----------
    target : torch.nn.Module
        The target ``*ForCausalLM``, eval mode.
    drafter : torch.nn.Module or Drafter, optional
        The loaded DSpark or Eagle3 drafter (None for method 'none'), or an object that
        implements the :class:`~dsparklab.engines.reference.models.Drafter` protocol.
    config : ReferenceConfig
        Method, n, sampling, tracing.
    eos_token_ids : iterable of int, optional
        End-of-sequence ids; default: the target's generation config.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | Drafter | None = None,
        *,
        config: ReferenceConfig,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        self.config = config
        self.drafter: Drafter | None = None
        if config.method != "none":
            if drafter is None:
                raise ConfigError(f"method {config.method!r} needs a drafter; none was given")
            # a loaded checkpoint, or anything implementing the Drafter protocol
            self.drafter = (
                make_drafter(drafter, config.method)
                if isinstance(drafter, torch.nn.Module)
                else drafter
            )
            block = getattr(self.drafter, "block_size", 0)
            if block and config.num_speculative_tokens > block:
                logger.warning(
                    "n=%d exceeds the drafter's trained block size %d",
                    config.num_speculative_tokens,
                    block,
                )
        self.target = TargetRunner(target, self.drafter.target_layer_ids if self.drafter else ())
        if self.drafter is not None and self.drafter.draft_to_target is None:
            model: Any = target
            head = model.get_output_embeddings()
            target_vocab = int(head.weight.shape[0])
            if self.drafter.draft_vocab_size != target_vocab:
                raise ConfigError(
                    f"drafter vocabulary {self.drafter.draft_vocab_size} != target "
                    f"vocabulary {target_vocab} and the drafter has no d2t mapping"
                )
        self.eos_token_ids = (
            frozenset(eos_token_ids) if eos_token_ids is not None else eos_ids(target)
        )

    @property
    def max_prompt_len(self) -> int:
        """Longest prompt that fits the target's positions with this config."""
        c = self.config
        return self.target.max_positions - c.max_new_tokens - c.num_speculative_tokens - 1

    def _finished(self, output: list[int], emitted: Sequence[int]) -> bool:
        """Enough tokens, or an end-of-sequence token among the ones just emitted."""
        if len(output) >= self.config.max_new_tokens:
            return True
        return self.config.stop_at_eos and not self.eos_token_ids.isdisjoint(emitted)

    def _truncate(self, output: list[int]) -> list[int]:
        stop = self.eos_token_ids if self.config.stop_at_eos else frozenset()
        return truncate_output(output, self.config.max_new_tokens, stop)

    @torch.inference_mode()
    def generate(self, prompt_token_ids: Sequence[int], *, request_id: str = "r0") -> Generation:
        """Decode one prompt; return its output tokens and (tracing on) its trace."""
        cfg = self.config
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ConfigError(f"request {request_id!r} has an empty prompt")
        if len(prompt) > self.max_prompt_len:
            raise ConfigError(
                f"request {request_id!r}: prompt of {len(prompt)} tokens + "
                f"max_new_tokens {cfg.max_new_tokens} + n {cfg.num_speculative_tokens} "
                f"exceeds the target's {self.target.max_positions} positions; shorten it"
            )
        trace = cfg.trace_enabled
        n = cfg.num_speculative_tokens
        generator = None
        if not cfg.greedy:
            generator = torch.Generator().manual_seed(request_seed(cfg.seed, request_id))
        how = DraftSettings(cfg.temperature, generator, trace)
        stats = DraftStats.new(n)
        steps: list[StepRecord] = []
        # (step, drafted tokens, per-position values, verdict) of every traced step
        pending: list[tuple[int, list[int], dict[str, torch.Tensor], Verdict]] = []

        started = time.perf_counter()
        self.target.reset()
        if self.drafter is not None:
            self.drafter.reset()
        logits, aux = self.target.forward(prompt)
        sequence = [*prompt, sample_token(logits[-1], cfg.temperature, generator)]
        output = [sequence[-1]]
        emitted = output
        update = ContextUpdate(aux, sequence[1:], 0)
        drafter = self.drafter
        step = 0
        while not self._finished(output, emitted):
            context_len = len(sequence)
            if drafter is None:
                tick = time.perf_counter() if trace else 0.0
                logits, _ = self.target.forward(sequence[-1:])
                token = sample_token(logits[-1], cfg.temperature, generator)
                sampled = time.perf_counter() if trace else 0.0
                emitted = [token]
                sequence.append(token)
                output.append(token)
                stats.observe_draft(0, 0)
                if trace:
                    steps.append(
                        StepRecord(
                            step,
                            context_len,
                            0,
                            0,
                            0,
                            1,
                            1,
                            None,
                            sampled - tick,
                            time.perf_counter() - sampled,
                        )
                    )
                step += 1
                continue

            tick = time.perf_counter() if trace else 0.0
            proposal = drafter.propose(update, n, how)
            tock = time.perf_counter() if trace else 0.0
            logits, aux = self.target.forward([sequence[-1], *proposal.tokens])
            if cfg.greedy:
                verdict = verify_greedy(proposal.tokens, logits)
            else:
                verdict = verify_rejection(
                    proposal.tokens,
                    self._draft_probs(proposal, logits.shape[-1]),
                    logits,
                    temperature=cfg.temperature,
                    generator=generator,
                )
            verified = time.perf_counter() if trace else 0.0
            accepted = verdict.accepted_len
            self.target.crop(n - accepted)
            emitted = [*proposal.tokens[:accepted], verdict.bonus_token]
            update = ContextUpdate(aux[: accepted + 1], emitted, context_len - 1)
            done = time.perf_counter() if trace else 0.0
            sequence.extend(emitted)
            output.extend(emitted)
            stats.observe_draft(n, accepted)
            if trace:
                steps.append(
                    StepRecord(
                        step,
                        context_len,
                        n,
                        n,
                        accepted,
                        accepted + 1,
                        1,
                        tock - tick,
                        verified - tock,
                        done - verified,
                    )
                )
                pending.append((step, proposal.tokens, proposal.values, verdict))
            step += 1
        positions = self._position_records(pending) if pending else []
        wall = time.perf_counter() - started
        output = self._truncate(output)
        return Generation(
            request_id=request_id,
            prompt_token_ids=prompt,
            output_token_ids=output,
            wall_time_s=wall,
            stats=stats,
            steps=emitted_steps(steps, len(output)),
            positions=positions,
        )

    # -- helpers ---------------------------------------------------------------------
    def _draft_probs(self, proposal: Proposal, target_vocab: int) -> torch.Tensor:
        """The drafter's sampling distribution in target-vocabulary space, ``[n, V_t]``."""
        probs = torch.softmax(proposal.logits.double() / self.config.temperature, dim=-1)
        d2t = self.drafter.draft_to_target if self.drafter is not None else None
        if d2t is None and probs.shape[-1] == target_vocab:
            return probs
        out = probs.new_zeros(probs.shape[0], target_vocab)
        columns = torch.arange(probs.shape[-1])
        out[:, map_draft_to_target(columns, d2t)] = probs
        return out

    @staticmethod
    def _position_records(
        pending: list[tuple[int, list[int], dict[str, torch.Tensor], Verdict]],
    ) -> list[PositionRecord]:
        """All position rows of a request (one ``tolist`` per field for the whole request)."""
        columns: dict[str, list[Any]] = {}
        total = sum(len(tokens) for _, tokens, _, _ in pending)
        for name in TRACE_FIELDS:
            parts = [values[name] for _, _, values, _ in pending if name in values]
            columns[name] = (
                torch.cat(parts).tolist() if len(parts) == len(pending) else [None] * total
            )
        draft_lp, base_lp, bias, norm, flip, conf = (columns[name] for name in TRACE_FIELDS)
        records = []
        index = 0
        for step, tokens, _, verdict in pending:
            for i, token in enumerate(tokens):
                records.append(
                    PositionRecord(
                        step,
                        i,
                        token,
                        verdict.target_tokens[i],
                        i < verdict.accepted_len,
                        draft_lp[index],
                        base_lp[index],
                        bias[index],
                        norm[index],
                        flip[index],
                        conf[index],
                    )
                )
                index += 1
        return records
