"""Baseline NIAH accuracy of a model (no masking) over haystacks x context lengths.

    python bench/niah_baseline.py --n 10 --lengths 1000 2000 4000 --haystacks filler prose
Writes a Markdown table to stdout; the README records the numbers.
"""
from __future__ import annotations

import argparse
import time

import dynheads_tl
from dynheads_tl import TraceConfig, trace_generation
from dynheads_tl.tasks import make_niah_samples, niah_accuracy, rouge_l


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=dynheads_tl.DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--haystacks", nargs="+", default=["filler", "prose"])
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=123)
    args = parser.parse_args()
    model = dynheads_tl.load_model(args.model)
    print("| haystack | context tokens | n | accuracy (exact UUID) | ROUGE-L | s / sample |")
    print("|---|---|---|---|---|---|")
    for haystack in args.haystacks:
        for length in args.lengths:
            samples = make_niah_samples(model.tokenizer, n=args.n, context_tokens=length, seed=args.seed,
                                        haystack=haystack, max_new_tokens=args.max_new_tokens)
            started, acc, rl = time.time(), 0.0, 0.0
            for sample in samples:
                trace = trace_generation(model, sample, TraceConfig(max_new_tokens=args.max_new_tokens), record=False)
                acc += niah_accuracy(trace.response, sample.answers[0])
                rl += rouge_l(trace.response, sample.meta["needle_text"])
            per = (time.time() - started) / len(samples)
            print(f"| {haystack} | {length} | {len(samples)} | {acc / len(samples):.2f} | {rl / len(samples):.2f} | {per:.1f} |", flush=True)


if __name__ == "__main__":
    main()
