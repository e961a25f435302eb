"""What a report run shows on the terminal besides its own lines: the cache's heal warnings and the kernel's own stderr
(repeated after a notebook) and the notebooks' progress lines (while a notebook runs). A kernel's output otherwise
lands only in its executed notebook."""
from __future__ import annotations

import re
import sys
import tempfile
import threading
from pathlib import Path

import nbformat
from tqdm import tqdm

from dynheads_tl.store import HEAL_PREFIX


def heal_warnings(executed: Path) -> list[str]:
    """The cache's heal warnings (:data:`~dynheads_tl.store.HEAL_PREFIX` lines) in an executed notebook's output."""
    try:
        nb = nbformat.read(executed, as_version=4)
    except (OSError, ValueError):
        return []
    lines = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                lines += [match.group(1) for line in output.get("text", "").splitlines()
                          if (match := _HEAL_LINE.match(line.strip()))]
    return lines


# A heal warning as the kernel prints it: bare (Python's last-resort handler), or behind the default logging format's
# "LEVEL:logger:" (once any library has called logging.warning(), which installs a root handler in the kernel).
_HEAL_LINE = re.compile(rf"^(?:[A-Z]+:[\w.]+:)?({re.escape(HEAL_PREFIX)}.*)$")


def repeat_heal_warnings(executed: Path) -> None:
    """Print the notebook's heal warnings on the terminal too (a kernel's log lands only in its notebook)."""
    for line in heal_warnings(executed):
        print(f"{executed.stem}: {line}", file=sys.stderr, flush=True)


def repeat_kernel_log(log, stem: str) -> None:
    """Print what a notebook's kernel wrote on its own stderr (the file
    :func:`~dynheads_tl.report.runner.ipc_kernel_manager` sends it to), each line after the notebook's name."""
    log.seek(0)
    for line in log.read().decode("utf-8", errors="replace").splitlines():
        if line.strip():
            print(f"{stem} kernel: {line}", file=sys.stderr, flush=True)


class ProgressRelay:
    """Prints on the terminal, while a notebook runs, the lines its kernel appends to a progress file
    (:mod:`dynheads_tl.progress`'s ``file`` form), each after the notebook's name and above papermill's cell bar:
    a cell that computes for minutes shows its units moving."""

    def __init__(self, stem: str):
        with tempfile.NamedTemporaryFile(prefix="dynheads-progress-", suffix=".log", delete=False) as handle:
            self.path = handle.name
        self.stem, self.offset = stem, 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "ProgressRelay":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(5)
        self._relay()
        Path(self.path).unlink(missing_ok=True)

    def _watch(self) -> None:
        while not self.stopping.wait(0.5):
            self._relay()

    def _relay(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            tqdm.write(f"  {self.stem}: {line}", file=sys.stderr)
