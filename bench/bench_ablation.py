"""One two-pass (dynamic-masked) generation against one plain traced generation.

    python bench/bench_ablation.py --lengths 1000 2000 --steps 40

The protocol runs every masked step twice (clean + masked), so its floor is about 2x; steps where
D_t is empty skip the second pass. Interleaved repeats, minimum kept, ratios within one process.
"""
from __future__ import annotations

import argparse
import time

import torch

import dynheads_tl
from dynheads_tl import TraceConfig, trace_generation
from dynheads_tl.ablation import select_dynamic, select_top_ranked, two_pass_generation
from dynheads_tl.tasks import make_niah_samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model = dynheads_tl.load_model()
    print("| context | plain traced s | two-pass dynamic s | steps masked | two-pass top-5 every step s | "
          "dynamic / plain | every-step / plain |")
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        sample = make_niah_samples(model.tokenizer, n=1, context_tokens=length, seed=7)[0]
        config = TraceConfig(max_new_tokens=args.steps, stop_at_eos=False)
        runs = {"plain": lambda: trace_generation(model, sample, config),
                "dynamic": lambda: two_pass_generation(model, sample, select_dynamic, config),
                "every": lambda: two_pass_generation(model, sample, select_top_ranked(5), config)}
        best, masked_steps = {k: float("inf") for k in runs}, 0
        with torch.no_grad():
            for _ in range(args.repeats):
                for name, run in runs.items():
                    started = time.perf_counter()
                    out = run()
                    best[name] = min(best[name], time.perf_counter() - started)
                    if name == "dynamic":
                        masked_steps = int(out.masked_heads.flatten(1).any(1).sum())
        print(f"| {length} | {best['plain']:.2f} | {best['dynamic']:.2f} | {masked_steps}/{args.steps} | "
              f"{best['every']:.2f} | {best['dynamic'] / best['plain']:.2f} | {best['every'] / best['plain']:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
