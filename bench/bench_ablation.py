"""Cost of the two-pass ablation protocol, per generation and per grid cell.

    python bench/bench_ablation.py --lengths 1000 2000 --steps 40 --runs 2

Part 1: one two-pass (dynamic-masked) generation against one plain traced generation. The protocol
runs every masked step twice (clean + masked), so its floor is about 2x; steps where D_t is empty
skip the second pass.

Part 2: one grid cell of notebook 02 (``--runs`` samples x the four conditions none / dynamic /
static / random), run one generation at a time against the same jobs decoded as one batch
(``run_jobs``: left padding, one prefill per distinct prompt, per-row masks).

Interleaved repeats, minimum kept, ratios within one process (these machines are noisy).
"""
from __future__ import annotations

import argparse
import time

import torch

import dynheads_tl
from dynheads_tl import TraceConfig, trace_generation
from dynheads_tl.protocols.ablation import AblationSetup, Job, run_condition, run_jobs, select_dynamic, select_top_ranked, two_pass_generation
from dynheads_tl.tasks import make_niah_samples

CONDITIONS = ("none", "dynamic", "static", "random")


def best_of(runs: dict, repeats: int) -> tuple[dict[str, float], dict]:
    best, last = {name: float("inf") for name in runs}, {}
    with torch.no_grad():
        for _ in range(repeats):
            for name, run in runs.items():
                started = time.perf_counter()
                last[name] = run()
                best[name] = min(best[name], time.perf_counter() - started)
    return best, last


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--runs", type=int, default=2, help="samples per grid cell in part 2")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model = dynheads_tl.load_model()
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    config = TraceConfig(max_new_tokens=args.steps, stop_at_eos=False)
    trace_generation(model, make_niah_samples(model.tokenizer, n=1, context_tokens=200, seed=1)[0],
                     TraceConfig(max_new_tokens=2))  # warm-up

    print("Part 1: one generation\n")
    print("| context | plain traced s | two-pass dynamic s | steps masked | two-pass top-5 every step s | "
          "dynamic / plain | every-step / plain |")
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        sample = make_niah_samples(model.tokenizer, n=1, context_tokens=length, seed=7)[0]
        best, last = best_of({"plain": lambda: trace_generation(model, sample, config),
                              "dynamic": lambda: two_pass_generation(model, sample, select_dynamic, config),
                              "every": lambda: two_pass_generation(model, sample, select_top_ranked(5), config)},
                             args.repeats)
        masked_steps = int(last["dynamic"].masked_heads.flatten(1).any(1).sum())
        print(f"| {length} | {best['plain']:.2f} | {best['dynamic']:.2f} | {masked_steps}/{args.steps} | "
              f"{best['every']:.2f} | {best['dynamic'] / best['plain']:.2f} | {best['every'] / best['plain']:.2f} |",
              flush=True)

    print(f"\nPart 2: one grid cell = {args.runs} samples x {len(CONDITIONS)} conditions\n")
    print("| context | jobs | plain traced, one generation s | one at a time s | batched s | "
          "one at a time / batched | batched, per generation / plain |")
    print("|---|---|---|---|---|---|---|")
    static = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    static.view(-1)[torch.randperm(n_layers * n_heads, generator=torch.Generator().manual_seed(0))[:5]] = True
    setup = AblationSetup(static_mask=static, static_top20=static, k=5)
    for length in args.lengths:
        samples = make_niah_samples(model.tokenizer, n=args.runs, context_tokens=length, depths=[0.5], seed=11)
        jobs = [Job(sample, condition, i) for i, sample in enumerate(samples) for condition in CONDITIONS]
        best, last = best_of({
            "plain": lambda: trace_generation(model, samples[0], config),
            "sequential": lambda: [run_condition(model, j.sample, j.condition, setup, config, sample_seed=j.sample_seed)
                                   for j in jobs],
            "batched": lambda: run_jobs(model, jobs, setup, config),
        }, args.repeats)
        same = sum(torch.equal(a.masked.tokens, b.masked.tokens) for a, b in zip(last["sequential"], last["batched"]))
        print(f"| {length} | {len(jobs)} | {best['plain']:.2f} | {best['sequential']:.2f} | {best['batched']:.2f} | "
              f"{best['sequential'] / best['batched']:.2f} | {best['batched'] / len(jobs) / best['plain']:.2f} |"
              f"  <!-- identical tokens {same}/{len(jobs)} -->", flush=True)


if __name__ == "__main__":
    main()
