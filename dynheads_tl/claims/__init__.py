"""One folder per notebook, named after it (``claims/<name>/`` for ``notebooks/NN_<name>.ipynb``): its config, its
pipeline and its report part (verdict sentences, index rows with the paper's numbers, presets), exporting one
declared :class:`~dynheads_tl.claim.Claim` as ``CLAIM``. Claims never import claims; what two claims share lives
below (:mod:`dynheads_tl.corpus`, :mod:`dynheads_tl.analysis`, :mod:`dynheads_tl.protocols`).

The report layer iterates over :func:`all_claims`: adding a notebook is its folder here and one line in
:data:`CLAIM_PACKAGES`.
"""
from __future__ import annotations

import importlib

# The declared claims, in notebook order (each package exports CLAIM).
CLAIM_PACKAGES = [
    "dynheads_tl.claims.inspect_attention",
    "dynheads_tl.claims.dynamism",
    "dynheads_tl.claims.irreplaceability",
    "dynheads_tl.claims.correlation",
    "dynheads_tl.claims.dynamic_rag",
    "dynheads_tl.claims.error_signal",
    "dynheads_tl.claims.kv_retention",
]


def all_claims() -> list:
    """Every declared claim (imported on first use, so importing this package loads no claim)."""
    claims = [importlib.import_module(package).CLAIM for package in CLAIM_PACKAGES]
    stems = [claim.notebook for claim in claims]
    if len(set(stems)) != len(stems):
        raise ValueError(f"Two claims declare the same notebook: {sorted(stems)}.")
    return claims


def claim_for(notebook: str):
    """The claim whose notebook stem is ``notebook`` (``"02_irreplaceability"``)."""
    for claim in all_claims():
        if claim.notebook == notebook:
            return claim
    raise ValueError(f"Notebook {notebook!r} has no declared claim; add its package (exporting CLAIM) to "
                     "dynheads_tl.claims.CLAIM_PACKAGES.")
