# %% [markdown]
# # Inspecting attention on one NIAH sample
#
# Before the statistics, look at one generation. A short needle-in-a-haystack prompt is decoded greedily
# and every head's attention row is kept at every step. Needle tokens are marked «like this».
#
# - **The heads on the needle at one step** (circuitsvis): the `n_view_heads` heads with most attention on
#   the needle when the model generates the chosen token; choose one in the selector to colour the prompt
#   by its attention.
# - **The dynamic heads across steps** (circuitsvis): which heads are Eq. 1 retrieval heads (top-1 source
#   in the needle, holding the generated token) at each generated token, the `n_view_heads` that retrieve
#   at the most steps.
# - **Static views** (seaborn) of the same, for readers without JavaScript.
#
# The circuitsvis views inline their JavaScript (no CDN), so they render offline and in the executed
# notebook.

# %% tags=["parameters"]
model = "smollm2-135m-instruct"  # embedded name, paper alias, local folder or hub id
context_tokens = 200  # NIAH context length (short: every attention row is kept)
depth = 0.5  # needle depth as a fraction of the context
seed = 0  # seeds the needle's UUID
max_new_tokens = 32  # decoding steps
step = -1  # decoding step shown head by head; -1 picks the step with most retrieval heads
n_view_heads = 12  # heads per circuitsvis view (each head adds 20 px of tooltip room below the text)
device = "auto"  # auto, cpu, cuda or cuda:N (auto picks CUDA when a GPU is present)
dtype = "auto"  # auto, float32, bfloat16 or float16 (auto picks bfloat16 on a GPU, float32 on the CPU)
output_dir = "runs/notebooks"  # where the static figures are written (the runner passes its own)

# %%
from IPython.display import Image, display

import dynheads_tl
from dynheads_tl import TraceConfig
from dynheads_tl.claims import dynamism
from dynheads_tl.analysis import plots
from dynheads_tl.report import figures
from dynheads_tl.claims import inspect_attention
from dynheads_tl.tasks import NiahConfig, build_niah_sample

config = inspect_attention.InspectConfig.from_namespace(globals())
lm = config.load_model()
sample = build_niah_sample(lm.tokenizer, NiahConfig(context_tokens=context_tokens, depth=depth, seed=seed,
                                                    max_new_tokens=max_new_tokens), max_tokens=int(lm.cfg.n_ctx))
inspected = inspect_attention.trace_with_rows(lm, sample, TraceConfig(max_new_tokens=max_new_tokens))
trace = inspected.trace
chosen = int(trace.retrieval_mask.flatten(1).sum(1).argmax()) if step == -1 else min(step, trace.n_steps - 1)
out_dir, run_config = inspect_attention.CLAIM.outputs(config)  # the claim's output folder and run record
run_config["step"] = chosen
print(f"Needle: {sample.meta['needle_text']}")
print(f"Response: {trace.response!r}")
print(f"Showing step {chosen}: generating {inspected.tokens[len(trace.prompt_ids) + chosen]!r}, "
      f"{int(trace.retrieval_mask[chosen].sum())} Eq. 1 retrieval heads")

# %% [markdown]
# ## The heads with most attention on the needle at the chosen step

# %%
inspect_attention.heads_at_step_view(inspected, chosen, n_top=n_view_heads)

# %% [markdown]
# ## The dynamic (Eq. 1) retrieval heads across the generated tokens

# %%
inspect_attention.dynamic_heads_view(inspected, n_top=n_view_heads)

# %% [markdown]
# ## Static views
# Left to right: the needle window (needle ± 12 tokens); rows: the heads with most attention on the needle
# at the chosen step. Then the Fig 1-style view of this one answer.

# %%
fig = inspect_attention.static_step_heatmap(inspected, chosen)
start, end = inspect_attention.needle_window(inspected)
import pandas as pd

window = pd.DataFrame(inspected.rows[chosen, :, :, start:end].flatten(0, 1).numpy(), columns=inspected.tokens[start:end])
display(Image(filename=str(figures.save_figure(fig, "step_attention", out_dir, window, run_config))))

# %%
result = dynamism.TaskResult("niah", seed, [], [trace], trace.retrieval_mask.float(), [trace.retrieval_mask], {}, {})
matrix, hits, tokens, labels, data, _ = dynamism.heatmap_data(result, lm.tokenizer, sample_index=0)
fig = plots.step_heatmap(matrix, hits, tokens, labels, "This answer: 10 most variable heads", "attention share on needle")
display(Image(filename=str(figures.save_figure(fig, "answer_heatmap", out_dir, data, run_config))))
