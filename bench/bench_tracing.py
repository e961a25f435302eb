"""Speed and memory of traced generation against plain transformers generate (stock SDPA: ``stock_attention``).

    python bench/bench_tracing.py                 # 1k, 2k, 4k context, 24 steps
    python bench/bench_tracing.py --lengths 2000 --steps 24 --repeats 3

All timings of one context length are taken in one process, interleaved, and the minimum over
repeats is kept, so the ratios are comparable even on a noisy machine. Peak memory is measured in a
fresh subprocess per context length (ru_maxrss after loading vs after one traced generation).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import dynheads_tl
from dynheads_tl import TraceConfig, fast_twin, trace_generation
from dynheads_tl.engine.windowed import stock_generate
from dynheads_tl.tasks import make_niah_samples


def _sample(model, length):
    return make_niah_samples(model.tokenizer, n=1, context_tokens=length, seed=7)[0]


def timings(model, length: int, steps: int, repeats: int, bridge_generate: bool) -> dict:
    sample = _sample(model, length)
    ids = torch.tensor([sample.prompt_ids])
    config = TraceConfig(max_new_tokens=steps, stop_at_eos=False)
    evidence_config = TraceConfig(max_new_tokens=steps, stop_at_eos=False, evidence_attention=True)
    signals_config = TraceConfig(max_new_tokens=steps, stop_at_eos=False, signals=True)
    twin = fast_twin(model)
    runs = {
        "transformers_generate_sdpa": lambda: stock_generate(twin, ids, max_new_tokens=steps, min_new_tokens=steps,
                                                             do_sample=False),
        "traced": lambda: trace_generation(model, sample, config),
        "traced_evidence_attention": lambda: trace_generation(model, sample, evidence_config),
        "traced_signals": lambda: trace_generation(model, sample, signals_config),
        "untraced_same_path": lambda: trace_generation(model, sample, config, record=False),
    }
    if bridge_generate:
        runs["bridge_generate_untraced"] = lambda: model.generate(ids, max_new_tokens=steps, do_sample=False,
                                                                   stop_at_eos=False, verbose=False)
    best = {name: float("inf") for name in runs}
    with torch.no_grad():
        for _ in range(repeats):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - started)
    best = {k: round(v, 2) for k, v in best.items()}
    best["prompt_tokens"] = len(sample.prompt_ids)
    best["traced_over_generate"] = round(best["traced"] / best["transformers_generate_sdpa"], 2)
    best["traced_over_untraced"] = round(best["traced"] / best["untraced_same_path"], 2)
    best["evidence_attention_over_traced"] = round(best["traced_evidence_attention"] / best["traced"], 2)
    best["signals_over_traced"] = round(best["traced_signals"] / best["traced"], 2)  # notebook 05's features
    return best


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(length: int, steps: int) -> None:
    """Peak RSS above the resting RSS during one traced generation (Linux: VmHWM reset via
    /proc/self/clear_refs, so the model load's own peak does not hide it)."""
    model = dynheads_tl.load_model()
    sample = _sample(model, length)
    trace_generation(model, sample, TraceConfig(max_new_tokens=2, stop_at_eos=False))  # warm-up
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    resting = _status_kib("VmRSS")
    trace_generation(model, sample, TraceConfig(max_new_tokens=steps, stop_at_eos=False))
    peak = _status_kib("VmHWM")
    print(json.dumps({"length": len(sample.prompt_ids), "peak_increase_mib": round((peak - resting) / 1024, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 2000, 4000])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--memory-lengths", type=int, nargs="+", default=[1000, 2000, 4000, 8000])
    parser.add_argument("--memory-child", type=int, default=None)
    parser.add_argument("--memory-only", action="store_true", help="skip the speed table")
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.steps)
        return
    if not args.memory_only:
        speed_table(args)
    print("\n| prompt tokens | peak RSS above resting during one traced generation (MiB) |\n|---|---|")
    # The allocator tuning of load_model keeps freed heap memory for reuse, so the generation would reuse
    # what the model load freed and its own footprint would not show in RSS: measure it untuned.
    env = {**os.environ, "DYNHEADS_MALLOC_TUNING": "0"}
    for length in args.memory_lengths:
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(length), "--steps", str(args.steps)],
                             capture_output=True, text=True, check=True, env=env).stdout.strip().splitlines()[-1]
        row = json.loads(out)
        print(f"| {row['length']} | {row['peak_increase_mib']} |", flush=True)


def speed_table(args) -> None:
    model = dynheads_tl.load_model()
    print("| context | prompt tokens | transformers generate (SDPA) s | traced s | untraced (same path) s | "
          "bridge.generate s | traced / generate | traced / untraced | traced with evidence attention s | "
          "evidence attention / traced | traced with signals s | signals / traced |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        t = timings(model, length, args.steps, args.repeats, bridge_generate=(length == 2000))
        print(f"| {length} | {t['prompt_tokens']} | {t['transformers_generate_sdpa']} | {t['traced']} | "
              f"{t['untraced_same_path']} | {t.get('bridge_generate_untraced', '–')} | "
              f"{t['traced_over_generate']} | {t['traced_over_untraced']} | {t['traced_evidence_attention']} | "
              f"{t['evidence_attention_over_traced']} | {t['traced_signals']} | {t['signals_over_traced']} |", flush=True)


if __name__ == "__main__":
    main()
