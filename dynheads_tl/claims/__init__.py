"""One folder per notebook, named after it (``claims/<name>/`` for ``notebooks/NN_<name>.ipynb``): its config, its
pipeline and its report part (verdict sentences, index rows with the paper's numbers, presets), exporting one
declared :class:`~dynheads_tl.claim.Claim` as ``CLAIM``. Claims never import claims; what two claims share lives
below (:mod:`dynheads_tl.corpus`, :mod:`dynheads_tl.analysis`, :mod:`dynheads_tl.protocols`).

The report layer iterates over :func:`all_claims`, which finds the folders itself: adding a notebook is its
folder here (exporting ``CLAIM``) and the notebook, nothing else. The wheel finds the folder too (``setup.py``
lists every package under ``dynheads_tl``).
"""
from __future__ import annotations

import importlib
import pkgutil


def claim_packages() -> list[str]:
    """The module names of every claim folder under this package (each one a subpackage exporting CLAIM)."""
    return [f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__) if info.ispkg]


def all_claims() -> list:
    """Every declared claim, in notebook order (imported on first use, so importing this package loads no claim)."""
    claims = []
    for package in claim_packages():
        module = importlib.import_module(package)
        if not hasattr(module, "CLAIM"):
            raise ValueError(f"Claim folder {package} exports no CLAIM; declare its "
                             "dynheads_tl.claim.Claim as CLAIM in its __init__.py.")
        claims.append(module.CLAIM)
    stems = [claim.notebook for claim in claims]
    if len(set(stems)) != len(stems):
        raise ValueError(f"Two claims declare the same notebook: {sorted(stems)}.")
    return sorted(claims, key=lambda claim: claim.notebook)


def claim_for(notebook: str):
    """The claim whose notebook stem is ``notebook`` (``"02_irreplaceability"``)."""
    for claim in all_claims():
        if claim.notebook == notebook:
            return claim
    raise ValueError(f"Notebook {notebook!r} has no declared claim; add its folder under dynheads_tl/claims/ "
                     "with an __init__.py that exports CLAIM.")
