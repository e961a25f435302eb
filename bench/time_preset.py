"""One preset's report timed from an empty cache, with a measurement of what else ran: docs/benchmarks.md's rows.

    python bench/time_preset.py --preset long --model gemma-3-270m
    python bench/time_preset.py --preset default --output-dir /tmp/timing-default --keep-cache

Run it from the root of the checkout whose code it times (the run and its notebook kernels import the package from
the working directory, and the commit it records is the working directory's).

The run is one ``dynheads report --preset P --model M --output-dir D`` with ``DYNHEADS_CACHE`` pointed at a new folder
that holds only a link to the model's converted folder in the user's cache (an embedded model; any other model starts
from nothing there), so every notebook computes everything it reports. "On an idle machine" is measured, not assumed:
the CPU time that every process on the machine used during the run (``/proc/stat``) less the run's own (its process
tree's ``rusage``) is the work that ran beside it, printed in CPU-minutes. A machine already busy when the run would
start (more than ``--busy-limit`` of a core over five seconds) is refused unless ``--busy-ok``.

It prints, and writes to ``<output-dir>/timing.json``: the wall minutes, each notebook's minutes from the records
this run wrote into ``runs.json``, the peak resident memory of the run's largest process (``ru_maxrss``), the
CPU-minutes beside it, the commit (with ``+dirty`` when the tree has changes), the CPU model and the UTC start and end.
A run of hours can be stopped and started again with ``--cache DIR --keep-cache`` (the same cache), but then its
minutes are a sum of parts, which ``timing.json`` says (``resumed``: the cache held result entries when it started).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dynheads_tl.engine.models import EMBEDDED_MODELS, link_converted_models
from dynheads_tl.report.results import read_runs
from dynheads_tl.report.runner import cache_entries
from dynheads_tl.store import cache_dir

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (idle and iowait are not work)


def busy_seconds() -> float:
    """CPU-seconds of work every core has done since boot (``/proc/stat``'s first line)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(fields[i]) for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def busy_now(seconds: float = 5.0) -> float:
    """How many cores' worth of work ran over the next ``seconds`` (0.0: idle; 1.0: one core busy)."""
    before = busy_seconds()
    time.sleep(seconds)
    return (busy_seconds() - before) / seconds


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True)
    return (head.stdout.strip() or "unknown") + ("+dirty" if dirty.stdout.strip() else "")


def fresh_cache(folder: Path, model: str) -> Path:
    """``folder`` (new) holding a link to ``model``'s converted folder in the user's cache, when it is an embedded
    model; a clear error when it is embedded and the user's cache lacks it."""
    if model in EMBEDDED_MODELS and not link_converted_models(folder, [model]):
        raise SystemExit(f"{model} is not installed in {cache_dir()}: run `dynheads install-model --name {model}` "
                         "first, so that the timing does not include its conversion.")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="an embedded model's name (its converted folder is linked), a local folder or a hub id")
    parser.add_argument("--only", default=None, help="one notebook only (dynheads report --only)")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="where the report goes (default: runs/timing/<preset>/<model>/ under the working directory, "
                             "git-ignored)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="the cache folder to use (default: a new temporary folder, removed afterwards)")
    parser.add_argument("--keep-cache", action="store_true", help="leave the cache folder (to resume or inspect)")
    parser.add_argument("--busy-limit", type=float, default=0.2,
                        help="refuse to start when more than this many cores' worth of work runs already")
    parser.add_argument("--busy-ok", action="store_true", help="start even on a busy machine (the row then says so)")
    args = parser.parse_args()
    if args.busy_limit < 0:
        parser.error(f"--busy-limit must be >= 0, got {args.busy_limit}")
    if not Path("/proc/stat").is_file():
        parser.error("this script reads /proc/stat (Linux) to measure what else runs")
    return args


def main() -> None:
    args = _parse()
    output = (args.output_dir or Path("runs") / "timing" / args.preset / Path(args.model).name).resolve()
    cache = fresh_cache(args.cache or Path(tempfile.mkdtemp(prefix="dynheads-timing-cache-")), args.model)
    os.environ["DYNHEADS_CACHE"] = str(cache)  # for cache_entries here and for the run
    entries = cache_entries()
    busy = busy_now()
    if busy > args.busy_limit and not args.busy_ok:
        raise SystemExit(f"{busy:.2f} cores' worth of work is running already (limit {args.busy_limit}); stop it "
                         "(`ps aux --sort=-%cpu | head`) or pass --busy-ok, and the row will say the run was not idle.")
    command = [sys.executable, "-m", "dynheads_tl.report.cli", "report", "--preset", args.preset, "--model",
               args.model, "--output-dir", str(output)] + (["--only", args.only] if args.only else [])
    print(f"Timing `dynheads {' '.join(command[3:])}` on the cache {cache} ({entries} result entries at the start; "
          f"{busy:.2f} cores busy before it)", flush=True)
    earlier = read_runs(output)  # a reused folder's records of earlier runs are not this run's minutes
    started, wall0, busy0 = datetime.datetime.now(datetime.timezone.utc), time.time(), busy_seconds()
    try:
        code = subprocess.run(command).returncode
    finally:
        wall, beside_run = time.time() - wall0, busy_seconds() - busy0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process of the run, waited for
        if not (args.keep_cache or args.cache):
            shutil.rmtree(cache, ignore_errors=True)  # the link is removed, never followed
    runs = {stem: run for stem, run in read_runs(output).items() if earlier.get(stem) != run}
    own = usage.ru_utime + usage.ru_stime
    row = {"preset": args.preset, "model": args.model, "commit": commit(), "cpu": cpu_model(),
           "cores": os.cpu_count(), "start_utc": started.strftime("%Y-%m-%d %H:%M"),
           "end_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
           "wall_minutes": round(wall / 60, 1), "exit_code": code,
           "notebooks": {stem: run.get("minutes") for stem, run in sorted(runs.items())},
           "computed": {stem: run.get("computed") for stem, run in sorted(runs.items())},
           "peak_resident_gb": round(usage.ru_maxrss / 1024 ** 2, 1),  # ru_maxrss is in KiB on Linux
           "run_cpu_minutes": round(own / 60, 1),
           "beside_cpu_minutes": round(max(beside_run - own, 0.0) / 60, 1), "busy_at_start": round(busy, 2),
           "resumed": entries > 0}
    output.mkdir(parents=True, exist_ok=True)
    (output / "timing.json").write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row, indent=1))
    parts = " | ".join(f"{stem[:2]} {minutes}" for stem, minutes in row["notebooks"].items())
    print(f"\n| {row['start_utc']}-{row['end_utc'][-5:]} | {row['commit']} | **{row['wall_minutes']}** | {parts} | "
          f"{row['cpu']}, {row['cores']} cores; peak resident {row['peak_resident_gb']} GB; "
          f"{row['beside_cpu_minutes']} CPU-min beside it{'; resumed from a cache with results' * row['resumed']} |")
    sys.exit(code)


if __name__ == "__main__":
    main()
