"""Notebook 00's parameters."""
from __future__ import annotations

from dynheads_tl.config import ModelSettings, NotebookConfig, check_model_sizes
from dynheads_tl.engine.preflight import model_context_window
from dynheads_tl.params import compose, integer, param
from dynheads_tl.tasks import check_context_fits

__all__ = ["InspectConfig"]


def _depth(name: str, value) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"Parameter {name!r} must be a fraction in [0, 1], got {value!r}.")


@compose(ModelSettings)
class InspectConfig(NotebookConfig):
    """Notebook 00's parameters, validated."""

    context_tokens: int = param(200, "NIAH context length (short: every attention row is kept)", integer())
    depth: float = param(0.5, "needle depth as a fraction of the context", _depth)
    seed: int = param(0, "seeds the needle's UUID", integer(0))
    max_new_tokens: int = param(32, "decoding steps", integer())
    step: int = param(-1, "decoding step shown head by head; -1 picks the step with most retrieval heads", integer(-1))
    n_view_heads: int = param(12, "heads per circuitsvis view (each head adds 20 px of tooltip room below the text)", integer())
    output_dir: str = param("runs/notebooks", "where the static figures are written (the runner passes its own)")

    def context_lengths(self) -> dict[str, list[int]]:
        return {"NIAH": [self.context_tokens]}

    def check_inputs(self) -> None:
        """The context against the model's window (every attention row is kept, so it must stay short)."""
        check_context_fits(self.context_tokens, self.max_new_tokens, model_context_window(self.model),
                           name="context_tokens")
        if self.context_tokens > 2000:
            raise ValueError(f"Parameter 'context_tokens' must be at most 2000 here (every head's full attention row "
                             f"is kept at every step), got {self.context_tokens}.")
        check_model_sizes(self.model, heads={"n_view_heads": self.n_view_heads},
                          contexts={"context_tokens": self.context_tokens})
