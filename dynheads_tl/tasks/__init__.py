"""Tasks: build samples (prompt ids + the token spans that count as evidence) and score answers."""
from .common import Sample, build_chat_prompt, locate_spans
from .haystacks import filler_haystack, folder_haystack, load_haystack, prose_haystack
from .hotpot import (
    HotpotConfig,
    build_hotpot_sample,
    load_hotpot_records,
    make_hotpot_samples,
    synthetic_hotpot_records,
)
from .metrics import exact_match, niah_accuracy, normalize_answer, rouge_l, token_f1
from .niah import NiahConfig, build_niah_sample, make_niah_samples

__all__ = [
    "Sample", "build_chat_prompt", "locate_spans",
    "filler_haystack", "prose_haystack", "folder_haystack", "load_haystack",
    "NiahConfig", "build_niah_sample", "make_niah_samples",
    "HotpotConfig", "build_hotpot_sample", "load_hotpot_records", "make_hotpot_samples",
    "synthetic_hotpot_records",
    "exact_match", "token_f1", "normalize_answer", "rouge_l", "niah_accuracy",
]
