"""Tasks: build samples (prompt ids + the token spans that count as evidence) and score answers."""
from .common import (
    PROMPT_TEMPLATE_TOKENS,
    Sample,
    build_chat_prompt,
    check_context_fits,
    locate_spans,
    tokenizer_max_tokens,
)
from .haystacks import check_haystack, filler_haystack, folder_haystack, load_haystack, prose_haystack
from .hotpot import (
    HEADROOM,
    HOTPOT_SETTINGS,
    MULTIHOP,
    HotpotConfig,
    HotpotSetting,
    HotpotRecords,
    build_hotpot_sample,
    load_hotpot_records,
    make_hotpot_samples,
    synthetic_hotpot_records,
)
from .hotpot_sources import check_hotpot_source
from .metrics import exact_match, niah_accuracy, normalize_answer, rouge_l, token_f1
from .niah import NiahConfig, build_niah_sample, make_niah_samples

__all__ = [
    "Sample", "build_chat_prompt", "locate_spans",
    "check_context_fits", "tokenizer_max_tokens", "PROMPT_TEMPLATE_TOKENS",
    "filler_haystack", "prose_haystack", "folder_haystack", "load_haystack", "check_haystack",
    "NiahConfig", "build_niah_sample", "make_niah_samples",
    "HotpotConfig", "HotpotRecords", "build_hotpot_sample", "load_hotpot_records", "make_hotpot_samples",
    "check_hotpot_source",
    "synthetic_hotpot_records", "HotpotSetting", "HEADROOM", "MULTIHOP", "HOTPOT_SETTINGS",
    "exact_match", "token_f1", "normalize_answer", "rouge_l", "niah_accuracy",
]
