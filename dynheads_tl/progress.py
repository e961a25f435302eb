"""Progress for long work, shown only where work happens and in a form that suits where it runs.

Three places need three forms:

- a terminal (a script, ``python -c``): a ``tqdm`` bar on stderr;
- an interactive notebook with ``ipywidgets``: ``tqdm``'s widget bar;
- a batch run under ``dynheads report`` (papermill), or a kernel without ``ipywidgets``: a few plain
  lines on stdout (a start line, one about every quarter, an end line with the time). A bar there would
  be saved into the executed notebook as hundreds of carriage-return refreshes, or as a red
  ``TqdmWarning: IProgress not found``.

``DYNHEADS_PROGRESS`` forces one form: ``bar``, ``plain``, ``off`` or ``file``: plain lines appended to the file
``DYNHEADS_PROGRESS_FILE`` instead of the output, one after an item at most every :data:`FILE_EVERY_S` seconds (``DYNHEADS_PROGRESS_EVERY_S`` sets another).
``dynheads report`` sets ``file`` for the notebooks it runs and prints the file's new lines on the terminal while
the notebook runs, so a cell that computes for minutes shows its progress there and none in the executed notebook.
A loop over nothing shows nothing, so work read back from the cache leaves no bars stuck at ``0/N``: callers pass
only the items that still have to be computed.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator, Literal, TypeVar

T = TypeVar("T")
Mode = Literal["bar", "plain", "off", "file"]
MODES = ("bar", "plain", "off", "file")
FILE_ENV = "DYNHEADS_PROGRESS_FILE"
FILE_EVERY_S = 5.0  # file mode: at most one line per this many seconds (and always the first and the last) ...
EVERY_ENV = "DYNHEADS_PROGRESS_EVERY_S"  # ... unless this sets another number of seconds


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None  # type: ignore[union-attr]
    except Exception:  # pragma: no cover - unusual IPython installs
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _has_widgets() -> bool:
    import importlib.util

    return importlib.util.find_spec("ipywidgets") is not None


def progress_mode() -> Mode:
    """The form progress takes here (see the module docstring)."""
    forced = os.environ.get("DYNHEADS_PROGRESS", "").strip().lower()
    if forced:
        if forced not in MODES:
            raise ValueError(f"DYNHEADS_PROGRESS must be one of {list(MODES)}, got {forced!r}.")
        return forced  # type: ignore[return-value]
    if _in_kernel():
        return "bar" if _has_widgets() else "plain"
    return "bar"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def progress(items: Iterable[T], *, desc: str, total: int | None = None) -> Iterator[T]:
    """Iterate over ``items`` while showing progress; nothing is shown when there are no items."""
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    total = len(items) if total is None else total  # type: ignore[arg-type]
    if total == 0:
        return iter(())
    mode = progress_mode()
    if mode == "bar":
        from tqdm.auto import tqdm

        return iter(tqdm(items, desc=desc, total=total, leave=False))
    if mode == "off":
        return iter(items)
    if mode == "file":
        return _to_file(items, desc, total, os.environ.get(FILE_ENV, ""))
    return _plain(items, desc, total)


def note(text: str) -> None:
    """One line on what a long step without items to count is doing (converting a model), where progress goes: on
    stderr in a terminal (``bar``), appended to ``DYNHEADS_PROGRESS_FILE`` under ``dynheads report`` (``file``, so
    it reaches the terminal and not the executed notebook), on stdout in a kernel's plain form; nothing with
    ``off``."""
    mode = progress_mode()
    if mode == "bar":
        print(text, file=sys.stderr, flush=True)
    elif mode == "plain":
        print(text, flush=True)
    elif mode == "file" and os.environ.get(FILE_ENV, ""):
        with open(os.environ[FILE_ENV], "a", encoding="utf-8") as handle:
            handle.write(text + "\n")


def _to_file(items: Iterable[T], desc: str, total: int, path: str) -> Iterator[T]:
    """Plain lines appended to ``path`` (nothing when none is set): a start line, one after an item when
    :data:`FILE_EVERY_S` have passed since the last line, and an end line."""
    def line(text: str) -> None:
        if path:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")

    try:
        every = float(os.environ.get(EVERY_ENV, FILE_EVERY_S))
    except ValueError:
        raise ValueError(f"{EVERY_ENV} must be a number of seconds, got {os.environ[EVERY_ENV]!r}.") from None
    started = last = time.time()
    line(f"{desc}: {total} to compute")
    done = 0
    for item in items:
        yield item
        done += 1
        now = time.time()
        if done < total and now - last >= every:
            last = now
            elapsed = now - started
            line(f"{desc}: {done}/{total} after {_minutes(elapsed)}, about {_minutes(elapsed / done * (total - done))} "
                 "left")
    line(f"{desc}: {done}/{total} done in {_minutes(time.time() - started)}")


def _plain(items: Iterable[T], desc: str, total: int) -> Iterator[T]:
    started = time.time()
    print(f"{desc}: {total} to compute", flush=True)
    marks = {max(1, round(total * q)) for q in (0.25, 0.5, 0.75)} - {total}
    done = 0
    for item in items:
        yield item
        done += 1
        if done in marks:
            elapsed = time.time() - started
            left = elapsed / done * (total - done)
            print(f"{desc}: {done}/{total} after {_minutes(elapsed)}, about {_minutes(left)} left", flush=True)
    print(f"{desc}: {done}/{total} done in {_minutes(time.time() - started)}", flush=True)
