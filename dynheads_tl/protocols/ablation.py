"""Claim 2 — dynamic retrieval heads are irreplaceable: the per-step two-pass ablation, by the names the notebooks,
docs and benchmarks use.

At every decoding step a clean pass gives D_t and its token is discarded; a masked pass from the same cache, with
the selected heads' ``hook_z`` zeroed (or set to their mean), gives the token that is kept. By default the KV
cache keeps the clean pass of each step, so each step's intervention only changes which token is chosen. The
parts live in modules of one job each; this module gathers their public names:

- :mod:`~dynheads_tl.protocols.two_pass`: the protocol (the :class:`TwoPass` step policy and its teacher-forced
  variant :class:`TeacherForced`, :func:`two_pass_batch`, :class:`AblationTrace`); the clean-pass / second-pass
  machinery it shares with KV retention is :mod:`~dynheads_tl.protocols.stepwise`;
- :mod:`~dynheads_tl.protocols.selectors`: the masking rules (``select_*``, ``random_heads*``);
- :mod:`~dynheads_tl.protocols.conditions`: the named conditions and controls, each declared once as a
  :class:`ConditionSpec` (how it selects, its title, how it is sized), the :class:`AblationSetup` they are built
  from, and the registry behind :func:`make_selector` and :func:`grid_conditions`;
- :mod:`~dynheads_tl.protocols.ablation_metrics`: answer scores, compensation, teacher-forced drops;
- :mod:`~dynheads_tl.protocols.ablation_experiments`: jobs, their cache keys, cached batched runs, the grid and
  the progressive experiment.
"""
from __future__ import annotations

from dynheads_tl.protocols.ablation_experiments import (_PROTOCOL_VERSION, Job, _job_keys, _setup_key, _summarise,
                                                        ablation_units, batch_plan, cached_runs, count_missing,
                                                        grid_experiment, grid_jobs, progressive_experiment, rule_key,
                                                        run_condition, run_jobs)
from dynheads_tl.protocols.ablation_metrics import (answer_scores, compensation, compensation_table,
                                                    overlap_with_dynamic, teacher_forced_scores)
from dynheads_tl.protocols.conditions import (CONDITIONS, SIZINGS, AblationSetup, Condition, ConditionSpec,
                                              condition_spec, condition_titles, conditions_sized, grid_conditions,
                                              make_selector, register_condition, teacher_forced_measure)
from dynheads_tl.protocols.selectors import (random_heads, random_heads_from, select_dynamic, select_dynamic_nonstatic,
                                             select_fixed, select_predicted, select_previous_step,
                                             select_random_matched,
                                             select_random_nondynamic,
                                             select_random_nonstatic, select_random_sized, select_static_matched,
                                             select_static_nondynamic, select_top_ranked)
from dynheads_tl.protocols.stepwise import Selector, StepView, eq1_at_step, gold_continuation, gold_token_ids
from dynheads_tl.protocols.two_pass import (AblationTrace, CachePolicy, TeacherForced, TwoPass, two_pass_batch,
                                            two_pass_generation)

__all__ = [
    "AblationSetup", "AblationTrace", "CONDITIONS", "CachePolicy", "Condition", "ConditionSpec", "Job", "SIZINGS",
    "Selector", "StepView", "condition_spec", "condition_titles", "conditions_sized", "grid_conditions",
    "register_condition", "select_predicted", "select_previous_step", "teacher_forced_measure", "overlap_with_dynamic",
    "TeacherForced", "TwoPass", "ablation_units", "answer_scores", "batch_plan", "cached_runs", "compensation",
    "compensation_table", "count_missing", "eq1_at_step", "gold_continuation", "gold_token_ids", "grid_experiment",
    "grid_jobs", "make_selector", "progressive_experiment", "random_heads", "random_heads_from", "rule_key",
    "run_condition", "run_jobs",
    "select_dynamic", "select_dynamic_nonstatic", "select_fixed", "select_random_matched", "select_random_nondynamic",
    "select_random_nonstatic", "select_random_sized", "select_static_matched", "select_static_nondynamic",
    "select_top_ranked", "teacher_forced_scores", "two_pass_batch", "two_pass_generation",
    # the cache keys' parts, read by tests
    "_PROTOCOL_VERSION", "_job_keys", "_setup_key", "_summarise",
]
