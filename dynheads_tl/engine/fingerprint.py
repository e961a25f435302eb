"""A short digest of what a loaded model computes with (its config and sampled weights): the key of every cache
entry made with it."""
from __future__ import annotations

import hashlib
import json

import torch

# Config fields that name where or how a model was loaded, not what it computes.
_VOLATILE_CONFIG_FIELDS = {"_name_or_path", "_model_name_or_path", "name_or_path", "transformers_version", "_commit_hash",
                           "_attn_implementation", "_attn_implementation_autoset", "attn_implementation",
                           "dtype", "torch_dtype", "device", "model_name", "tokenizer_name"}


def model_fingerprint(model) -> str:
    """A short hex digest of what the model computes with: its config and, for every parameter, its
    name, shape, dtype and 64 sampled values (the first and last 16 and 32 evenly spaced between).

    Why: a cache keyed by the name or path the user typed would hand a different model saved into the
    same folder the first model's traces. Sampling values instead of hashing all weights
    keeps this to milliseconds even for an 8B model on a GPU, and distinguishes any two trainings or
    fine-tunes in practice (a change confined to unsampled elements would go unnoticed). Computed
    once per model object and kept in ``model.__dict__``: weights edited in place afterwards are not seen.
    """
    cached = model.__dict__.get("_dynheads_fingerprint")
    if cached is not None:
        return cached
    network = getattr(model, "original_model", None) or model
    config = getattr(network, "config", None)
    if hasattr(config, "to_dict"):
        config_dict = config.to_dict()
    else:
        cfg = getattr(model, "cfg", None)
        config_dict = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg or {}))
    digest = hashlib.sha256()
    config_dict = {k: v for k, v in config_dict.items() if k not in _VOLATILE_CONFIG_FIELDS}
    digest.update(json.dumps(config_dict, sort_keys=True, default=str).encode())
    samples = []
    with torch.no_grad():
        for name, param in network.named_parameters():
            digest.update(f"{name}:{tuple(param.shape)}:{param.dtype};".encode())
            flat = param.detach().reshape(-1)
            if flat.numel() == 0:
                continue
            last = flat.numel() - 1  # integer arithmetic: the same indices on every device
            middle = torch.tensor([i * last // 33 for i in range(1, 33)], device=flat.device)
            samples.append(torch.cat([flat[:16], flat[middle], flat[-16:]]).float())
    if samples:  # one transfer from the device for all parameters
        digest.update(torch.cat(samples).cpu().numpy().tobytes())
    fingerprint = digest.hexdigest()[:16]
    model.__dict__["_dynheads_fingerprint"] = fingerprint
    return fingerprint
