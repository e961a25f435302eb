"""An ESTIMATE (not a measurement) of the `paper` preset's GPU-hours for Llama-3.1-8B, on 1, 8 and 64 GPUs.

    python bench/estimate_paper_gpu_hours.py
    python bench/estimate_paper_gpu_hours.py --overhead 0.1 --bandwidth 1.5e12

Units are counted from the preset's parameters (each claim's ``CLAIM.presets["paper"]``), with each
notebook's batching. Each unit's cost follows the structure measured on the CPU here (``bench/bench_tracing.py``,
``bench/bench_ablation.py``): a fixed cost per forward of the hooked bridge (hooks, kernel launches) plus a part
linear in rows x context length (reading the KV cache, and eager attention's keys and values repeated to every
query head), and a prefill through SDPA whose attention part grows with T^2. The constants for a GPU are
assumptions, printed with the result: an H100-class GPU, bf16, ``--bandwidth`` bytes/s of achieved HBM bandwidth,
``--flops`` achieved FLOP/s in the prefill, ``--overhead`` seconds per forward. Until someone times the
preset on a GPU, every number this prints is an estimate.
"""
from __future__ import annotations

import argparse

from dynheads_tl.claims.dynamism import DynamismConfig
from dynheads_tl.claims.irreplaceability import GRID_CONDITIONS
from dynheads_tl.corpus import TraceSettings
from dynheads_tl.engine.sizing import PAPER_MODEL_SHAPES
from dynheads_tl.claims import all_claims

LLAMA = next(shape for shape in PAPER_MODEL_SHAPES if shape.name == "Llama-3.1-8B-Instruct")
HOTPOT_TOKENS = 500  # the synthetic HotpotQA prompts: 499 tokens on average with the embedded model's tokenizer
HOTPOT_STEPS = TraceSettings().hotpot_max_new_tokens  # no preset changes it


class CostModel:
    def __init__(self, bandwidth: float, flops: float, overhead: float, shape=LLAMA):
        self.bandwidth, self.flops, self.overhead, self.shape = bandwidth, flops, overhead, shape

    def prefill(self, tokens: int) -> float:
        s = self.shape
        d_model = s.n_heads * s.head_dim
        return (2 * s.n_params * tokens + 2 * s.n_layers * tokens**2 * d_model) / self.flops

    def forward(self, rows: int, tokens: int) -> float:
        """One decoding step of ``rows`` rows at ``tokens`` context: weights once, and per row the KV cache read,
        the repeated keys and values written and read (eager attention's repeat_kv)."""
        s = self.shape
        repeat = s.n_heads / s.n_kv_heads
        per_row = s.kv_bytes(tokens) * (1 + 2 * repeat)
        return self.overhead + (s.weight_bytes() + rows * per_row) / self.bandwidth

    def batches(self, units: int, batch: int, tokens: int, steps: int, forwards: float = 1.0,
                prompts_per_batch: int | None = None) -> float:
        """GPU-seconds for ``units`` rows decoded ``batch`` at a time. A batch prefills each distinct prompt once:
        ``prompts_per_batch`` of them (default: every row its own prompt)."""
        full, last = divmod(units, batch)
        n_batches = full + (1 if last else 0)
        seconds = (units if prompts_per_batch is None else n_batches * prompts_per_batch) * self.prefill(tokens)
        seconds += full * steps * forwards * self.forward(batch, tokens)
        if last:
            seconds += steps * forwards * self.forward(last, tokens)
        return seconds


def paper_units(cost: CostModel) -> list[tuple[str, int, float]]:
    """(notebook, units, GPU-seconds) of the paper preset."""
    p = {claim.notebook: claim.preset("paper") for claim in all_claims()}
    out = []
    n1 = p["01_dynamism"]
    seeds, steps = len(n1["seeds"]), n1["max_new_tokens"]
    niah = seeds * (n1["n_calibration"] + n1["n_analysis"])
    hotpot = seeds * (n1["n_hotpot"] // 2 + n1["n_hotpot"] + n1["n_hotpot"] // 2)  # calibration, analysis, placebo
    settings = [(context, n1["n_setting"] + n1["n_setting_calibration"])
                for _, context in DynamismConfig(**{"niah_settings": n1["niah_settings"]}).settings]
    traced = n1.get("trace_batch_size", DynamismConfig().trace_batch_size)  # every trace set, in batches
    seconds = (cost.batches(niah, traced, n1["context_tokens"], steps)
               + cost.batches(hotpot, traced, HOTPOT_TOKENS, HOTPOT_STEPS)
               + sum(cost.batches(n, traced, context, steps) for context, n in settings))
    out.append(("01", niah + hotpot + sum(n for _, n in settings), seconds))

    n2 = p["02_irreplaceability"]
    batch, steps, conditions = n2["batch_size"], n2["max_new_tokens"], len(GRID_CONDITIONS)
    seconds, units = 0.0, 0
    # Free and teacher-forced, two passes per step, batched per grid cell (context, depth); a cell's rows are a
    # sample's conditions in turn, so a batch of 4 holds one or two prompts.
    for contexts, depths, task_steps in ((n2["niah_contexts"], n2["niah_depths"], steps),
                                         (n2["hotpot_contexts"], n2["hotpot_depths"], HOTPOT_STEPS)):
        for context in contexts:
            for _ in depths:
                for _ in range(2):  # generated, then teacher-forced
                    cell = n2["runs_per_cell"] * conditions
                    units += cell
                    seconds += cost.batches(cell, batch, context, task_steps, forwards=2, prompts_per_batch=2)
    ks = n2["progressive_k_max"] // n2["progressive_k_step"] + 2  # k = 0, step, ..., max, plus the unmasked run
    units += 2 * n2["n_progressive"] * ks + 2 * n2["n_calibration"]
    seconds += cost.batches(n2["n_progressive"] * ks, batch, n2["progressive_context"], steps, forwards=2,
                            prompts_per_batch=1)
    seconds += cost.batches(n2["n_progressive"] * ks, batch, HOTPOT_TOKENS, HOTPOT_STEPS, forwards=2,
                            prompts_per_batch=1)
    # Calibration samples cycle through the grid's contexts, traced in batches padded to their widest prompt.
    traced = n2.get("trace_batch_size", DynamismConfig().trace_batch_size)
    seconds += cost.batches(n2["n_calibration"], traced, max(n2["niah_contexts"]), steps)
    seconds += cost.batches(n2["n_calibration"], traced, HOTPOT_TOKENS, HOTPOT_STEPS)
    out.append(("02", units, seconds))

    out.append(("03", 0, 0.0))  # reads notebook 01's traces; probe training is not GPU-bound

    n4 = p["04_dynamic_rag"]  # the multi-hop setting trains on notebook 01's HotpotQA traces (cached)
    rag = n4["n_samples"] * 7 + n4["n_rind_calibration"]
    out.append(("04", rag, cost.batches(rag, 1, HOTPOT_TOKENS, n4["max_new_tokens"], forwards=1.5)))

    n5 = p["05_error_signal"]  # its prose settings are notebook 01's (cached); the HotpotQA answers are new
    out.append(("05", n5["n_hotpot"], cost.batches(n5["n_hotpot"], 8, HOTPOT_TOKENS, HOTPOT_STEPS)))

    n6 = p["06_kv_retention"]
    per_sample = 2 + len(n6["budgets"]) * 4 * len(n6["granularities"])
    oracle = len(n6["budgets"]) * len(n6["granularities"])
    units = n6["n_samples"] * per_sample * 2
    seconds = n6["n_samples"] * 2 * (cost.batches(per_sample - oracle, n6["batch_size"], n6["context_tokens"],
                                                  n6["max_new_tokens"], prompts_per_batch=1)
                                     + cost.batches(oracle, n6["batch_size"], n6["context_tokens"], n6["max_new_tokens"],
                                                    forwards=2, prompts_per_batch=1))
    out.append(("06", units, seconds))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidth", type=float, default=2.0e12, help="achieved HBM bytes/s (H100 peak 3.35e12)")
    parser.add_argument("--flops", type=float, default=4.0e14, help="achieved bf16 FLOP/s in the prefill")
    parser.add_argument("--overhead", type=float, default=0.05, help="seconds per forward of the hooked bridge")
    args = parser.parse_args()
    cost = CostModel(args.bandwidth, args.flops, args.overhead)
    rows = paper_units(cost)
    total = sum(seconds for _, _, seconds in rows)
    print(f"ESTIMATE for Llama-3.1-8B-Instruct, bf16; assumed bandwidth {args.bandwidth:.2g} B/s, prefill "
          f"{args.flops:.2g} FLOP/s, {args.overhead} s per forward")
    print("| notebook | units | GPU-hours |")
    print("|---|---|---|")
    for notebook, units, seconds in rows:
        print(f"| {notebook} | {units} | {seconds / 3600:.1f} |")
    print(f"| all | {sum(u for _, u, _ in rows)} | {total / 3600:.1f} |")
    for gpus in (1, 8, 64):
        print(f"{gpus} GPU(s): about {total / 3600 / gpus:.1f} h of wall time if the units spread evenly")
    print("Scaling per decoding step: fixed per forward + linear in rows x context; prefill adds a T^2 term.")


if __name__ == "__main__":
    main()
