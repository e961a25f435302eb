# %% [markdown]
# # Claim 2 — dynamic retrieval heads are irreplaceable
#
# If retrieval at step $t$ really runs through the step's own set $D_t$, then removing exactly those
# heads at that step should break retrieval, while removing as many *static* heads (the usual top-k by
# Wu et al.'s score) or random heads should not. The paper tests this with a per-step two-pass protocol:
#
# 1. a **clean pass** at step $t$ finds $D_t$ (its token is discarded);
# 2. a **masked pass** reruns step $t$ with $D_t$ ablated, and its token is kept.
#
# Baselines mask the static top-$k$ or $k$ seeded random heads at every step, with $k$ the mean size of
# $D_t$ on a calibration split. Masking is zero-ablation of each head's output (`hook_z`) by default. By
# default the KV cache keeps the clean pass of each step, so each step's intervention only changes which
# token is chosen (see `dynheads_tl.protocols.ablation`). **Compensation**: $E_t$ = the heads active after
# masking at step $t$ that were not active before and were not themselves masked at $t$ (a masked head's
# pattern is still computed, so it could otherwise "compensate" for its own removal); $m_s$ = max over steps
# of $|E_t \cap$ static top-20$|$, averaged over samples.
#
# **Controls that are not in the paper (ours).** $k$ is a *mean*: at a given step $D_t$ can hold fewer or
# more heads than $k$, so "dynamic vs static top-$k$" mixes up *which* heads with *how many*. Each of these
# is decided at each step from that step's $D_t$ ($S_{20}$: the static top-20 of the calibration split):
#
# - `static_matched`: the top-$|D_t|$ static heads (dynamic and static masking remove equally many heads);
# - `query_matched`: the same with a second, stronger static ranking: QRHead-style query-focused scores (the
#   attention of the question on the needle, calibrated against a null query) on the same calibration prompts;
# - `random_matched`: $|D_t|$ random heads, from a generator seeded by the sample and the step;
# - `dynamic_nonstatic`: $D_t \setminus S_{20}$, the part of the dynamic set that a static view misses;
# - `static_nondynamic`: $S_{20} \setminus D_t$, the static heads that are not retrieving at that step;
# - `random_nonstatic` and `random_nondynamic`: their size-matched random controls: as many random heads
#   from outside $S_{20}$ as $D_t \setminus S_{20}$ has, and as many from outside $D_t$ as $S_{20} \setminus D_t$ has.
#
# **The fair comparison (ours; the primary).** $D_t$ is chosen on step $t$'s own clean pass, among heads whose
# argmax already points at the token being produced, so part of its larger drop is expected from selection
# alone. `previous_step` masks $D_{t-1}$, the previous answer step's set from its clean pass, known before step
# $t$; `static_previous` and `random_previous` mask as many top static / random heads ($|D_{t-1}|$ at each step).
# At $t = 0$ there is no previous set: the three mask nothing there, and their teacher-forced comparison is read
# on the steps $t \ge 1$ (`tf_drop_t1`), so both sides cover the same steps. Each condition is declared once
# (`dynheads_tl.protocols.conditions.ConditionSpec`: how it selects, its title, how it is sized).
#
# **The probe's predicted set (ours; exploratory).** A second set known before step $t$: `predicted` masks the
# $|D_{t-1}|$ heads that a probe ranks highest from the hidden state of step $t-1$'s clean pass (the final-norm
# state at the last position, whose logits chose token $t-1$: the pass that gave $D_{t-1}$), so it is size-matched
# with `static_previous` and `random_previous` and masks nothing at $t = 0$. The probe is claim 3's MLP at lag
# $k = 1$ (hidden state at step $n$ → step $n+1$'s Eq. 1 set for NIAH, its Eq. 2 scores for HotpotQA, as Tables 2
# and 3 train them; `probe_hidden`, `probe_epochs`), trained on this notebook's calibration split only (never on
# the grid's samples), seeded by `seed`. It was added after the $D_t$ / $D_{t-1}$ results of both models had been
# seen: an exploratory secondary (`preregistration.yaml`, deviation of 2026-12-04) that decides no status.
#
# Every run records the mean number of heads masked per step, so sizes can be compared.
#
# **A measure that cannot be derailed (ours).** Free generation turns one early error into a failed
# answer. So every condition is also run **teacher-forced**: the gold continuation is fed token by token
# with the same two passes per step (the clean pass gives $D_t$, reading the forced gold token as the
# generated one in Eq. 1; the masked pass gives the masked logits), and each step records the gold token's
# log-probability in both passes. The **drop** (clean − masked, nats) is 0 exactly where nothing was masked.
# The gold continuation is the needle sentence for NIAH (`The magic word is <uuid>.`, which is what the
# model's correct answers reproduce, and whose tokens lie in the needle span), and the gold answer for
# HotpotQA.
#
# **Statistics.** Accuracy and EM carry Wilson 95% intervals; F1 and the log-probability drops carry
# percentile-bootstrap 95% intervals over samples. Every condition runs on the same samples, so two conditions
# are compared through their paired per-sample difference: a verdict says they differ only when an exact sign
# test on the samples where they differ is significant after correction (the declared primary comparison alone,
# Holm over all the others) and the 95% bootstrap interval of the difference excludes 0; it needs at least 5
# paired samples, and a "cannot be told apart" states the smallest difference the design could detect.
#
# **Grid size.** With 15 conditions, each run both generated and teacher-forced, the default grid is one
# context × two depths × 5 runs per task (10 samples per condition), so that the whole report fits in 60
# minutes on a 2-core CPU; the `paper` preset runs the paper's grid. The NIAH runs of one cell share the
# depth and differ in the UUID and in where the haystack text starts (a seeded offset of up to 3,000 tokens;
# the default filler haystack repeats a short list of sentences, so the offset mostly shifts their order); the
# HotpotQA runs are different questions.

# %% tags=["parameters"]
model = "smollm2-135m-instruct"  # embedded name, paper alias, local folder or hub id
niah_contexts = [500]  # Fig 2 rows: NIAH context lengths in tokens (one: every masking condition, generated and teacher-forced, must fit the time budget)
niah_depths = [0.1, 0.9]  # Fig 2 columns: needle depths (two: 30 samples per condition at 15 runs per cell)
hotpot_contexts = [750]  # Fig 6 rows: HotpotQA context lengths (750: more unmasked headroom than 250)
hotpot_depths = [0.1, 0.9]  # Fig 6 columns: depth of the gold paragraphs
runs_per_cell = 15  # samples per grid cell and depth, each generated and teacher-forced
n_calibration = 10  # samples that fix the static set and k, and train the predicted condition's probe
static_source = ""  # "" (score the static heads on the calibration split) or a Wu head_score .json / layer,head,score .csv
max_new_tokens = 40  # NIAH greedy decoding steps (the answer line takes about 25 tokens on SmolLM2, 37-39 on Gemma 3)
hotpot_max_new_tokens = 16  # HotpotQA decoding steps
probe_hidden = [256]  # probe MLP hidden layer widths; the predicted condition's probe (claim 3's CPU recipe)
probe_epochs = 60  # probe training epochs; the predicted condition's probe
progressive_k_max = 30  # Fig 3 / 7: largest number of heads masked per step
progressive_k_step = 10  # Fig 3 / 7: step between k values (10 keeps the default within its time budget)
n_progressive = 30  # samples for progressive masking, per k
progressive_context = 500  # NIAH context length for progressive masking
ablation_mode = "zero"  # "zero" or "mean" ablation of hook_z
keep_cache = "clean"  # which pass's keys/values step t leaves in the cache: "clean" or "masked"
eq2_rule = "chance"  # Eq. 2 selection: "chance" (share > c x chance, c calibrated on placebo spans) or "fixed"; HotpotQA D_t
eq2_threshold = 0.1  # the Eq. 2 share above which a head counts, under the fixed rule
eq2_false_rate = 0.01  # chance rule: the share of placebo head-steps the calibrated factor lets through
sink_tokens = 4  # Eq. 2: leading attention-sink positions left out of the denominator
local_window = 32  # Eq. 2: most recent positions left out of the denominator
seed = 0  # seeds samples and the random baseline
trace_batch_size = 24  # samples traced together (speed only, results equal to float rounding); here the calibration traces
batch_size = 225  # generations decoded together: a grid cell's runs in one batch, teacher-forced in another
device = "auto"  # auto, cpu, cuda or cuda:N (auto picks CUDA when a GPU is present)
dtype = "auto"  # auto, float32, bfloat16 or float16 (auto picks bfloat16 on a GPU, float32 on the CPU)
backend = "local"  # local, or ray to compute the units on a Ray cluster (README, Scaling out)
ray_address = ""  # with ray, a cluster address, or empty for a local cluster of this machine
output_dir = "runs/notebooks"  # where figures and tables are written (the runner passes its own)
use_cache = True  # reuse cached traces and ablation runs
hotpot_source = "dev"  # "dev" (HotpotQA dev, distractor setting, from the installed data package: its first 1,000 records), "synthetic" (fictional HotpotQA-format records: smoke runs and tests), an official distractor .json/.jsonl path, or "hf"
hotpot_skip_incomplete = False  # skip file records whose supporting paragraphs are not in their context

# %%
import time

from IPython.display import Image, Markdown, display

import dynheads_tl
from dynheads_tl.report import figures
from dynheads_tl.claims import irreplaceability
from dynheads_tl.tasks.hotpot import hotpot_label

started = time.time()
config = irreplaceability.IrreplaceabilityConfig.from_namespace(globals())
out_dir, run_config = irreplaceability.CLAIM.outputs(config)  # the claim's output folder and run record
config

# %%
lm = config.start()  # the model, and the backend that computes the units

# %% [markdown]
# ## NIAH: calibration, grid and progressive masking

# %%
niah = irreplaceability.run_task(lm, config, "niah")
print(f"k (mean |D_t| on calibration) = {niah.setup.k}; static top-{niah.setup.k}: "
      f"{[f'L{l}H{h}' for l, h in niah.setup.static_mask.nonzero().tolist()]}; "
      f"predicted condition's probe: {'weights ' + niah.setup.probe.digest if niah.setup.probe else 'none'}")

# %% [markdown]
# ## Fig 2 — NIAH accuracy under each masking condition
# Accuracy = the response contains the exact UUID. One panel per condition, in the order of the registry: the
# unmasked baseline and the paper's three first, then our controls (the sets known before the step, $D_{t-1}$ and
# the probe's, with theirs); rows are context lengths, columns needle depths. Static top-$k$ and random $k$ mask
# the calibration's fixed $k$ at every step; the others mask a number set by $D_t$ or $D_{t-1}$ at each step (mean
# heads per step in each panel's title). `fig2_niah_masking.csv` has one row per
# run, with the teacher-forced columns (`tf_*`) beside the free-generation ones.

# %%
fig = irreplaceability.condition_heatmaps(niah.grid, "accuracy", "Fig 2 (NIAH): accuracy", k=niah.setup.k)
display(Image(filename=str(figures.save_figure(fig, "fig2_niah_masking", out_dir, niah.grid, run_config))))

# %% [markdown]
# ### Every condition with its interval (NIAH)
# Left: free-generation accuracy (Wilson 95%). Right: the teacher-forced drop of the gold token's
# log-probability per step (bootstrap 95% over samples). `tf_drop_masked` in the table averages only the
# steps where something was masked (`n_tf_masked` samples had such a step).

# %%
summary_niah = irreplaceability.condition_summary(niah)
figures.save_table(summary_niah, "niah_conditions", out_dir, run_config)
fig = irreplaceability.controls_figure(summary_niah, "accuracy", "NIAH: masking conditions")
display(Image(filename=str(figures.save_figure(fig, "niah_controls", out_dir, summary_niah, run_config))))
display(summary_niah.round(3))

# %% [markdown]
# ## Fig 3 — NIAH progressive masking
# At each step the top-$k$ heads (Eq. 1 hits first, then by attention share on the needle) are masked.
# Blue: accuracy; red: $m_s$, the compensating static-top-20 heads.
# Dashed (ours, not in the paper): the size-matched control, $k$ random heads drawn afresh at each step (seeded by
# the sample and the step), on the same samples. The table's `difference` is ranked − random per sample, with the
# exact sign test (`sign_p`) and Holm over the $k$ values whose test can reach 0.05 (`p_adjusted`); `specific`
# marks a $k$ where the ranked heads hurt more than random ones. Masking many heads at once hurts whichever they
# are, so a drop counts for the claim only where it beats this control.

# %%
prog_niah = irreplaceability.progressive_summary(niah)
fig = irreplaceability.progressive_figure(prog_niah, "accuracy", "Fig 3 (NIAH): progressive masking",
                                 ranking=irreplaceability.NIAH_RANKING)
display(Image(filename=str(figures.save_figure(fig, "fig3_niah_progressive", out_dir, niah.progressive, run_config))))
display(prog_niah.round(3))

# %% [markdown]
# ### Protocol checks (NIAH)
# Progressive masking with $k = 0$ must give exactly the unmasked generation of the same sample, the
# three grid conditions must mask different heads (which heads: the `heads_ever_masked` column of
# `fig2_niah_masking.csv`), and teacher-forced runs with nothing masked must show a drop of exactly 0.

# %%
checks_niah = irreplaceability.protocol_checks(niah)
figures.save_table(checks_niah, "niah_protocol_checks", out_dir, run_config)
display(checks_niah)

# %% [markdown]
# ### Which heads take over? (NIAH)
# Heads that became Eq. 1 retrieval heads only after masking (and were not masked themselves at that step),
# counted over the ranked progressive runs (not the random control).

# %%
figures.save_table(niah.compensation, "niah_compensation", out_dir, run_config)
display(niah.compensation)

# %% [markdown]
# ## HotpotQA: Fig 6 and Fig 7
# The questions are HotpotQA's dev set by default (`hotpot_source="dev"`: the calibration, grid and progressive
# splits take disjoint blocks of its first 1,000 records, listed by `_id` in `hotpot_questions.csv`; Fig 6's contexts
# add paragraphs of other records), or the project's synthetic generator where the run asks for it. Here $D_t$ is the
# set of heads whose Eq. 2 share on supporting facts exceeds $c \times$ chance, with $c$ calibrated on this
# notebook's HotpotQA calibration split against placebo spans (as in notebook 01; `eq2_rule="fixed"` uses
# `eq2_threshold` instead). The metric is token F1 (EM and ROUGE-L in the table), and progressive masking ranks
# heads by their Eq. 2 share (Eq. 1 does not apply to a free-form answer). The teacher-forced measure feeds the
# gold answer string.

# %%
hotpot = irreplaceability.run_task(lm, config, "hotpot")
rule = hotpot.setup.threshold
print(f"Eq. 2 rule: {rule.label() if hasattr(rule, 'label') else f'share > {rule:g}'}; k = {hotpot.setup.k} "
      "(mean calibration |D_t|)")
fig = irreplaceability.condition_heatmaps(hotpot.grid, "f1", f"Fig 6 ({hotpot_label(config.hotpot_source)}): F1", k=hotpot.setup.k)
display(Image(filename=str(figures.save_figure(fig, "fig6_hotpot_masking", out_dir, hotpot.grid, run_config))))
summary_hotpot = irreplaceability.condition_summary(hotpot)
figures.save_table(summary_hotpot, "hotpot_conditions", out_dir, run_config)
fig = irreplaceability.controls_figure(summary_hotpot, "f1", f"{hotpot_label(config.hotpot_source)}: masking conditions")
display(Image(filename=str(figures.save_figure(fig, "hotpot_controls", out_dir, summary_hotpot, run_config))))
display(summary_hotpot.round(3))

# %%
prog_hotpot = irreplaceability.progressive_summary(hotpot)
fig = irreplaceability.progressive_figure(prog_hotpot, "f1", f"Fig 7 ({hotpot_label(config.hotpot_source)}): progressive masking",
                                 ranking=irreplaceability.HOTPOT_RANKING)
display(Image(filename=str(figures.save_figure(fig, "fig7_hotpot_progressive", out_dir, hotpot.progressive, run_config))))
figures.save_table(hotpot.compensation, "hotpot_compensation", out_dir, run_config)
checks_hotpot = irreplaceability.protocol_checks(hotpot)
figures.save_table(checks_hotpot, "hotpot_protocol_checks", out_dir, run_config)
display(prog_hotpot.round(3))
display(checks_hotpot)
display(hotpot.compensation)

# %% [markdown]
# ## Every comparison, tested
# One row per comparison, task and measure (`comparisons.csv`): the paired difference a − b with its bootstrap
# 95% interval, the samples on which each side's masking hurt more, the exact sign test, and the Holm-adjusted
# p-value. The **primary** comparison (`preregistration.yaml`: NIAH, $D_{t-1}$ against as many top static heads,
# teacher-forced drop over the steps $t \ge 1$; exploratory on this model) is tested alone, with $D_t$ against as
# many top static heads beside it; every other one is secondary, and Holm runs over the secondary
# comparisons of both tasks that can reach 0.05 at all (a comparison with too few differing samples leaves the
# family and is reported as untestable). A free-generation ranking needs headroom: the unmasked interval must
# reach 0.5, else that metric is not ranked.

# %%
results = {"niah": niah, "hotpot": hotpot}
comparisons = irreplaceability.comparison_table(results)
figures.save_table(comparisons, "comparisons", out_dir, run_config)
display(Markdown(irreplaceability.primary_verdict(comparisons)))
for result in results.values():
    display(Markdown(irreplaceability.matched_controls_verdict(result, comparisons)))
    display(Markdown(irreplaceability.query_baseline_verdict(result, comparisons)))  # the query-focused baseline

# %% [markdown]
# ### The probe's predicted set (exploratory secondary)
# Masking the probe's top-$|D_{t-1}|$ heads (a set known before step $t$) against as many top static heads and as
# many random heads, on the teacher-forced drop over the steps $t \ge 1$ (its rows of `comparisons.csv`, in claim
# 2's Holm family of secondaries), and how well the probe predicted $D_t$ on the grid's samples
# (`predicted_set_overlap.csv`): the share of $D_t$'s heads its set held (recall) and of its heads that were in
# $D_t$ (precision), pooled over the steps $t \ge 1$ of the teacher-forced runs with BCa 95% intervals over samples,
# beside $D_{t-1}$ itself, as many top static heads and chance at the same sizes.

# %%
prediction = irreplaceability.prediction_table(results)
figures.save_table(prediction, irreplaceability.PREDICTION_FILE, out_dir, run_config)
display(Markdown(irreplaceability.predicted_verdict(comparisons, prediction)))
display(prediction.round(3))

# %% [markdown]
# ## How our numbers compare with the paper's

# %%
display(Markdown(irreplaceability.summary_markdown(results, config.model, comparisons)))
print(f"Notebook compute time: {(time.time() - started) / 60:.1f} min")
