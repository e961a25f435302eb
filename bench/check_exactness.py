"""Exactness of the fast decoding path on the default NIAH analysis split, against today's computation.

    python bench/check_exactness.py --n 4          # the first 4 samples of the split, batched and alone
    python bench/check_exactness.py --length 4000 --haystack prose --n 2 --alone   # a long context (notebook 07)
    python bench/check_exactness.py --model gemma-3-270m --length 4000 --n 2 --alone  # the second embedded model

"Today's computation" is the bridge's eager attention without shared prefixes, every key kept on every layer
(``attention_path("eager")``, ``prefix_sharing(False)``, ``bounded_windows(False)``). The fast path is the
default (grouped attention, preallocated cache, shared prefixes, sliding-window layers keeping their window
only). Both trace the same samples, in one batch (as ``collect_traces`` does) and one at a time; the script
prints, per sample, whether tokens, top-1 sources and Eq. 1 sets are identical and the largest difference of the
Eq. 2 scores and hidden states.

With ``--length`` the samples are ``--n`` prompts of ``--length`` context tokens on ``--haystack`` with their needles
at depths spread over the context and the haystack starting at the same place, so a batch shares the haystack up to
its first needle (the rows of one length of notebook 07's grid); the reference prefills each prompt whole with the
eager bridge, which is slow at several thousand tokens (a check to run once, not a test).
"""
from __future__ import annotations

import argparse

import torch

import dynheads_tl
from dynheads_tl import trace_batch, trace_generation
from dynheads_tl.corpus import SEED_OFFSETS, TraceSets
from dynheads_tl.engine.grouped import attention_path
from dynheads_tl.engine.decoder import bounded_windows, prefix_sharing
from dynheads_tl.engine.models import DEFAULT_MODEL, model_name
from dynheads_tl.tasks import make_niah_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4, help="the first N samples of the split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alone", action="store_true", help="also trace each sample alone (slower)")
    parser.add_argument("--length", type=int, default=None,
                        help="context tokens of prompts that share their haystack up to the needle (default: the split)")
    parser.add_argument("--haystack", default="prose", help="the haystack with --length")
    parser.add_argument("--steps", type=int, default=None, help="decoding steps (default: the split's)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="an embedded model's name, a local folder or a hub "
                                                                "id (default: %(default)s)")
    args = parser.parse_args()
    model = dynheads_tl.load_model(args.model, device="cpu")
    sets = TraceSets() if args.steps is None else TraceSets(max_new_tokens=args.steps)
    if args.length is None:
        samples = make_niah_samples(model.tokenizer, n=sets.n_analysis, context_tokens=sets.context_tokens,
                                    seed=SEED_OFFSETS["analysis"] + args.seed, haystack=sets.haystack,
                                    max_new_tokens=sets.max_new_tokens, max_tokens=int(model.cfg.n_ctx))[: args.n]
    else:
        samples = make_niah_samples(model.tokenizer, n=args.n, context_tokens=args.length, seed=args.seed,
                                    haystack=args.haystack, max_new_tokens=sets.max_new_tokens,
                                    max_tokens=int(model.cfg.n_ctx))
    print(f"{len(samples)} samples of {[len(s.prompt_ids) for s in samples]} prompt tokens; model {model_name(model)}")
    config = sets.trace_config("niah")
    runs = {"batched": lambda: trace_batch(model, samples, config)}
    if args.alone:
        runs["alone"] = lambda: [trace_generation(model, s, config) for s in samples]
    print("| mode | sample | tokens | identical tokens | identical top-1 sources | identical Eq. 1 sets | "
          "Eq. 1 marks | max abs Eq. 2 diff | max abs hidden diff |")
    print("|---|---|---|---|---|---|---|---|---|")
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
            print(f"| {mode} | {index} | {a.n_steps} | {same_tokens} | {same_sources} | {same_eq1} | "
                  f"{int(b.retrieval_mask.sum())} | {eq2:.1e} | {hidden:.1e} |", flush=True)


if __name__ == "__main__":
    main()
