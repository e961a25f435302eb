"""Notebook 00's parameters."""
from __future__ import annotations

from dataclasses import dataclass

from dynheads_tl.config import DeviceSettings, NotebookConfig, check_ints, check_model_sizes

__all__ = ["InspectConfig"]


@dataclass
class InspectConfig(DeviceSettings, NotebookConfig):
    """Notebook 00's parameters, validated. Field comments are in the notebook."""

    model: str = "smollm2-135m-instruct"
    context_tokens: int = 200
    depth: float = 0.5
    seed: int = 0
    max_new_tokens: int = 32
    step: int = -1
    n_view_heads: int = 12
    output_dir: str = "papers_figures"

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("context_tokens", "max_new_tokens", "n_view_heads"))
        check_ints(self, ("seed",), minimum=0)
        check_ints(self, ("step",), minimum=-1)
        if isinstance(self.depth, bool) or not isinstance(self.depth, (int, float)) or not 0 <= self.depth <= 1:
            raise ValueError(f"Parameter 'depth' must be a fraction in [0, 1], got {self.depth!r}.")

    def context_lengths(self) -> dict[str, list[int]]:
        return {"NIAH": [self.context_tokens]}

    def check_inputs(self) -> None:
        """The context against the model's window (every attention row is kept, so it must stay short)."""
        from dynheads_tl.engine.preflight import model_context_window
        from dynheads_tl.tasks import check_context_fits

        check_context_fits(self.context_tokens, self.max_new_tokens, model_context_window(self.model),
                           name="context_tokens")
        if self.context_tokens > 2000:
            raise ValueError(f"Parameter 'context_tokens' must be at most 2000 here (every head's full attention row "
                             f"is kept at every step), got {self.context_tokens}.")
        check_model_sizes(self.model, heads={"n_view_heads": self.n_view_heads},
                          contexts={"context_tokens": self.context_tokens})
