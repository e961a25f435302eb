"""The Ray backend's overhead against the local one, for the same smoke run of a notebook.

    python bench/bench_backends.py                    # notebook 01's smoke preset, local then ray, twice
    python bench/bench_backends.py --only 02 --repeats 1

Each run is ``dynheads report --preset smoke --only NN -p use_cache=False`` (nothing read from the cache) with
``--backend local`` or ``--backend ray`` (a local Ray cluster of this machine's CPUs, one actor per CPU, each with
one torch thread and its own copy of the model), into a temporary folder. Runs alternate between the backends
and the minimum wall time per backend is kept, so the ratio is comparable on a noisy machine. The ray time
includes starting the cluster and loading the model in every actor.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def run(only: str, backend: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "dynheads_tl.report.cli", "report", "--preset", "smoke", "--only", only,
                   "--backend", backend, "--output-dir", out, "-p", "use_cache=False"]
        started = time.time()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="01", help="the notebook (a prefix dynheads report accepts)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"local": [], "ray": []}
    for repeat in range(args.repeats):
        for backend in times:
            times[backend].append(run(args.only, backend))
            print(f"repeat {repeat + 1}, {backend}: {times[backend][-1] / 60:.2f} min", flush=True)
    best = {backend: min(values) for backend, values in times.items()}
    print(f"notebook {args.only} smoke, {os.cpu_count()} CPUs: local {best['local'] / 60:.2f} min, "
          f"ray {best['ray'] / 60:.2f} min, ray / local = {best['ray'] / best['local']:.2f} "
          f"(minimum of {args.repeats} alternating runs each)")


if __name__ == "__main__":
    main()
