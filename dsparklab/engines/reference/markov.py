r"""The DSpark sequential stage as a standalone pure function.

The block backbone gives base logits for all n positions at once; the Markov head then
walks left to right, each position biased by the token drafted just before it:

.. math::

    e_i = W_1[y_{i-1}] \in \mathbb{R}^r, \qquad
    b_i = W_2 e_i \in \mathbb{R}^{V}, \qquad
    \ell_i = \ell^{base}_i + b_i, \qquad
    y_i = \arg\max \ell_i \;(\text{or } y_i \sim \mathrm{softmax}(\ell_i / T))

with :math:`y_{-1}` the anchor (the last accepted / bonus token). The confidence head
gives :math:`c_i = \sigma(w^\top [h_i; e_i] + b)` (``[h_i]`` alone without the Markov
input), the estimated probability that position i is accepted.

This mirrors vLLM's ``DSparkSpeculator._sample_sequential`` (dense path, no top-k):
``markov_embed(prev)`` -> ``markov_bias(embed)`` -> ``base_logits[:, i] + bias`` ->
sample -> ``map_draft_to_target`` -> next ``prev``; then ``compute_confidence(hidden,
stack(embeds))``. It takes plain tensors so vLLM's real implementation can be compared
with it on the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from dsparklab.errors import ConfigError


@dataclass(frozen=True)
class MarkovHeadWeights:
    """The DSpark sequential-stage weights, as plain tensors.

    Attributes
    ----------
    w1 : torch.Tensor
        ``markov_w1`` embedding, ``[V_target, r]`` (indexed by target-vocab ids).
    w2 : torch.Tensor
        ``markov_w2`` projection, ``[V_draft, r]`` (bias = ``e @ w2.T``).
    confidence_weight : torch.Tensor or None
        Confidence head ``proj.weight``, ``[1, H]`` or ``[1, H + r]``; None without a head.
    confidence_bias : torch.Tensor or None
        Confidence head ``proj.bias``, ``[1]`` (None without one).
    confidence_with_markov : bool
        Whether the confidence input is ``[h_i; e_i]`` rather than ``h_i``.
    draft_to_target : torch.Tensor or None
        ``d2t`` offsets ``[V_draft]`` (target id = draft id + d2t[draft id]); None for a
        full-vocabulary drafter.
    """

    w1: torch.Tensor
    w2: torch.Tensor
    confidence_weight: torch.Tensor | None = None
    confidence_bias: torch.Tensor | None = None
    confidence_with_markov: bool = True
    draft_to_target: torch.Tensor | None = None

    @property
    def has_confidence(self) -> bool:
        return self.confidence_weight is not None

    @cached_property
    def w2_t(self) -> torch.Tensor:
        """``w2`` transposed, contiguous ``[r, V_draft]`` (a row-vector product runs ~2x
        faster on it than on the transposed view)."""
        return self.w2.t().contiguous()

    @classmethod
    def from_drafter(cls, drafter: torch.nn.Module) -> MarkovHeadWeights:
        """Read the weights off a loaded DSpark drafter (its plain torch submodules).

        Raises
        ------
        ConfigError
            If the drafter has no Markov head or a variant vLLM does not serve
            (``gated``/``rnn``: vLLM's ``DSparkMarkovHead`` is the vanilla one only).
        """
        config = drafter.config
        head = getattr(drafter, "markov_head", None)
        if head is None:
            raise ConfigError(
                "DSpark drafter has no Markov head (markov_rank=0); nothing to study here, "
                "train it with markov_rank > 0"
            )
        head_type = getattr(config, "markov_head_type", "vanilla")
        if head_type != "vanilla":
            raise ConfigError(
                f"markov_head_type={head_type!r}; the reference engine (like vLLM) runs "
                "the 'vanilla' head only"
            )
        confidence = getattr(drafter, "confidence_head", None)
        d2t = getattr(drafter, "d2t", None)
        return cls(
            w1=head.markov_w1.weight.detach(),
            w2=head.markov_w2.weight.detach(),
            confidence_weight=None if confidence is None else confidence.proj.weight.detach(),
            confidence_bias=(
                None
                if confidence is None or confidence.proj.bias is None
                else confidence.proj.bias.detach()
            ),
            confidence_with_markov=bool(getattr(config, "confidence_head_with_markov", True)),
            draft_to_target=None if d2t is None else d2t.detach(),
        )


@dataclass(frozen=True)
class MarkovStepResult:
    r"""What the sequential stage produced for R requests x N positions.

    Attributes
    ----------
    tokens : torch.Tensor
        ``[R, N]`` drafted tokens, target-vocabulary ids.
    draft_ids : torch.Tensor
        ``[R, N]`` the same tokens as draft-vocabulary ids (columns of ``logits``).
    logits : torch.Tensor
        ``[R, N, V_draft]`` final logits (base + bias), the drafter's distribution.
    bias : torch.Tensor
        ``[R, N, V_draft]`` the Markov bias vectors.
    markov_embed : torch.Tensor
        ``[R, N, r]`` the previous-token embeddings :math:`e_i`.
    confidence : torch.Tensor or None
        ``[R, N]`` confidence-head probabilities, None when not evaluated.
    """

    tokens: torch.Tensor
    draft_ids: torch.Tensor
    logits: torch.Tensor
    bias: torch.Tensor
    markov_embed: torch.Tensor
    confidence: torch.Tensor | None

    @property
    def bias_at_token(self) -> torch.Tensor:
        """``[R, N]`` the bias at the drafted token, :math:`b_i[y_i]`."""
        return self.bias.gather(-1, self.draft_ids.unsqueeze(-1)).squeeze(-1)

    @property
    def bias_norm(self) -> torch.Tensor:
        r"""``[R, N]`` the L2 norm :math:`\lVert b_i \rVert_2` of each bias vector."""
        return torch.linalg.vector_norm(self.bias, dim=-1)

    def flip(self, base_logits: torch.Tensor) -> torch.Tensor:
        """``[R, N]`` whether the bias changed the argmax: argmax(base) != argmax(final)."""
        return argmax_last(base_logits) != argmax_last(self.logits)


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """Index of the first maximum along the last dimension (``torch.argmax`` semantics).

    On CPU this goes through numpy: torch's CPU argmax over a few rows of a 4k vocabulary
    costs ~50 us, numpy's ~4 us, which matters when it runs n + 1 times per step.
    """
    if x.device.type == "cpu" and not x.requires_grad and x.dtype != torch.bfloat16:
        return torch.from_numpy(np.asarray(np.argmax(x.numpy(), axis=-1)))
    return x.argmax(dim=-1)


def map_draft_to_target(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    """Draft-vocabulary ids -> target ids (``id + d2t[id]``; identity without d2t)."""
    if d2t is None:
        return draft_ids
    return draft_ids + d2t[draft_ids]


def dspark_markov_step(
    base_logits: torch.Tensor,  # [R, N, V_draft]
    anchor_tokens: torch.Tensor,  # [R] target-vocab ids
    head: MarkovHeadWeights,
    *,
    hidden: torch.Tensor | None = None,  # [R, N, H] backbone output at the sample slots
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> MarkovStepResult:
    r"""Run DSpark's sequential Markov stage over a drafted block.

    Parameters
    ----------
    base_logits : torch.Tensor
        ``[R, N, V_draft]`` the backbone's draft logits at the N sample slots.
    anchor_tokens : torch.Tensor
        ``[R]`` the anchor (last accepted / bonus token), which biases position 0.
    head : MarkovHeadWeights
        The Markov (and confidence) head weights.
    hidden : torch.Tensor, optional
        ``[R, N, H]`` backbone hidden states at the sample slots; when given and the head
        has a confidence head, confidences are computed.
    temperature : float
        0 = argmax at each position (vLLM's greedy path); > 0 = sample from
        ``softmax(logits / T)`` with ``generator``.
    generator : torch.Generator, optional
        Random source for sampling.

    Returns
    -------
    MarkovStepResult
        Tokens, final logits, bias vectors, embeddings and confidences.

    Notes
    -----
    Position i's logits are :math:`\ell^{base}_i + W_2 W_1[y_{i-1}]`, :math:`y_{-1}` the
    anchor; the drafted token (mapped to target ids) feeds position i + 1, exactly as
    ``prev = draft_sampled_i`` in vLLM's ``_sample_sequential``.
    """
    if base_logits.dim() != 3:
        raise ConfigError(
            f"base_logits has shape {tuple(base_logits.shape)}; expected [R, N, V_draft]"
        )
    num_reqs, num_pos, _ = base_logits.shape
    prev = anchor_tokens.reshape(num_reqs).long()
    w2_t = head.w2_t  # [r, V_draft]
    tokens, draft_ids, logits, biases, embeds = [], [], [], [], []
    for i in range(num_pos):
        embed = head.w1[prev]  # [R, r]
        bias = embed @ w2_t  # [R, V_draft]
        logits_i = base_logits[:, i] + bias
        if temperature == 0.0:
            draft_i = argmax_last(logits_i)
        else:
            probs = torch.softmax(logits_i.double() / temperature, dim=-1)
            draft_i = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        prev = map_draft_to_target(draft_i, head.draft_to_target)
        tokens.append(prev)
        draft_ids.append(draft_i)
        logits.append(logits_i)
        biases.append(bias)
        embeds.append(embed)
    markov_embed = torch.stack(embeds, dim=1)  # [R, N, r]
    confidence = None
    if hidden is not None and head.confidence_weight is not None:
        features = (
            torch.cat([hidden, markov_embed.to(hidden.dtype)], dim=-1)
            if head.confidence_with_markov
            else hidden
        ).float()
        logit = torch.nn.functional.linear(
            features, head.confidence_weight.float(), head.confidence_bias
        ).squeeze(-1)
        confidence = torch.sigmoid(logit)
    return MarkovStepResult(
        tokens=torch.stack(tokens, dim=1),
        draft_ids=torch.stack(draft_ids, dim=1),
        logits=torch.stack(logits, dim=1),
        bias=torch.stack(biases, dim=1),
        markov_embed=markov_embed,
        confidence=confidence,
    )
