"""The decoding step at the hardware's pace: grouped-query attention on a preallocated KV cache.

Why
---
The bridge's eager attention copies every layer's keys and values to all query heads (``repeat_kv``)
at every step, multiplies against the copies, and grows its ``DynamicCache`` by concatenation. For a
model with 3 KV heads and 9 query heads that is 3x the attention work and three full copies of the
cache per step. Here each group of query heads multiplies directly against its KV head's keys and
values (a batched matmul over ``[batch, kv_head, group x query, d_head]``: no copy), and the keys and
values live in one preallocated buffer per layer, written in place at each step.

What stays the same
-------------------
The step runs the bridge's own components (embedding, rotary embedding, norms, MLPs, the ``q``/``k``/
``v``/``o`` projections) and fires the attention hook points the suite reads or writes, with their
names, shapes and meaning: ``hook_attn_scores`` ([batch, head, query, key], pre-softmax; a returned
tensor replaces the scores, as RAG and KV retention do), ``hook_pattern`` (post-softmax; a reader
reduces it), ``hook_z`` (``o.hook_in``, [batch, query, head, d_head] through its conversion; ablation
writes it), ``hook_rot_q``/``hook_rot_k`` and the residual hooks at the block's ends. A head's row of
scores is a view of the grouped scores (head ``h`` reads KV head ``h // group``, as ``repeat_kv``
orders them), so a hook sees exactly what the eager path would show it, up to float rounding.

Gemma 3
-------
Gemma 3's layers are reproduced too: query and key RMS norms per head (``q_norm``/``k_norm``, firing
``hook_q_normed``/``hook_k_normed``) before RoPE, one rotary table per layer type (sliding layers use a local
RoPE base, global layers the global one), a norm after attention and around the MLP ("sandwich" norms), the
scaled embedding and the final logit soft-cap when the config sets one. Sliding-window layers see only keys
within their window, ``key > query - window`` in cache coordinates as transformers' mask function states it
(left padding shifts both sides alike, so a padded row sees what it would alone); the scores a hook reads still
span every position (those outside the window hold the dtype's minimum, as on the eager path). A sliding layer's
cache begins ``window - 1`` positions before the prompt's last token (:class:`StaticKVCache` ``starts``): no
query of the generation, nor of a rewind or retraction (which never go back before the prompt's end), can
see further back. Gemma 3 270M's 15 sliding layers then hold 512 + the generation's positions, not the whole prompt
(``docs/benchmarks.md`` measures the memory).

Shared prompts
--------------
Rows of a batch that decode the same prompt (the masking conditions of one sample) hold its keys and values once
(:class:`StaticKVCache` ``owners``): the step multiplies each prompt's rows together against that one copy, then
each row against its own generated keys, and hands the hooks the same full-width scores. The rows' results are
those of a copy per row up to float rounding (the products are split at the prompt's end).

Anything else hooked (a hook point this step does not fire, e.g. ``hook_result``), an architecture it
does not reproduce (Q/K norms outside Gemma 3, soft-capped attention, sinks, a sliding window on a
non-Gemma-3 layer, partial rotary, compatibility mode, ...) or another layer class: :func:`grouped_unsupported`
says why and the decoder runs the bridge's eager forward instead, over the same preallocated cache. The eager
path is the tested reference (``tests/test_grouped.py``).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.engine.kv_cache import StaticKVCache, check_dropped_keys

AttentionPath = Literal["grouped", "eager"]

# The transformers layer classes whose forward this step reproduces: pre-norm residual blocks,
# attention then MLP (LlamaDecoderLayer.forward and its copies).
_LAYER_CLASSES = {"LlamaDecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer", "Gemma3DecoderLayer"}
_ATTENTION_CLASSES = {"LlamaAttention", "Qwen2Attention", "MistralAttention", "Gemma3Attention"}
# Layers with Gemma 3's structure: Q/K norms, a rotary table per layer type, per-layer sliding windows, norms
# after attention and around the MLP.
_GEMMA_LAYERS = {"Gemma3DecoderLayer"}


def _is_gemma(network) -> bool:
    return all(type(getattr(block, "original_component", None)).__name__ in _GEMMA_LAYERS for block in network.layers)


_DEFAULT_PATH: list[AttentionPath] = []


def default_attention() -> AttentionPath:
    """The attention path a decoder uses when none is given: the innermost :func:`attention_path`, else
    ``$DYNHEADS_ATTENTION`` ("grouped" or "eager"), else "grouped"."""
    if _DEFAULT_PATH:
        return _DEFAULT_PATH[-1]
    value = os.environ.get("DYNHEADS_ATTENTION", "grouped") or "grouped"
    if value not in ("grouped", "eager"):
        raise ValueError(f"DYNHEADS_ATTENTION must be 'grouped' or 'eager', got {value!r}.")
    return value  # type: ignore[return-value]


@contextlib.contextmanager
def attention_path(path: AttentionPath) -> Iterator[None]:
    """Decoders built inside this block default to ``path`` (e.g. "eager", the reference, in a parity test).

    Not part of any cache key: both paths compute the same tokens and Eq. 1 sets, floats to rounding."""
    if path not in ("grouped", "eager"):
        raise ValueError(f"attention path must be 'grouped' or 'eager', got {path!r}.")
    _DEFAULT_PATH.append(path)
    try:
        yield
    finally:
        _DEFAULT_PATH.pop()


def kept_windows(model) -> list[int | None] | None:
    """The sliding windows a decoder may bound its cache by (:func:`layer_windows`), when the grouped step reproduces
    the model's layers and masks with those windows (Gemma 3); None otherwise (every key is kept)."""
    if grouped_unsupported(model) is not None or not _is_gemma(model.original_model.model):
        return None
    return layer_windows(model)


def layer_attention(model, layer: int):
    """Layer ``layer``'s attention bridge (the module holding its ``hook_attn_scores`` and ``hook_pattern``)."""
    return model.original_model.model.layers[layer].original_component.self_attn


def scores_hooked(attn) -> bool:
    """Whether a hook on this attention bridge's scores or pattern could change which keys get weight (read from
    the hook points themselves: the bridge's ``hook_dict`` copies its whole registry at every call)."""
    return bool(attn.hook_attn_scores._forward_hooks or attn.hook_pattern._forward_hooks)


def _hook_points(module: torch.nn.Module) -> list[torch.nn.Module]:
    from transformer_lens.hook_points import HookPoint

    return [m for m in module.modules() if isinstance(m, HookPoint)]


def grouped_unsupported(model) -> str | None:
    """Why :func:`grouped_forward` cannot reproduce ``model``'s forward (a phrase), or None when it can.

    The architecture is checked once per model (kept in ``model.__dict__``): the step reproduces pre-norm
    Llama-style layers with full rotary embeddings and nothing between RoPE and the softmax but the scaling.
    The bridge's switches (compatibility mode, split inputs, per-head results, training) are read every time,
    since they can be turned on after loading."""
    problem = _switch_problem(model)
    if problem is not None:
        return problem
    cached = model.__dict__.get("_dynheads_grouped_unsupported", False)
    if cached is not False:
        return cached
    reason = _architecture_problem(model)
    model.__dict__["_dynheads_grouped_unsupported"] = reason
    return reason


def _switch_problem(model) -> str | None:
    if getattr(model, "compatibility_mode", False):
        return "compatibility mode is on"
    if model.training:
        return "the model is in training mode (dropout)"
    tl_config = model.cfg
    if getattr(tl_config, "use_split_qkv_input", False) or getattr(tl_config, "use_attn_in", False):
        return "split q/k/v inputs are on"
    if getattr(tl_config, "use_attn_result", False):
        return "per-head results (use_attn_result) are on"
    return None


def _architecture_problem(model) -> str | None:
    network = getattr(getattr(model, "original_model", None), "model", None)
    if network is None or not hasattr(network, "layers"):
        return "the bridge wraps no decoder stack at original_model.model.layers"
    config = model.original_model.config
    gemma = bool(len(network.layers)) and _is_gemma(network)
    # Mistral states its window only as config.sliding_window (no use_sliding_window, no layer_types), and its
    # attention reads it from the config at run time; Qwen2 sets it to None when the window is off. Gemma 3's
    # attention modules state their own window (None on global layers), which the step reads per layer.
    if not gemma and (getattr(config, "use_sliding_window", False) or getattr(config, "sliding_window", None) is not None
                      or set(getattr(config, "layer_types", None) or ["full_attention"]) != {"full_attention"}):
        return "the model uses sliding-window attention"
    if gemma and getattr(config, "use_bidirectional_attention", False):
        return "the model attends bidirectionally"
    for name in ("rope_scaling",):
        scaling = getattr(config, name, None)
        if isinstance(scaling, dict) and scaling.get("llama_4_scaling_beta") is not None:
            return "the model scales queries by position (llama-4 scaling)"
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and parameters.get("llama_4_scaling_beta") is not None:
        return "the model scales queries by position (llama-4 scaling)"
    for index, block in enumerate(network.layers):
        layer = getattr(block, "original_component", None)
        if type(layer).__name__ not in _LAYER_CLASSES:
            return f"layer {index} is a {type(layer).__name__}, not a Llama-style decoder layer"
        attn = layer.self_attn
        hf_attn = getattr(attn, "original_component", None)
        if type(hf_attn).__name__ not in _ATTENTION_CLASSES:
            return f"layer {index}'s attention is a {type(hf_attn).__name__}"
        if not all(hasattr(attn, name) for name in ("q", "k", "v", "o", "hook_attn_scores", "hook_pattern")):
            return f"layer {index}'s attention bridge lacks q/k/v/o or its pattern hooks"
        submodules = getattr(attn, "submodules", None) or {}
        if "gate" in submodules:
            return f"layer {index} gates its attention"
        norms = [name for name in ("q_norm", "k_norm") if name in submodules]
        if norms and not (gemma and norms == ["q_norm", "k_norm"] and getattr(attn, "_qk_norm_phase", None) == "post_reshape"
                          and not getattr(attn, "_qk_norm_per_head", False)
                          and not getattr(attn.config, "qk_norm_after_rope", False)):
            return f"layer {index} normalises queries/keys"
        if gemma and norms != ["q_norm", "k_norm"]:
            return f"layer {index} lacks Gemma 3's query and key norms"
        for attribute in ("attn_logit_softcapping", "sinks", "key_multiplier") + (() if gemma else ("sliding_window",)):
            if getattr(hf_attn, attribute, None) is not None:
                return f"layer {index}'s attention has {attribute}"
        if getattr(getattr(hf_attn, "config", None), "clip_qkv", None) is not None:
            return "the model clips q/k/v"
    head_dim = network.layers[0].original_component.self_attn.original_component.head_dim
    device = next(model.parameters()).device
    for layer_type in _layer_types(network) if gemma else [None]:
        probe = _rotary(network, torch.zeros(1, 1, 1, device=device), torch.zeros(1, 1, dtype=torch.long, device=device),
                        layer_type)
        if not (isinstance(probe, tuple) and len(probe) == 2 and probe[0].shape[-1] == head_dim):
            return "the rotary embedding does not cover the whole head (partial rotary) or is not (cos, sin)"
    return None


def _layer_types(network) -> list[str | None]:
    """Each layer's type (Gemma 3: "sliding_attention" or "full_attention"; None for a Llama-style layer)."""
    return [getattr(block.original_component.self_attn.original_component, "layer_type", None)
            for block in network.layers]


def _layer_window(hf_attn, config) -> int | None:
    """One layer's sliding window: as its attention module states it (Gemma 3 and Qwen2 set ``sliding_window`` per
    layer, None on a global layer), else the config's ``sliding_window`` (Mistral and Phi-3 read it at run time for
    every layer), else None (full attention)."""
    if hasattr(hf_attn, "sliding_window"):
        return hf_attn.sliding_window
    return getattr(config, "sliding_window", None)


def layer_windows(model) -> list[int | None]:
    """Each layer's sliding window in tokens, None for a layer of full (global) attention. A query at position q on
    a layer with window w sees the keys k with q - k < w (``key > query - window``, transformers' mask function and
    the grouped step's). Read from the loaded model's attention modules and its config, the values both decoding
    paths mask with; SmolLM2 gives None for every layer, Gemma 3 270M 512 on 15 layers and None on 5, 11 and 17."""
    network = model.original_model.model
    config = model.original_model.config
    return [_layer_window(block.original_component.self_attn.original_component, config) for block in network.layers]


def _rotary(network, hidden: Tensor, position_ids: Tensor, layer_type: str | None):
    """(cos, sin) for ``position_ids``: Gemma 3's rotary embedding takes the layer type (its RoPE base differs
    between sliding and global layers), a Llama-style one does not."""
    if layer_type is None:
        return network.rotary_emb(hidden, position_ids=position_ids)
    return network.rotary_emb(hidden, position_ids, layer_type)


def _fired_hook_points(model) -> set[int]:
    """The ids of every hook point :func:`grouped_forward` fires (kept in ``model.__dict__``)."""
    cached = model.__dict__.get("_dynheads_grouped_fired")
    if cached is not None:
        return cached
    network = model.original_model.model
    fired = []
    for part in (network.embed_tokens, network.rotary_emb, network.norm, model.original_model.lm_head):
        fired += _hook_points(part)
    for block in network.layers:
        layer = block.original_component
        fired += [block.hook_in, block.hook_out]
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "mlp"):
            if hasattr(layer, name):
                fired += _hook_points(getattr(layer, name))
        attn = layer.self_attn
        for name in ("q", "k", "v", "o", "q_norm", "k_norm"):
            if name in (getattr(attn, "submodules", None) or {}) or name in ("q", "k", "v", "o"):
                fired += _hook_points(getattr(attn, name))
        fired += [getattr(attn, name) for name in ("hook_in", "hook_q_normed", "hook_k_normed", "hook_rot_q",
                                                   "hook_rot_k", "hook_cos", "hook_sin", "hook_attn_scores",
                                                   "hook_pattern", "hook_out") if hasattr(attn, name)]
    ids = {id(point) for point in fired}
    model.__dict__["_dynheads_grouped_fired"] = ids
    return ids


def unfired_hooks(model) -> list[str]:
    """The names of hook points that have hooks attached now but that :func:`grouped_forward` does not fire
    (a step with any of them must run the eager path, or those hooks would silently not run)."""
    fired = _fired_hook_points(model)
    points = model.__dict__.get("_dynheads_hook_points")
    if points is None:
        seen: dict[int, tuple[str, torch.nn.Module]] = {}
        for name, point in model.hook_dict.items():
            seen.setdefault(id(point), (name, point))
        points = [entry for key, entry in seen.items() if key not in fired]
        model.__dict__["_dynheads_hook_points"] = points
    return [name for name, point in points
            if point._forward_hooks or point._forward_pre_hooks or point._backward_hooks]


def choose_path(model, requested: AttentionPath) -> AttentionPath:
    """``requested``, unless it is "grouped" and the model or the hooks attached now need the eager path."""
    if requested == "eager" or grouped_unsupported(model) is not None or unfired_hooks(model):
        return "eager"
    return "grouped"


def grouped_forward(
    model,
    tokens: Int[Tensor, "batch query"],
    position_ids: Int[Tensor, "batch query"],
    cache: StaticKVCache,
    key_valid: Bool[Tensor, "batch key"] | None,
) -> Float[Tensor, "batch query vocab"]:
    """One forward of ``tokens`` over ``cache`` (its first ``cache.length`` positions as the past), writing
    their keys and values in place; ``cache.length`` grows by the query length. ``key_valid`` marks the
    key positions each row may attend to (left padding False; None: all), over ``length + query`` keys.

    The arithmetic is the bridge's (``PositionEmbeddingsAttentionBridge.forward``) with the copies taken out:
    RoPE from ``transformers``' ``apply_rotary_pos_emb``, scores ``q @ k^T * scaling``, the additive mask
    with the dtype's minimum, softmax in float32, then ``pattern @ v``.
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    network = model.original_model.model
    gemma = _is_gemma(network)
    layer_types = _layer_types(network) if gemma else [None] * len(network.layers)
    batch, n_query = tokens.shape
    start = cache.length
    n_keys = start + n_query
    cache.reserve(n_keys)
    hidden = network.embed_tokens(tokens)
    rotary = {layer_type: _rotary(network, hidden, position_ids, layer_type) for layer_type in dict.fromkeys(layer_types)}
    # Causal within the new queries, padding from key_valid: an additive mask as the eager path adds it.
    visible = torch.ones(n_query, n_keys, dtype=torch.bool, device=hidden.device).tril(diagonal=start)[None]
    if key_valid is not None:
        visible = visible & key_valid[:, None, :n_keys].to(hidden.device).bool()
    masks: dict[int | None, Tensor | None] = {}  # by sliding window (None: full attention)

    def additive_mask(window: int | None) -> Tensor | None:
        if window not in masks:
            seen = visible
            if window is not None:  # key > query - window, in cache coordinates (transformers' sliding overlay)
                query_at = torch.arange(start, n_keys, device=hidden.device)[:, None]
                seen = seen & (torch.arange(n_keys, device=hidden.device)[None, :] > query_at - window)[None]
            masks[window] = None if bool(seen.all()) else torch.zeros(
                seen.shape, dtype=hidden.dtype, device=hidden.device).masked_fill(
                ~seen, torch.finfo(hidden.dtype).min)[:, None]  # [batch|1, 1, query, key]
        return masks[window]

    for index, block in enumerate(network.layers):
        layer = block.original_component
        attn = layer.self_attn
        hf_attn = attn.original_component
        d_head = hf_attn.head_dim
        residual = block.hook_in(hidden)
        normed = attn.hook_in(layer.input_layernorm(residual))
        query = attn.q(normed).view(batch, n_query, -1, d_head).transpose(1, 2)  # [batch, head, query, d_head]
        key = attn.k(normed).view(batch, n_query, -1, d_head).transpose(1, 2)  # [batch, kv_head, query, d_head]
        value = attn.v(normed).view(batch, n_query, -1, d_head).transpose(1, 2)
        if gemma:  # RMS norm over each head's d_head, before RoPE (the bridge's post-reshape phase)
            query = attn.hook_q_normed(attn.q_norm(query))
            key = attn.hook_k_normed(attn.k_norm(key))
        cos, sin = rotary[layer_types[index]]
        layer_cos, layer_sin = attn._apply_position_embedding_hooks((cos, sin)) if hasattr(
            attn, "_apply_position_embedding_hooks") else (cos, sin)
        query, key = apply_rotary_pos_emb(query, key, layer_cos, layer_sin)
        if hasattr(attn, "hook_rot_q"):
            query = attn.hook_rot_q(query)
        if hasattr(attn, "hook_rot_k"):
            key = attn.hook_rot_k(key)
        n_heads, n_kv = query.shape[1], key.shape[1]
        group = n_heads // n_kv
        cache.write(index, key, value, start)
        first = cache.starts[index]  # a sliding layer's buffer may begin after position 0
        keys, values = cache.tail(index, n_keys)  # views of the buffer: no copy
        # Group g of KV head j is query head j * group + g (repeat_kv's order).
        grouped_query = query.reshape(batch, n_kv, group * n_query, d_head)
        scores = torch.matmul(grouped_query, keys.transpose(-2, -1)) * hf_attn.scaling
        if cache.shared:  # the prompt's keys, once per distinct prompt, then each row's own
            scores = torch.cat([cache.prompt_scores(index, grouped_query) * hf_attn.scaling, scores], dim=-1)
        scores = scores.view(batch, n_heads, n_query, n_keys - first)
        mask = additive_mask(_layer_window(hf_attn, model.original_model.config) if gemma else None)
        if mask is not None:
            scores = scores + mask[..., first:]
        if first:  # the hooks read every position: those the layer dropped hold the minimum, as masked ones do
            scores = torch.cat([scores.new_full((batch, n_heads, n_query, first), torch.finfo(scores.dtype).min),
                                scores], dim=-1)
        scores = attn.hook_attn_scores(scores)
        pattern = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        pattern = attn.hook_pattern(pattern)
        if first:
            if scores_hooked(attn):
                check_dropped_keys(pattern, first, index)
            pattern = pattern[..., first:]
        pattern = pattern.reshape(batch, n_kv, group * n_query, n_keys - first)
        if cache.shared:
            split = cache.prompt_values[index].shape[2]
            out = cache.prompt_output(index, pattern[..., :split]) + torch.matmul(pattern[..., split:], values)
        else:
            out = torch.matmul(pattern, values)
        out = out.reshape(batch, n_heads, n_query, d_head).transpose(1, 2).reshape(batch, n_query, n_heads * d_head)
        attended = attn.hook_out(attn.o(out))
        if gemma:  # norms after attention and around the MLP
            hidden = residual + layer.post_attention_layernorm(attended)
            hidden = hidden + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(hidden)))
        else:
            hidden = residual + attended
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = block.hook_out(hidden)
    cache.length = n_keys
    logits = model.original_model.lm_head(network.norm(hidden))
    cap = getattr(model.original_model.config, "final_logit_softcapping", None)
    if cap is not None:  # Gemma's soft-cap of the logits, as its causal-LM head applies it
        logits = torch.tanh(logits / cap) * cap
    return logits
