"""Answer metrics: NIAH exact-UUID accuracy, ROUGE-L, and SQuAD-style EM / token F1."""
from __future__ import annotations

import re
import string
from collections import Counter


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation, articles and extra whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """HotpotQA token F1; a yes/no/noanswer gold or prediction that does not match scores 0."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    special = {"yes", "no", "noanswer"}
    if (pred in special or ref in special) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = Counter(pred_tokens) & Counter(ref_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def _lcs(a: list[str], b: list[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(prediction: str, gold: str) -> float:
    """ROUGE-L F1 on normalised whitespace tokens."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return 0.0
    lcs = _lcs(pred, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(pred), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def rouge1_recall(prediction: str, gold: str) -> float:
    """Unigram recall of ``gold`` in ``prediction`` (Wu et al.'s sample filter uses > 0.5)."""
    pred, ref = Counter(normalize_answer(prediction).split()), Counter(normalize_answer(gold).split())
    if not ref:
        return 0.0
    return sum((pred & ref).values()) / sum(ref.values())


def niah_accuracy(response: str, answer: str) -> float:
    """The paper's NIAH accuracy: 1 if the response contains the exact UUID, else 0."""
    return float(answer in response)
