"""Exactness of the fast decoding path against a reference computation.

    python bench/check_exactness.py --n 4          # the first 4 samples of the split, batched and alone
    python bench/check_exactness.py --length 4000 --haystack prose --n 2 --alone   # a long context (notebook 07)
    python bench/check_exactness.py --model gemma-3-270m --length 4000 --n 2 --alone  # the second embedded model
    python bench/check_exactness.py --model gemma-3-270m --many 8 --lengths 1000 2000 3000 4000 \\
        --haystacks prose filler --reference transformers --capability avx2   # many prompts, independent reference

Two references:

- ``--reference bridge`` (the default) is "today's computation": the bridge's eager attention without shared
  prefixes, every key kept on every layer (``attention_path("eager")``, ``prefix_sharing(False)``,
  ``bounded_windows(False)``). The fast path is the default (grouped attention, preallocated cache, shared
  prefixes, sliding-window layers keeping their window only). Both trace the same samples, in one batch (as
  ``collect_traces`` does) and, with ``--alone``, one at a time; the script prints, per sample, whether tokens, top-1
  sources and Eq. 1 sets are identical and the largest difference of the Eq. 2 scores and hidden states.
- ``--reference transformers`` is independent of the suite: plain ``transformers`` (eager attention, float32), one
  forward over the prompt and the fast path's own tokens, every attention row of the decoding steps read from the
  attention modules' outputs. Per sample it prints whether the greedy tokens agree (the reference's argmax at each
  step), and how many head-steps' top-1 sources and Eq. 1 marks differ. Every differing head-step is then
  classified by the reference's own attention row: a **tie** when the weight the reference gives the fast path's
  source is within ``--tie`` (relative) of the weight of its own top-1 (two keys the reference itself cannot tell
  apart at float32 precision), otherwise a **difference**, listed with layer, head, step, both sources and weights.

With ``--length`` the samples are ``--n`` prompts of ``--length`` context tokens on ``--haystack`` with their needles
at depths spread over the context and the haystack starting at the same place, so a batch shares the haystack up to
its first needle (the rows of one length of notebook 07's grid). With ``--many N`` they are N prompts for every
length of ``--lengths`` and haystack of ``--haystacks``, needles at depths spread over the context and the haystack
starting at a random offset per prompt; each (length, haystack) is one batch. The references prefill each prompt
whole, which is slow at several thousand tokens (a check to run once, not a test).

``--capability`` runs the whole check under one of torch's CPU kernel sets (``ATEN_CPU_CAPABILITY``: ``default``,
``avx2``, ``avx512``; the script starts itself again with it set), so a machine with AVX-512 shows what an
AVX2-only machine computes.
"""
from __future__ import annotations

import argparse
import os
import sys

CAPABILITIES = ("native", "default", "avx2", "avx512")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4, help="the first N samples of the split, or N prompts with --length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alone", action="store_true", help="also trace each sample alone (slower)")
    parser.add_argument("--length", type=int, default=None,
                        help="context tokens of prompts that share their haystack up to the needle (default: the split)")
    parser.add_argument("--haystack", default="prose", help="the haystack with --length")
    parser.add_argument("--many", type=int, default=None, metavar="N",
                        help="N prompts for every length of --lengths and haystack of --haystacks")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 2000, 3000, 4000])
    parser.add_argument("--haystacks", nargs="+", default=["prose", "filler"])
    parser.add_argument("--steps", type=int, default=None, help="decoding steps (default: the split's)")
    parser.add_argument("--model", default=None, help="an embedded model's name, a local folder or a hub id "
                                                      "(default: the default embedded model)")
    parser.add_argument("--reference", choices=("bridge", "transformers"), default="bridge")
    parser.add_argument("--tie", type=float, default=1e-5,
                        help="relative weight gap under which a differing top-1 source is a tie (default: %(default)s)")
    parser.add_argument("--capability", choices=CAPABILITIES, default="native",
                        help="torch's CPU kernels (ATEN_CPU_CAPABILITY); native: what torch picks for this CPU")
    args = parser.parse_args()
    for name in ("n", "many", "steps", "length"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
    if any(length < 1 for length in args.lengths):
        parser.error(f"--lengths must be positive, got {args.lengths}")
    if not args.tie > 0:
        parser.error(f"--tie must be positive, got {args.tie}")
    if args.many is not None and args.length is not None:
        parser.error("give --many (with --lengths) or --length, not both")
    return args


def _with_capability(args: argparse.Namespace) -> None:
    """Start again under ``ATEN_CPU_CAPABILITY`` when asked (torch reads it once, at import)."""
    wanted = "" if args.capability == "native" else args.capability
    if os.environ.get("ATEN_CPU_CAPABILITY", "") != wanted:
        env = dict(os.environ)
        env.pop("ATEN_CPU_CAPABILITY", None)
        if wanted:
            env["ATEN_CPU_CAPABILITY"] = wanted
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main() -> None:
    args = _parse()
    _with_capability(args)
    import torch

    import dynheads_tl
    from dynheads_tl.corpus import SEED_OFFSETS, TraceSets
    from dynheads_tl.engine.models import DEFAULT_MODEL, model_name
    from dynheads_tl.tasks import make_niah_samples

    torch.set_grad_enabled(False)
    name = args.model or DEFAULT_MODEL
    model = dynheads_tl.load_model(name, device="cpu")
    print(f"model {model_name(model)}; torch CPU kernels: {torch.backends.cpu.get_cpu_capability()}", flush=True)
    sets = TraceSets() if args.steps is None else TraceSets(max_new_tokens=args.steps)
    config = sets.trace_config("niah")
    limit = int(model.cfg.n_ctx)
    if args.many is not None:
        batches = [(f"{length} tokens, {haystack}",
                    make_niah_samples(model.tokenizer, n=args.many, context_tokens=length, haystack=haystack,
                                      seed=args.seed + 1000 * index, max_new_tokens=sets.max_new_tokens,
                                      max_tokens=limit, random_layout=False,
                                      haystack_offset=(97 * index) % 2000))
                   for index, (length, haystack) in enumerate(
                       (length, haystack) for length in args.lengths for haystack in args.haystacks)]
    elif args.length is None:
        batches = [("split", make_niah_samples(
            model.tokenizer, n=sets.n_analysis, context_tokens=sets.context_tokens, seed=SEED_OFFSETS["analysis"]
            + args.seed, haystack=sets.haystack, max_new_tokens=sets.max_new_tokens, max_tokens=limit)[: args.n])]
    else:
        batches = [(f"{args.length} tokens, {args.haystack}", make_niah_samples(
            model.tokenizer, n=args.n, context_tokens=args.length, seed=args.seed, haystack=args.haystack,
            max_new_tokens=sets.max_new_tokens, max_tokens=limit))]
    if args.reference == "bridge":
        _against_bridge(model, batches, config, args.alone)
    else:
        _against_transformers(model, name, batches, config, args.alone, args.tie)


def _against_bridge(model, batches, config, alone: bool) -> None:
    import torch

    from dynheads_tl import trace_batch, trace_generation
    from dynheads_tl.engine.decoder import bounded_windows, prefix_sharing
    from dynheads_tl.engine.grouped import attention_path

    print("| mode | prompts | sample | tokens | identical tokens | identical top-1 sources | identical Eq. 1 sets | "
          "Eq. 1 marks | max abs Eq. 2 diff | max abs hidden diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, samples in batches:
        runs = {"batched": lambda: trace_batch(model, samples, config)}
        if alone:
            runs["alone"] = lambda: [trace_generation(model, s, config) for s in samples]
        for mode, run in runs.items():
            fast = run()
            with attention_path("eager"), prefix_sharing(False), bounded_windows(False):
                today = run()
            for index, (a, b) in enumerate(zip(fast, today)):
                same_tokens = torch.equal(a.tokens, b.tokens)
                same_sources = same_tokens and torch.equal(a.argmax_pos, b.argmax_pos)
                same_eq1 = same_tokens and torch.equal(a.retrieval_mask, b.retrieval_mask)
                eq2 = (a.support_score - b.support_score).abs().max().item() if same_tokens else float("nan")
                hidden = (a.hidden - b.hidden).abs().max().item() if same_tokens else float("nan")
                print(f"| {mode} | {label} | {index} | {a.n_steps} | {same_tokens} | {same_sources} | {same_eq1} | "
                      f"{int(b.retrieval_mask.sum())} | {eq2:.1e} | {hidden:.1e} |", flush=True)


def reference_rows(reference, prompt_ids, tokens):
    """Every decoding step's attention row of every layer and head, [step, layer, head, key], from ONE eager
    forward of ``reference`` (plain transformers) over the prompt and ``tokens`` but the last; also the logits of
    those steps. The rows are taken from each attention module's output as it runs, so only the decoding steps'
    query rows are kept (the whole [query, key] weights of one layer exist one layer at a time)."""
    import torch

    ids = torch.cat([prompt_ids, tokens[:-1]])[None]
    start = len(prompt_ids) - 1
    kept: list = []

    def keep(module, inputs, output):
        kept.append(output[1][0, :, start:, :].clone())
        return (output[0], None) + tuple(output[2:])

    layers = reference.model.layers
    handles = [layer.self_attn.register_forward_hook(keep) for layer in layers]
    try:
        logits = reference(ids).logits[0, start:]
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(kept).permute(2, 0, 1, 3), logits  # [layer, head, step, key] -> [step, layer, head, key]


def independent_eq1(rows, prompt_ids, tokens, spans):
    """Eq. 1 from the reference's rows: the top-1 key lies in an evidence span and holds the step's token."""
    import torch

    top = rows.argmax(-1)  # [step, layer, head]
    ids = torch.cat([prompt_ids, tokens])
    inside = torch.zeros(len(ids), dtype=torch.bool)
    for start, end in spans:
        inside[start:end] = True
    return top, inside[top] & (ids[top] == tokens[:, None, None])


def _against_transformers(model, name: str, batches, config, alone: bool, tie: float) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from dynheads_tl import trace_batch, trace_generation
    from dynheads_tl.engine.models import embedded_model_dir, resolve_model_source
    from dynheads_tl.engine.models import EMBEDDED_MODELS

    folder = str(embedded_model_dir(name)) if name in EMBEDDED_MODELS else resolve_model_source(name)
    reference = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    print("| mode | prompts | sample | prompt tokens | steps | greedy tokens agree | head-steps | differing top-1 "
          "| of them ties | differing Eq. 1 | of them ties | Eq. 1 marks |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    totals = {"head_steps": 0, "top1": 0, "top1_ties": 0, "eq1": 0, "eq1_ties": 0, "prompts": 0, "greedy": 0}
    differences = []
    for label, samples in batches:
        runs = {"batched": lambda: trace_batch(model, samples, config)}
        if alone:
            runs["alone"] = lambda: [trace_generation(model, s, config) for s in samples]
        for mode, run in runs.items():
            for index, trace in enumerate(run()):
                prompt = trace.prompt_ids.long()
                tokens = trace.tokens.long()
                rows, logits = reference_rows(reference, prompt, tokens)
                greedy = bool(torch.equal(logits.argmax(-1), tokens))
                top, eq1 = independent_eq1(rows, prompt, tokens, trace.evidence_spans)
                fast_top, fast_eq1 = trace.argmax_pos.long(), trace.retrieval_mask
                differ = top != fast_top
                best = rows.gather(-1, top[..., None])[..., 0]
                theirs = rows.gather(-1, fast_top[..., None].clamp(max=rows.shape[-1] - 1))[..., 0]
                is_tie = (best - theirs).abs() <= tie * best.abs()
                eq1_differ = eq1 != fast_eq1
                totals["head_steps"] += differ.numel()
                totals["top1"] += int(differ.sum())
                totals["top1_ties"] += int((differ & is_tie).sum())
                totals["eq1"] += int(eq1_differ.sum())
                totals["eq1_ties"] += int((eq1_differ & is_tie).sum())
                totals["prompts"] += 1
                totals["greedy"] += greedy
                for step, layer, head in (differ & ~is_tie).nonzero().tolist():
                    differences.append((mode, label, index, step, layer, head, int(top[step, layer, head]),
                                        int(fast_top[step, layer, head]), float(best[step, layer, head]),
                                        float(theirs[step, layer, head])))
                print(f"| {mode} | {label} | {index} | {len(prompt)} | {len(tokens)} | {greedy} | {differ.numel()} | "
                      f"{int(differ.sum())} | {int((differ & is_tie).sum())} | {int(eq1_differ.sum())} | "
                      f"{int((eq1_differ & is_tie).sum())} | {int(eq1.sum())} |", flush=True)
    print(f"\nIn all: {totals['prompts']} traces, greedy tokens agree on {totals['greedy']}; "
          f"{totals['top1']} of {totals['head_steps']} head-steps' top-1 sources differ ({totals['top1_ties']} ties "
          f"within {tie:g} relative); {totals['eq1']} Eq. 1 marks differ ({totals['eq1_ties']} of them ties).")
    if differences:
        print("\nHead-steps whose top-1 sources differ beyond a tie (reference weights at both sources):")
        print("| mode | prompts | sample | step | layer | head | reference source | fast source | weight there | "
              "weight at fast's |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for row in differences[:200]:
            print("| " + " | ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in row) + " |")


if __name__ == "__main__":
    main()
