"""dynheads-tl: reproducing "Retrieval Heads are Dynamic" (arXiv 2602.11162) with TransformerLens."""
from dynheads_tl.engine.decoder import BatchDecoder, Decoder
from dynheads_tl.engine.models import DEFAULT_MODEL, embedded_model_dir, fast_twin, load_model
from dynheads_tl.engine.trace_data import Trace, TraceConfig, load_traces, save_traces
from dynheads_tl.engine.tracing import trace_batch, trace_generation
from dynheads_tl.store import cache_dir

__version__ = "0.1.0"
__all__ = [
    "DEFAULT_MODEL", "cache_dir", "embedded_model_dir", "fast_twin", "load_model",
    "BatchDecoder", "Decoder", "Trace", "TraceConfig", "trace_batch", "trace_generation", "save_traces", "load_traces",
]
