"""Cost of one dynamic-RAG answer (notebook 04's loop) against one plain traced generation.

    python bench/bench_rag.py --contexts 300 750 --repeats 2

For each context length: three synthetic HotpotQA-format questions, the RAG loop with the ``none`` strategy
(no retrieval) and the ``oracle`` strategy (RIND fires on the first sentence, up to 2 retrievals with
retraction), and a plain traced generation of the same prompt with the same number of new tokens. Timings
are interleaved, the minimum over repeats is kept and ratios are taken within the process (these machines
are noisy). Run it on two versions of the code (e.g. ``PYTHONPATH=<other checkout>``) to compare them.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import dynheads_tl
from dynheads_tl import TraceConfig, trace_generation
from dynheads_tl.protocols.rag import HeadSelector, RagConfig, rag_generate
from dynheads_tl.tasks import make_hotpot_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[300, 750])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    model = dynheads_tl.load_model("smollm2-135m-instruct")
    config = RagConfig(rind_threshold=0.0, max_retrievals=2, max_new_tokens=args.new_tokens)
    for context in args.contexts:
        samples = make_hotpot_samples(model.tokenizer, n=3, seed=11, context_tokens=context)
        selectors = {s: HeadSelector(s, model, config) for s in ("none", "oracle")}
        runs = {
            "plain_traced": lambda: [trace_generation(model, s, TraceConfig(max_new_tokens=args.new_tokens, stop_at_eos=True))
                                     for s in samples],
            "rag_none": lambda: [rag_generate(model, s, selectors["none"], config, sample_seed=i) for i, s in enumerate(samples)],
            "rag_oracle": lambda: [rag_generate(model, s, selectors["oracle"], config, sample_seed=i) for i, s in enumerate(samples)],
        }
        best = {name: float("inf") for name in runs}
        with torch.no_grad():
            for _ in range(args.repeats):
                for name, run in runs.items():
                    started = time.perf_counter()
                    run()
                    best[name] = min(best[name], time.perf_counter() - started)
        row = {"context_tokens": context, "prompt_tokens": [len(s.prompt_ids) for s in samples],
               **{k: round(v, 2) for k, v in best.items()},
               "rag_none_over_plain": round(best["rag_none"] / best["plain_traced"], 2),
               "rag_oracle_over_plain": round(best["rag_oracle"] / best["plain_traced"], 2)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
