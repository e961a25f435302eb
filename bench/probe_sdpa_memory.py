"""Does PyTorch's SDPA hold a [heads, queries, keys] score matrix on this machine? Peak resident memory of one call.

    python bench/probe_sdpa_memory.py                              # 14 heads (Qwen2.5-0.5B), 1,024 x 8,192
    python bench/probe_sdpa_memory.py --heads 4 --queries 4096 --keys 32768

Each mask kind (none, a float mask, a boolean mask of the prefill's [queries, keys] shape) runs in a fresh process,
one thread, float32; the line gives the rise of the process's peak resident memory over the call beside the size
the scores alone would take. A rise far below that size means the kernel tiles the keys (flash-style) and never
holds the matrix: then a long prefill's peak comes from elsewhere.
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys

import torch

MASKS = ("none", "float", "bool")


def one_call(heads: int, queries: int, keys: int, mask: str, head_dim: int = 64) -> float:
    """The peak resident memory rise (MiB) of one SDPA call with inputs already allocated."""
    torch.set_num_threads(1)
    q = torch.randn(1, heads, queries, head_dim)
    k, v = torch.randn(1, heads, keys, head_dim), torch.randn(1, heads, keys, head_dim)
    attn_mask = {"none": None, "float": torch.zeros(1, 1, queries, keys),
                 "bool": torch.ones(1, 1, queries, keys, dtype=torch.bool)}[mask]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--keys", type=int, default=8192)
    parser.add_argument("--one", choices=MASKS, help=argparse.SUPPRESS)  # the child process's single call
    args = parser.parse_args()
    if args.one:
        print(one_call(args.heads, args.queries, args.keys, args.one))
        return
    scores = args.heads * args.queries * args.keys * 4 / 2**20
    print(f"torch {torch.__version__}; {args.heads} heads x {args.queries} queries x {args.keys} keys: the scores "
          f"alone would be {scores:.0f} MiB")
    print("| mask | peak rise MiB | scores MiB |\n|---|---|---|")
    for mask in MASKS:
        out = subprocess.run([sys.executable, __file__, "--heads", str(args.heads), "--queries", str(args.queries),
                              "--keys", str(args.keys), "--one", mask], capture_output=True, text=True, check=True)
        print(f"| {mask} | {float(out.stdout.strip()):.0f} | {scores:.0f} |")


if __name__ == "__main__":
    main()
