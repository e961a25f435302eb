"""Answer metrics: NIAH exact-UUID accuracy, SQuAD-style EM / token F1, and ROUGE.

ROUGE comes from Google's ``rouge-score`` package with the settings of Wu et al.'s retrieval-head code,
so the sample filter of their static score keeps and drops the same responses theirs does.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache


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


@lru_cache(maxsize=1)
def _rouge_scorer():
    """Wu et al.'s scorer (Retrieval_Head, ``retrieval_head_detection.py``): ROUGE-1 and ROUGE-L from
    Google's ``rouge-score`` with the Porter stemmer. Built once; imported lazily because importing
    nltk takes seconds."""
    from rouge_score.rouge_scorer import RougeScorer

    return RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


def rouge_l(prediction: str, gold: str) -> float:
    """ROUGE-L F-measure from ``rouge-score`` (lower-cased, split at every non-alphanumeric, stemmed)."""
    return _rouge_scorer().score(gold, prediction)["rougeL"].fmeasure


def rouge1_recall(prediction: str, gold: str) -> float:
    """ROUGE-1 recall of ``gold`` in ``prediction``, as Wu et al.'s sample filter computes it
    (``scorer.score(real_needle, response)['rouge1'].recall``, kept if > 0.5).

    Arguments are in this module's order (prediction first); ``rouge-score`` takes the target first.
    Its tokenizer splits at every non-alphanumeric, so a UUID counts as five tokens.
    """
    return _rouge_scorer().score(gold, prediction)["rouge1"].recall


def niah_accuracy(response: str, answer: str) -> float:
    """The paper's NIAH accuracy: 1 if the response contains the exact UUID, else 0."""
    return float(answer in response)
