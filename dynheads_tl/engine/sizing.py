"""Computed memory per unit of work, from a model's config: what one GPU must hold to trace or ablate one row.

Nothing here is measured. A unit decodes one row (a traced sample, or one ablation job) over its context: the GPU
holds the weights once per actor, and per row the KV cache of every layer and KV head. On top, each decoding step
of the hooked bridge builds, for one layer at a time, the keys and values repeated to every query head (eager
attention's ``repeat_kv``) and the row's attention scores; that transient is listed apart. The prefill runs through
PyTorch's SDPA (flash or memory-efficient kernels on a GPU) and never holds a [head, T, T] matrix, and it keeps
the logits of the last position only. Rows of one batch that decode the same prompt (an ablation sample's conditions)
hold its keys and values once (:func:`~dynheads_tl.engine.sharing.shared_prompts`), so for them the per-row KV figure
is an upper bound.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

GiB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model's config that its memory depends on."""

    name: str
    n_params: float
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, name: str, config) -> "ModelShape":
        """From a transformers config (``AutoConfig.from_pretrained(...)``); the parameter count from its sizes
        (embeddings, attention, gated MLP, norms; untied output embeddings unless the config ties them)."""
        config = getattr(config, "text_config", None) or config
        d, layers = int(config.hidden_size), int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or d // heads)
        ff, vocab = int(config.intermediate_size), int(config.vocab_size)
        attention = d * heads * head_dim * 2 + d * kv * head_dim * 2
        per_layer = attention + 3 * d * ff + 2 * d
        embeddings = vocab * d * (1 if getattr(config, "tie_word_embeddings", False) else 2)
        return cls(name, float(layers * per_layer + embeddings + d), layers, heads, kv, head_dim)

    def weight_bytes(self, bytes_per_value: int = 2) -> float:
        return self.n_params * bytes_per_value

    def kv_bytes(self, tokens: int, bytes_per_value: int = 2) -> float:
        """Keys and values of every layer and KV head for ``tokens`` positions of one row."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * tokens * bytes_per_value

    def step_transient_bytes(self, tokens: int, bytes_per_value: int = 2) -> float:
        """One layer of one decoding step of one row in the hooked bridge: keys and values repeated to every query
        head, plus the attention scores (float32)."""
        return 2 * self.n_heads * self.head_dim * tokens * bytes_per_value + self.n_heads * tokens * 4


# The paper's models, from their published configs (hidden size, layers, heads, KV heads, head size, MLP size,
# vocabulary): the numbers a user would read from each model's config.json on the hub.
PAPER_MODEL_SHAPES = [
    ModelShape("Llama-3.2-3B-Instruct", 3.21e9, 28, 24, 8, 128),
    ModelShape("Phi-4-mini-instruct", 3.84e9, 32, 24, 8, 128),
    ModelShape("Llama-3.1-8B-Instruct", 8.03e9, 32, 32, 8, 128),
    ModelShape("Qwen3-8B", 8.19e9, 36, 32, 8, 128),
    ModelShape("Llama-2-13b-chat", 13.0e9, 40, 40, 40, 128),
]


def unit_memory_table(shapes: list[ModelShape], contexts: tuple[int, ...] = (5_000, 20_000, 50_000),
                      bytes_per_value: int = 2) -> pd.DataFrame:
    """Computed GiB per model: the weights, and per context length one row's KV cache, the per-step transient and
    what one unit needs in all (weights + KV + transient); bf16 / fp16 by default (``bytes_per_value=4``: fp32)."""
    rows = []
    for shape in shapes:
        row = {"model": shape.name, "weights_GiB": shape.weight_bytes(bytes_per_value) / GiB}
        for tokens in contexts:
            tag = f"{tokens // 1000}k"
            kv = shape.kv_bytes(tokens, bytes_per_value)
            transient = shape.step_transient_bytes(tokens, bytes_per_value)
            row[f"kv_GiB_{tag}"] = kv / GiB
            row[f"step_transient_GiB_{tag}"] = transient / GiB
            row[f"unit_GiB_{tag}"] = (shape.weight_bytes(bytes_per_value) + kv + transient) / GiB
        rows.append(row)
    return pd.DataFrame(rows)
