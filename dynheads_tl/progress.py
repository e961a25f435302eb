"""Progress for long work, shown only where work happens and in a form that suits where it runs.

Three places need three forms:

- a terminal (a script, ``python -c``): a ``tqdm`` bar on stderr;
- an interactive notebook with ``ipywidgets``: ``tqdm``'s widget bar;
- a batch run under ``dynheads report`` (papermill), or a kernel without ``ipywidgets``: a few plain
  lines on stdout (a start line, one about every quarter, an end line with the time). A bar there would
  be saved into the executed notebook as hundreds of carriage-return refreshes, or as a red
  ``TqdmWarning: IProgress not found``.

``DYNHEADS_PROGRESS`` forces one form: ``bar``, ``plain`` or ``off`` (``dynheads report`` sets ``plain``
for the notebooks it runs). A loop over nothing shows nothing, so work read back from the cache leaves
no bars stuck at ``0/N``: callers pass only the items that still have to be computed.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator, Literal, TypeVar

T = TypeVar("T")
Mode = Literal["bar", "plain", "off"]
MODES = ("bar", "plain", "off")


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
    return _plain(items, desc, total)


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
