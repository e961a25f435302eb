# %% [markdown]
# # Beyond the paper (2) — keep the KV cache only for the heads that will retrieve
#
# DuoAttention, RazorAttention and HeadKV keep the full KV cache for a *static* set of retrieval heads; every
# other head keeps a short window (DuoAttention: NIAH stays intact with 25% (MHA) or 50% (GQA) of heads on full
# attention; HeadKV: 97% of full-cache quality with 1.5% of the cache). If the retrieving heads change from step
# to step and the hidden state predicts them (claims 1 and 3), the heads that keep the full context can be
# chosen per step. This notebook measures that on the embedded model.
#
# **Protocol** (`dynheads_tl.protocols.retention`). At each decoding step the heads of R_t attend to every key;
# every other head sees only the first `sink_tokens` positions and the last `local_window` keys, with exactly
# zero attention elsewhere. The prompt is prefilled with every head on the full context. Each step runs the
# retained pass, whose token and keys/values are kept; the oracle runs a clean pass before it (discarded; it gives
# D_t). Several samples' conditions are decoded in one batch (`batch_size` rows).
#
# **Strategies at an equal budget** b (a share of the KV heads by default; of the query heads with `granularities` "query"):
# **static** (Wu et al.'s top-b on calibration answers of the same setting: the DuoAttention-style split),
# **predicted** (a ridge probe's top-b from the hidden state of the *previous* step, trained on answers of the
# same setting, drawn as notebook 01's soft-dynamism settings are; step 0 uses the static order), **oracle** (D_t of the clean pass, then Eq. 2
# share: the upper bound), **random** (drawn per step), **streaming** (b = 0) and the **full cache**.
# Measures: NIAH accuracy (free generation, Wilson 95%) and the teacher-forced log-probability of the needle
# sentence's tokens (bootstrap 95%), both on new samples.
#
# GQA: a KV head's cache is kept if any of its query heads is retained; the tables count kept KV heads that
# way. The memory table is **computed** from the model configs, not measured; a per-step strategy keeps a
# different set of KV heads whole at each step, so it needs the evicted entries somewhere (host memory, say).
# The simulation restores a head's evicted entries for free when it is switched back in; the **switching cost** is
# counted instead: `kv_switches_per_step`, the KV heads kept at a step that were not kept at the step before, and in
# the memory table the MiB those switches would move per step.

# %% tags=["parameters"]
model = "smollm2-135m-instruct"  # embedded name, paper alias, local folder or hub id
niah_setting = "filler:500"  # 'haystack:tokens' (filler, prose, folder:PATH or wu:PATH); a notebook 01 setting shares its traces
n_setting = 24  # training answers, analysis split (the answers notebook 01 traced are read from the cache)
n_setting_calibration = 8  # training answers, calibration split (the static scores)
n_samples = 30  # new NIAH answers evaluated under every condition
budgets = [0.05, 0.1, 0.25, 0.5]  # shares of heads kept whole at each step (the paper preset adds 1% and 2%)
strategies = ["static", "query_static", "predicted", "oracle", "random"]  # per-step strategies; streaming and full always run
granularities = ["kv"]  # budgets in KV heads ("kv"; a KV head kept whole keeps its query heads) or single query heads ("query"; the thorough preset adds it)
max_new_tokens = 40  # NIAH greedy decoding steps (the answer line takes about 25 tokens on SmolLM2, 37-39 on Gemma 3)
hotpot_max_new_tokens = 16  # HotpotQA decoding steps; unused here (a shared trace setting)
sink_tokens = 4  # Eq. 2: leading attention-sink positions left out of the denominator; here also the leading positions a restricted head keeps
local_window = 32  # Eq. 2: most recent positions left out of the denominator; here also the most recent positions a restricted head keeps
seed = 0  # seeds the samples and, with the sample, the random strategy's draws
static_source = ""  # "" (score the static heads on the calibration split) or a Wu head_score .json / layer,head,score .csv
trace_batch_size = 24  # samples traced together (speed only, results equal to float rounding); here the training answers
batch_size = 180  # rows decoded together (the conditions of as many samples as fit)
device = "auto"  # auto, cpu, cuda or cuda:N (auto picks CUDA when a GPU is present)
dtype = "auto"  # auto, float32, bfloat16 or float16 (auto picks bfloat16 on a GPU, float32 on the CPU)
backend = "local"  # local, or ray to compute the units on a Ray cluster (README, Scaling out)
ray_address = ""  # with ray, a cluster address, or empty for a local cluster of this machine
output_dir = "runs/notebooks"  # where figures and tables are written (the runner passes its own)
use_cache = True  # reuse cached traces and runs

# %%
import time

import pandas as pd
from IPython.display import Image, Markdown, display

import dynheads_tl
from dynheads_tl.claims import kv_retention
from dynheads_tl.report import figures

started = time.time()
config = kv_retention.RetentionConfig.from_namespace(globals())
out_dir, run_config = kv_retention.CLAIM.outputs(config)  # the claim's output folder and run record
config

# %%
lm = config.start()  # the model, and the backend that computes the units
rows = kv_retention.run(lm, config)
figures.save_table(rows.drop(columns=["response"]), "retention_runs", out_dir, run_config)
table = kv_retention.summary(rows, seed=config.seed)
figures.save_table(table, "retention", out_dir, run_config)
display(table.round(3))

# %% [markdown]
# ## Accuracy and gold log-probability against the budget

# %%
fig = kv_retention.retention_figure(table, f"Per-step KV retention (NIAH {config.haystack} {config.context_tokens}, "
                                      f"n = {config.n_samples} samples)")
display(Image(filename=str(figures.save_figure(fig, "retention", out_dir, table, run_config))))

# %% [markdown]
# ## KV memory each condition needs (computed from the configs, per sequence, bf16)
# At the share of KV heads each condition kept whole per step (measured above: a KV head counts when any of its
# query heads is retained); the rest keep `sink_tokens` + `local_window` positions. The Llama-3.1-8B rows apply
# the same share to its cache. 50k and 128k exceed the embedded model's 8k context: those columns are
# arithmetic, for comparison.
# `MiB_switched_per_step_at_*`: what the KV heads switched in per step (measured above, at the same share for
# Llama-3.1-8B) bring back, the keys and values beyond `sink_tokens` + `local_window`; static sets switch nothing.

# %%
mem = kv_retention.memory(lm, config, table)
figures.save_table(mem, "kv_memory_computed", out_dir, run_config)
display(mem.round(3))

# %% [markdown]
# ## Verdict, computed from the intervals
# The **primary** comparison, declared before the data: per sample, predicted − static gold log-probability averaged
# over the KV-head budgets (the ones that save memory), with an exact sign test over samples, tested alone. The
# per-budget comparisons are secondary: predicted and static differ at a budget, on accuracy or on the gold
# log-probability, only when the paired interval excludes 0 and the exact sign test, Holm-adjusted over both
# measures at every budget, gives p < 0.05; a comparison with too few differing samples to ever reach 0.05 leaves
# the family and is reported as untestable.

# %%
primary = kv_retention.primary_comparison(rows, seed=config.seed)
if primary is not None:
    figures.save_table(pd.DataFrame([{**primary, "budgets": " ".join(map(str, primary["budgets"]))}]),
                       "primary_comparison", out_dir, run_config)
display(Markdown(kv_retention.primary_verdict(primary)))
comparisons = kv_retention.predicted_vs_static(rows, seed=config.seed)
figures.save_table(comparisons, "predicted_vs_static", out_dir, run_config)
display(comparisons.round(3))
verdict = kv_retention.verdict(table, comparisons, mem)
display(Markdown("**Verdict.** " + verdict))

# %% [markdown]
# ## A stronger static baseline: query-focused static heads
# `query_static` keeps the top heads of a QRHead-style query-focused score (the question's attention on the needle,
# calibrated against a null query; the same calibration prompts as the static set) whole at every step. The same
# paired comparison against the predicted strategy, and whether its reading differs from the one against Wu's set.

# %%
query_comparisons = kv_retention.predicted_vs_static(rows, seed=config.seed, static="query_static")
if len(query_comparisons):
    figures.save_table(query_comparisons, "predicted_vs_query_static", out_dir, run_config)
display(query_comparisons.round(3))
display(Markdown("**" + kv_retention.query_baseline_verdict(comparisons, query_comparisons) + "**"))
print(f"Notebook compute time: {(time.time() - started) / 60:.1f} min")
