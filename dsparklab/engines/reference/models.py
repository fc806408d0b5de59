r"""What the reference engine runs: the target with its cropped KV cache, and the drafters.

- :class:`TargetRunner`: a transformers causal LM whose ``DynamicCache`` is cropped back
  over rejected drafts; returns logits and the hidden states the drafter reads.
- :class:`DSparkDrafter`: one non-causal block pass of the DFlash backbone over a
  context K/V cache of target hidden states (vLLM's ``precompute_and_store_context_kv``),
  then the sequential Markov stage (:func:`~dsparklab.engines.reference.markov.dspark_markov_step`).
- :class:`Eagle3Drafter`: one draft forward per drafted token, as vLLM's proposer.

Only plain torch submodules of the loaded drafters are used (``fc``, ``layers[i].self_attn
.q_proj``, ``markov_head.markov_w1`` ...); loading them is dsparklab.zoo's job.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from dsparklab.engines.reference.markov import (
    MarkovHeadWeights,
    MarkovStepResult,
    argmax_last,
    dspark_markov_step,
)
from dsparklab.errors import ConfigError

logger = logging.getLogger(__name__)

# Attention implementations the drafters can run with on CPU and an explicit mask.
_CPU_ATTENTION = ("sdpa", "eager")


def _target_layer_ids(model: torch.nn.Module, field: str, kind: str) -> tuple[int, ...]:
    """The target layers a drafter reads, from config ``field``; refuse what we cannot run."""
    ids = getattr(model.config, field, None)
    if not ids:
        raise ConfigError(
            f"{kind} drafter config has no {field}; save the checkpoint with the target "
            "layer ids it was trained on"
        )
    if getattr(model, "sliding_window_indices", None):
        raise ConfigError(
            f"{kind} drafter has sliding-window layers; the reference engine runs "
            "full-attention drafters only"
        )
    return tuple(int(i) for i in ids)


# --------------------------------------------------------------------------------------
# target
# --------------------------------------------------------------------------------------
class TargetRunner:
    """A transformers causal LM with a KV cache cropped back on rejection.

    Parameters
    ----------
    model : torch.nn.Module
        A ``*ForCausalLM`` (Qwen3, Llama) in eval mode.
    layer_ids : sequence of int
        Hidden-state indices the drafter reads (``hidden_states[i]`` of the HF output:
        0 = embeddings, i = output of decoder layer i - 1), concatenated in this order.
    """

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int] = ()) -> None:
        self.model: Any = cast(Any, model)
        self.config = self.model.config.get_text_config(decoder=True)
        self.layer_ids = tuple(int(i) for i in layer_ids)
        num_layers = int(self.config.num_hidden_layers)
        bad = [i for i in self.layer_ids if not 0 <= i <= num_layers]
        if bad:
            raise ConfigError(
                f"drafter reads target hidden states {list(self.layer_ids)}, but the "
                f"target has {num_layers} layers (valid ids 0..{num_layers}); the drafter "
                "was trained for another target"
            )
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 1 << 30))
        self.cache: DynamicCache | None = None

    @property
    def seq_len(self) -> int:
        """Tokens in the KV cache."""
        return 0 if self.cache is None else self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.config)

    def forward(self, tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``tokens`` to the cache; return logits ``[m, V]`` and aux ``[m, k*H]``.

        ``aux`` is the concatenation of the hidden states at ``layer_ids`` (``[m, 0]``
        when there are none).
        """
        if self.cache is None:
            self.reset()
        start = self.seq_len
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        positions = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            output_hidden_states=bool(self.layer_ids),
        )
        if not self.layer_ids:
            return out.logits[0], out.logits.new_empty(ids.shape[1], 0)
        aux = torch.cat([out.hidden_states[i][0] for i in self.layer_ids], dim=-1)
        return out.logits[0], aux

    def crop(self, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` entries of the KV cache (the rejected drafts)."""
        if num_tokens > 0 and self.cache is not None:
            self.cache.crop(-num_tokens)


# --------------------------------------------------------------------------------------
# drafters
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContextUpdate:
    """Target output the drafter has not seen yet.

    ``aux_hidden[j]`` is the target's hidden state (at the drafter's layers) at position
    ``start_pos + j``; ``tokens[j]`` is the token at position ``start_pos + j + 1``. The
    last token is the anchor the next block is drafted from.
    """

    aux_hidden: torch.Tensor  # [m, k*H]
    tokens: list[int]  # [m]
    start_pos: int

    @property
    def anchor(self) -> int:
        return self.tokens[-1]

    @property
    def anchor_pos(self) -> int:
        return self.start_pos + len(self.tokens)


@dataclass(frozen=True)
class DraftSettings:
    """How a request drafts, the same at every step: sampling and whether to trace.

    ``temperature`` 0 drafts greedily; ``generator`` seeds the draws (None: greedy or
    torch's global RNG); ``trace`` asks for the per-position values of :class:`Proposal`.
    """

    temperature: float
    generator: torch.Generator | None
    trace: bool


@dataclass(frozen=True)
class Proposal:
    """A drafted block of n tokens and what the drafter knew about it.

    ``values`` holds the per-position trace values the drafter can give (names from
    :data:`TRACE_FIELDS`, each ``[n]``); drafters fill it only when tracing, right after
    drafting, while the logits are still in cache.
    """

    tokens: list[int]  # [n] target-vocab ids
    draft_ids: torch.Tensor  # [n] draft-vocab ids
    logits: torch.Tensor  # [n, V_draft] the drafter's final logits
    base_logits: torch.Tensor | None = None  # [n, V_draft] DSpark, before the Markov bias
    markov: MarkovStepResult | None = None
    values: dict[str, torch.Tensor] = field(default_factory=dict)


# Per-position values a drafter may report (the positions table's drafter columns).
TRACE_FIELDS = (
    "draft_logprob",
    "base_logprob",
    "markov_bias",
    "markov_bias_norm",
    "markov_flip",
    "confidence",
)


def token_logprob(
    logits: torch.Tensor,  # [..., n, V]
    ids: torch.Tensor,  # [n]
    temperature: float,
) -> torch.Tensor:  # [..., n]
    r"""Log-probability of ``ids`` under ``softmax(logits / T)`` (T = 1 when greedy).

    :math:`z_{x} - m - \log \sum_v e^{z_v - m}` with :math:`m = \max_v z_v`, written
    out: on CPU it runs ~25 % faster than ``torch.logsumexp`` inside the decode loop.
    """
    scaled = logits.float() / temperature if temperature else logits.float()
    top = scaled.amax(-1, keepdim=True)
    index = ids.expand(*scaled.shape[:-1]).unsqueeze(-1)
    picked = (scaled.gather(-1, index) - top)[..., 0]
    return picked - (scaled - top).exp_().sum(-1).log_()


class Drafter(Protocol):
    method: str
    target_layer_ids: tuple[int, ...]
    draft_to_target: torch.Tensor | None
    draft_vocab_size: int

    def reset(self) -> None: ...

    def propose(self, update: ContextUpdate, num_tokens: int, how: DraftSettings) -> Proposal: ...


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [1, heads, T, D]`` with ``cos``/``sin`` ``[1, T, D]``."""
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


def sample_token(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> int:
    """Argmax (T = 0) or a draw from ``softmax(logits / T)``."""
    if temperature == 0.0:
        return int(argmax_last(logits))
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _draft_to_target(drafter: torch.nn.Module) -> torch.Tensor | None:
    d2t = getattr(drafter, "d2t", None)
    return None if d2t is None else d2t.detach().long()


class DSparkDrafter:
    """DSpark drafting: a DFlash block pass, then the sequential Markov stage.

    Layout (``sample_from_anchor``, vLLM's ``_prepare_dflash_inputs_kernel``): the query
    block is the anchor at the anchor's position followed by mask tokens; with
    ``sample_from_anchor`` it has n slots and slot k predicts the token at anchor
    position + k + 1; without it (DFlash's fill-in layout) it has 1 + n slots and slots
    1..n are sampled. Queries attend, non-causally, to the whole block and to the context
    K/V computed from the target's hidden states at every accepted position before the
    anchor (``fc`` -> ``hidden_norm`` -> per-layer ``k_proj``/``k_norm``/RoPE and
    ``v_proj``).
    """

    method = "dspark"

    def __init__(self, model: torch.nn.Module) -> None:
        config: Any = model.config
        self.model: Any = cast(Any, model)
        self.target_layer_ids = _target_layer_ids(model, "aux_hidden_state_layer_ids", "DSpark")
        self.sample_from_anchor = bool(getattr(config, "sample_from_anchor", True))
        if getattr(config, "mask_token_id", None) is None:
            raise ConfigError("DSpark drafter config has no mask_token_id; save it with one")
        self.mask_token_id = int(config.mask_token_id)
        self.block_size = int(getattr(config, "block_size", 0) or 0)
        self.head = MarkovHeadWeights.from_drafter(model)
        self.draft_to_target = _draft_to_target(model)
        self.draft_vocab_size = int(self.model.lm_head.weight.shape[0])
        # per-layer context K/V, [1, kv_heads, capacity, head_dim], filled up to
        # context_len; the block's own K/V go right after it while drafting
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._capacity = 0
        self.context_len = 0

    def reset(self) -> None:
        """Forget the context (the buffers are kept for the next request)."""
        self.context_len = 0

    def _reserve(self, needed: int, like: torch.Tensor) -> None:
        """Grow the K/V buffers (geometrically) to hold ``needed`` positions."""
        if needed <= self._capacity:
            return
        capacity = max(needed, 2 * self._capacity, 256)
        shape = (1, like.shape[1], capacity, like.shape[3])
        grown_k, grown_v = [], []
        for index in range(len(self.model.layers)):
            k, v = like.new_empty(shape), like.new_empty(shape)
            if index < len(self._keys) and self.context_len:
                k[:, :, : self.context_len] = self._keys[index][:, :, : self.context_len]
                v[:, :, : self.context_len] = self._values[index][:, :, : self.context_len]
            grown_k.append(k)
            grown_v.append(v)
        self._keys, self._values, self._capacity = grown_k, grown_v, capacity

    def _extend_context(self, aux_hidden: torch.Tensor, start_pos: int) -> None:
        if start_pos != self.context_len:
            raise ConfigError(
                f"DSpark context holds {self.context_len} positions but the update starts "
                f"at {start_pos}; the engine skipped or repeated target output"
            )
        model = self.model
        ctx = model.hidden_norm(model.fc(aux_hidden)).unsqueeze(0)  # [1, m, H]
        num = ctx.shape[1]
        end = start_pos + num
        positions = torch.arange(start_pos, end).unsqueeze(0)
        cos, sin = model.rotary_emb(ctx, positions)
        for index, layer in enumerate(model.layers):
            attn = layer.self_attn
            k = attn.k_norm(attn.k_proj(ctx).view(1, num, -1, attn.head_dim)).transpose(1, 2)
            v = attn.v_proj(ctx).view(1, num, -1, attn.head_dim).transpose(1, 2)
            self._reserve(end, k)
            self._keys[index][:, :, start_pos:end] = _rope(k, cos, sin)
            self._values[index][:, :, start_pos:end] = v
        self.context_len = end

    def block_hidden(self, anchor: int, anchor_pos: int, num_tokens: int) -> torch.Tensor:
        """The backbone's (final-normed) hidden states at the n sample slots, ``[n, H]``."""
        model = self.model
        q_len = num_tokens if self.sample_from_anchor else num_tokens + 1
        ids = torch.full((1, q_len), self.mask_token_id, dtype=torch.long)
        ids[0, 0] = anchor
        hidden = model.embed_tokens(ids)  # [1, q, H]
        positions = torch.arange(anchor_pos, anchor_pos + q_len).unsqueeze(0)
        cos, sin = model.rotary_emb(hidden, positions)
        start, end = self.context_len, self.context_len + q_len
        for index, layer in enumerate(model.layers):
            attn = layer.self_attn
            residual = hidden
            x = layer.input_layernorm(hidden)
            q = attn.q_norm(attn.q_proj(x).view(1, q_len, -1, attn.head_dim)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(x).view(1, q_len, -1, attn.head_dim)).transpose(1, 2)
            v = attn.v_proj(x).view(1, q_len, -1, attn.head_dim).transpose(1, 2)
            q = _rope(q, cos, sin)
            self._reserve(end, k)
            # the block's K/V after the context (scratch: the next update overwrites it)
            self._keys[index][:, :, start:end] = _rope(k, cos, sin)
            self._values[index][:, :, start:end] = v
            keys, values = self._keys[index][:, :, :end], self._values[index][:, :, :end]
            out = F.scaled_dot_product_attention(
                q, keys, values, scale=attn.scaling, enable_gqa=q.shape[1] != keys.shape[1]
            )  # non-causal: every query sees the context and the whole block
            out = attn.o_proj(out.transpose(1, 2).reshape(1, q_len, -1))
            hidden = residual + out
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = model.norm(hidden)[0]
        return hidden if self.sample_from_anchor else hidden[1:]

    def backbone(self, update: ContextUpdate, num_tokens: int) -> torch.Tensor:
        """Take in the target's new output, then run the block pass: ``[n, H]`` hidden
        states at the sample slots (what vLLM's Markov stage reads as ``head_hidden``)."""
        self._extend_context(update.aux_hidden, update.start_pos)
        return self.block_hidden(update.anchor, update.anchor_pos, num_tokens)

    def propose(self, update: ContextUpdate, num_tokens: int, how: DraftSettings) -> Proposal:
        hidden = self.backbone(update, num_tokens)
        base_logits = self.model.lm_head(hidden)  # [n, V_draft]
        step = dspark_markov_step(
            base_logits.unsqueeze(0),
            torch.tensor([update.anchor]),
            self.head,
            hidden=hidden.unsqueeze(0) if how.trace else None,
            temperature=how.temperature,
            generator=how.generator,
        )
        draft_ids, logits = step.draft_ids[0], step.logits[0]
        values = {}
        if how.trace:
            # greedy drafts are the final argmax already; sampled ones are not
            final = argmax_last(logits) if how.temperature else draft_ids
            logprobs = token_logprob(torch.stack([logits, base_logits]), draft_ids, how.temperature)
            values = {
                "draft_logprob": logprobs[0],
                "base_logprob": logprobs[1],
                "markov_bias": step.bias_at_token[0],
                "markov_bias_norm": step.bias_norm[0],
                "markov_flip": argmax_last(base_logits) != final,
            }
            if step.confidence is not None:
                values["confidence"] = step.confidence[0]
        return Proposal(
            tokens=step.tokens[0].tolist(),
            draft_ids=draft_ids,
            logits=logits,
            base_logits=base_logits,
            markov=step,
            values=values,
        )


class Eagle3Drafter:
    """Eagle3 drafting: autoregressive, one draft forward per drafted token (as vLLM).

    The first forward covers every new target position q with input
    ``[embed(x_{q+1}); fc(g_q)]`` at RoPE position q (vLLM's proposer layout; RoPE is
    relative, so speculators' training positions q + 1 give the same attention); the
    last one predicts :math:`d_1`. Each next forward feeds ``[embed(d_i); h_i]``, h the
    previous forward's pre-norm output, at the next position. The speculative KV
    entries are dropped after the step; the next step rewrites those positions with the
    target's own hidden states.
    """

    method = "eagle3"

    def __init__(self, model: torch.nn.Module) -> None:
        config: Any = model.config
        self.model: Any = cast(Any, model)
        self.target_layer_ids = _target_layer_ids(
            model, "eagle_aux_hidden_state_layer_ids", "Eagle3"
        )
        self.norm_output = bool(getattr(config, "norm_output", False))
        layer_config = config.transformer_layer_config
        if getattr(layer_config, "_attn_implementation", None) not in _CPU_ATTENTION:
            logger.info(
                "Eagle3 drafter attention %r -> 'sdpa' for CPU inference",
                getattr(layer_config, "_attn_implementation", None),
            )
            layer_config._attn_implementation = "sdpa"
        self.draft_to_target = _draft_to_target(model)
        self.draft_vocab_size = int(self.model.lm_head.weight.shape[0])
        self.cache: DynamicCache = DynamicCache()

    def reset(self) -> None:
        self.cache = DynamicCache()

    def _combine(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        model = self.model
        x = aux_hidden
        if getattr(model, "input_norm", None) is not None:
            x = model.input_norm(x)
        if getattr(model, "fc_norm", None) is not None:
            chunks = x.chunk(len(model.fc_norm), dim=-1)
            x = torch.cat([norm(c) for norm, c in zip(model.fc_norm, chunks, strict=True)], -1)
        return model.fc(x)

    def _forward(self, inputs: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Run the decoder layers on ``inputs [1, m, 2H]`` at positions start_pos.. ."""
        num = inputs.shape[1]
        positions = torch.arange(start_pos, start_pos + num).unsqueeze(0)
        position_embeddings = self.model.rotary_emb(inputs, positions)
        mask = None
        if num > 1:  # causal over the new rows, everything cached before is visible
            past = self.cache.get_seq_length()
            mask = torch.ones(num, past + num, dtype=torch.bool).tril(past)[None, None]
        hidden = inputs
        for layer in self.model.layers:
            hidden = layer(
                hidden,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                position_embeddings=position_embeddings,
            )
        return hidden

    def _logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The normed hidden state the LM head reads, and the one carried to the next
        forward."""
        normed = self.model.norm(hidden)
        return normed, (normed if self.norm_output else hidden)

    def positions(
        self, update: ContextUpdate, num_tokens: int
    ) -> Generator[torch.Tensor, int, None]:
        """The draft forwards of one block, one position at a time.

        Yields the normed hidden state ``[H]`` the LM head reads at each position and
        takes back (``send``) the draft-vocabulary id drafted there; the speculative KV
        entries are dropped when the block ends. :meth:`propose` drives it with the
        drafter's own LM head; a caller drafting several requests in lockstep (one
        ``compute_logits`` over the batch per position, as vLLM does) drives one each.
        """
        model = self.model
        if self.cache.get_seq_length() != update.start_pos:
            raise ConfigError(
                f"Eagle3 cache holds {self.cache.get_seq_length()} positions but the "
                f"update starts at {update.start_pos}; the engine skipped or repeated "
                "target output"
            )
        embeds = model.embed_tokens(torch.tensor(update.tokens, dtype=torch.long))
        inputs = torch.cat([embeds, self._combine(update.aux_hidden)], dim=-1).unsqueeze(0)
        hidden = self._forward(inputs, update.start_pos)[:, -1:]  # [1, 1, H]
        position = update.start_pos + len(update.tokens) - 1
        prev: torch.Tensor | None = None  # the previous position's drafted token
        for _ in range(num_tokens):
            if prev is not None:
                inputs = torch.cat([model.embed_tokens(prev), hidden], dim=-1)
                position += 1
                hidden = self._forward(inputs, position)
            normed, hidden = self._logits(hidden)
            draft_id = yield normed[0, 0]
            token = draft_id
            if self.draft_to_target is not None:
                token += int(self.draft_to_target[draft_id])
            prev = torch.tensor([[token]], dtype=torch.long)
        if num_tokens > 1:
            self.cache.crop(-(num_tokens - 1))  # the speculative entries

    def propose(self, update: ContextUpdate, num_tokens: int, how: DraftSettings) -> Proposal:
        tokens: list[int] = []
        draft_ids, logits = [], []
        steps = self.positions(update, num_tokens)
        normed = next(steps, None)
        while normed is not None:
            logits_i = self.model.lm_head(normed)
            draft_id = sample_token(logits_i, how.temperature, how.generator)
            draft_ids.append(draft_id)
            logits.append(logits_i)
            token = draft_id
            if self.draft_to_target is not None:
                token += int(self.draft_to_target[draft_id])
            tokens.append(token)
            normed = send_draft(steps, draft_id)
        ids, stacked = torch.tensor(draft_ids, dtype=torch.long), torch.stack(logits)
        values = (
            {"draft_logprob": token_logprob(stacked, ids, how.temperature)} if how.trace else {}
        )
        return Proposal(tokens=tokens, draft_ids=ids, logits=stacked, values=values)


def send_draft(steps: Generator[torch.Tensor, int, None], value: int) -> torch.Tensor | None:
    """:meth:`Eagle3Drafter.positions`' next hidden state after drafting ``value`` there;
    None once the block is done."""
    try:
        return steps.send(value)
    except StopIteration:
        return None


def make_drafter(model: torch.nn.Module, method: str) -> Drafter:
    """Wrap a loaded drafter for ``method`` ('dspark' or 'eagle3')."""
    kind = getattr(model.config, "speculators_model_type", None)
    if method == "dspark":
        if kind not in ("dspark", None) or getattr(model, "markov_head", None) is None:
            raise ConfigError(
                f"method 'dspark' needs a DSpark drafter; got a {kind or 'plain'} model"
            )
        return DSparkDrafter(model)
    if method == "eagle3":
        if kind not in ("eagle3", None) or not hasattr(model, "fc"):
            raise ConfigError(
                f"method 'eagle3' needs an Eagle3 drafter; got a {kind or 'plain'} model"
            )
        return Eagle3Drafter(model)
    raise ConfigError(f"method {method!r} has no drafter")
