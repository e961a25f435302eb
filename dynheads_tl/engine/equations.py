"""The paper's two retrieval criteria, the masks they read, and head names: one implementation each,
used by tracing, the ablation protocol, the RAG loop and the analyses alike.

- **Eq. 1** (NIAH): head h retrieves at step t when the top-1 position of its attention row lies in the
  evidence (the needle) and holds the token generated at t (:func:`eq1_mask`).
- **Eq. 2** (HotpotQA): a head's share of attention on the evidence (supporting-fact tokens) among the
  eligible key positions, i.e. all but the first ``sink`` positions and the last ``window`` ones
  (:func:`eq2_share`, :func:`eligible_positions`). Numerator and denominator are restricted alike, so the
  share lies in [0, 1].
- **Which heads Eq. 2 marks** (:class:`Eq2Rule`): the paper's fixed threshold on the share, or a threshold
  relative to chance, the share the evidence would get from attention spread evenly over the eligible
  positions (:func:`eq2_chance`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor


def evidence_positions(spans: Iterable[tuple[int, int]], length: int, device=None) -> Bool[Tensor, "pos"]:
    """True on every position of the evidence ``spans`` ([start, end) token ranges), for ``length`` positions."""
    mask = torch.zeros(length, dtype=torch.bool, device=device)
    for start, end in spans:
        mask[start:end] = True
    return mask


def eq1_mask(argmax_pos: Int[Tensor, "*step layer head"], ids: Int[Tensor, "key"], evidence: Bool[Tensor, "key"],
             tokens: Int[Tensor, "*step"]) -> Bool[Tensor, "*step layer head"]:
    """Eq. 1: the top-1 source ``argmax_pos`` lies in ``evidence`` and holds the generated ``tokens``.

    ``ids`` and ``evidence`` cover prompt and generated positions, in the sequence's own coordinates.
    ``tokens`` has one entry per step (or is a 0-d tensor for one step)."""
    return evidence[argmax_pos] & (ids[argmax_pos] == tokens[..., None, None])


def eligible_positions(offsets: Int[Tensor, "batch"], total: int, key_len: int, sink: int, window: int
                       ) -> Bool[Tensor, "batch key"]:
    """Eq. 2's denominator positions of each left-padded row, in padded coordinates: all keys but the
    row's first ``sink`` real positions and the last ``window`` of the ``key_len`` visible keys (padding
    is never eligible). All rows end at the same padded position, so the local window is shared."""
    positions = torch.arange(total, device=offsets.device)[None, :] - offsets[:, None]
    mask = positions >= sink
    if window:
        mask[:, max(key_len - window, 0): key_len] = False
    return mask


def eq2_share(rows: Float[Tensor, "batch head key"], evidence: Bool[Tensor, "batch key"],
              eligible: Bool[Tensor, "batch key"]) -> Float[Tensor, "batch head"]:
    """Eq. 2: each head's attention on eligible evidence positions over its attention on eligible positions
    (0 where a head puts no attention on any eligible position)."""
    numerator = torch.einsum("bhk,bk->bh", rows, (evidence & eligible).float())
    denominator = torch.einsum("bhk,bk->bh", rows, eligible.float())
    return torch.where(denominator > 0, numerator / denominator.clamp_min(1e-30), torch.zeros_like(numerator))


def eq2_chance(evidence: Bool[Tensor, "*batch key"], eligible: Bool[Tensor, "*batch key"]) -> Float[Tensor, "*batch"]:
    """The Eq. 2 share of a head that spreads its attention evenly over the eligible positions: the evidence's
    share of them (0 where no position is eligible)."""
    total = eligible.sum(-1).float()
    return (evidence & eligible).sum(-1).float() / total.clamp_min(1.0)


def eq2_chance_per_step(evidence: Bool[Tensor, "pos"], prompt_len: int, n_steps: int, sink: int,
                        window: int) -> Float[Tensor, "step"]:
    """:func:`eq2_chance` at every decoding step of one unpadded sequence: step t's query sees ``prompt_len + t``
    keys, of which all but the first ``sink`` and the last ``window`` are eligible (``evidence`` covers the
    prompt; generated positions are never evidence)."""
    out = torch.zeros(n_steps)
    for step in range(n_steps):
        key_len = prompt_len + step
        eligible = eligible_positions(torch.zeros(1, dtype=torch.long), key_len, key_len, sink, window)[0]
        visible = torch.zeros(key_len, dtype=torch.bool)
        visible[: len(evidence)] = evidence[:key_len]
        out[step] = eq2_chance(visible, eligible)
    return out


@dataclass(frozen=True)
class Eq2Rule:
    """Which heads Eq. 2 marks as retrieving at a step.

    - ``kind="fixed"``: share > ``value`` (the paper's form; a third party used 0.1).
    - ``kind="chance"``: share > ``value`` x chance, where chance is the evidence's share of the eligible
      positions at that step (:func:`eq2_chance`): a head counts when it reads the evidence ``value`` times more
      than attention spread evenly would. The factor is calibrated from data
      (:func:`~dynheads_tl.analysis.scoring.calibrate_chance_factor`).
    """

    kind: Literal["fixed", "chance"] = "fixed"
    value: float = 0.1

    def __post_init__(self):
        if self.kind not in ("fixed", "chance"):
            raise ValueError(f"Eq2Rule kind must be 'fixed' or 'chance', got {self.kind!r}.")
        if not isinstance(self.value, (int, float)) or isinstance(self.value, bool) or not self.value >= 0:
            raise ValueError(f"Eq2Rule value must be a number >= 0, got {self.value!r}.")

    @classmethod
    def of(cls, rule: "Eq2Rule | float") -> "Eq2Rule":
        """A rule as given, or a bare number as the fixed threshold."""
        return rule if isinstance(rule, Eq2Rule) else cls("fixed", float(rule))

    def cutoff(self, chance: Tensor) -> Tensor:
        """The share a head must exceed, given the chance share (any shape)."""
        return torch.full_like(chance, float(self.value)) if self.kind == "fixed" else self.value * chance

    def select(self, share: Float[Tensor, "*step layer head"], chance: Float[Tensor, "*step"]) -> Bool[Tensor, "*step layer head"]:
        """The marked heads: ``share`` above :meth:`cutoff` of each step's ``chance``."""
        return share > self.cutoff(chance.to(share.device))[..., None, None]

    def label(self) -> str:
        return f"Eq. 2 share > {self.value:g}" if self.kind == "fixed" else f"Eq. 2 share > {self.value:.3g} x chance"


def head_label(layer: int, head: int) -> str:
    """``"L15H1"``: the name of one head, everywhere in tables and figures."""
    return f"L{layer}H{head}"


def head_labels(flat_indices: Iterable[int], n_heads: int) -> list[str]:
    """Labels of heads given as flat indices ``layer * n_heads + head``."""
    return [head_label(*divmod(int(i), n_heads)) for i in flat_indices]


def head_names(mask: Bool[Tensor, "layer head"]) -> str:
    """``"L15H1 L18H6"``: the heads set in ``mask``, in layer-major order."""
    return " ".join(head_label(layer, head) for layer, head in mask.nonzero().tolist())
