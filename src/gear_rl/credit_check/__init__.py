"""Is the credit right? Monte-Carlo ground truth for per-token credit, and every estimator
scored against it (docs/credit_check.md).

For a sampled response ``y`` to a prompt ``x``, the true advantage of token ``t`` under the
current policy is ``V(x, y_<=t) - V(x, y_<t)``, with ``V(prefix)`` the expected outcome reward
of the policy continuing from ``prefix`` (VinePPO, arXiv 2410.01679). ``values`` estimates
``V`` with the trainer's own sampler; ``scores`` scores any per-token credit against it
(Spearman, precision@k, mass inside GEAR's segments, with cluster-bootstrap intervals); ``run``
does both end to end for every registered estimator (``gear-rl credit-check``).

Python API, for a model of one's own (a TRL or verl user's)::

    from gear_rl.credit_check import CreditCheckConfig, credit_check
    from gear_rl.train import TrainConfig

    result = credit_check(TrainConfig(task="products"), CreditCheckConfig(groups=32),
                          out="cc/", model=my_hf_model, tokenizer=my_tokenizer)
    print(result.table)
"""

from gear_rl.credit_check.config import BOUNDARY_MODES, SIGNAL_KEYS, CreditCheckConfig, Variant
from gear_rl.credit_check.output import format_table, plot_trajectories, write_outputs
from gear_rl.credit_check.run import (
    CreditCheckResult,
    EstimatorRow,
    check_task,
    credit_check,
    plan_rows,
    run_check_config,
    task_reward_fn,
)
from gear_rl.credit_check.scores import (
    Interval,
    TrajectoryUnits,
    cluster_bootstrap,
    paired_difference,
    precision_at_k,
    score_estimate,
    span_shares,
    span_sums,
    spearman,
    top_k_shares,
    truth_summary,
)
from gear_rl.mc_values import (
    PrefixValues,
    RewardFn,
    choose_boundaries,
    estimate_prefix_values,
    exact_value,
    nucleus_probs,
    sample_from_prefixes,
)
from gear_rl.rundir import CREDIT_CHECK_DIR  # the default out folder (the layout is rundir's)

__all__ = [
    "BOUNDARY_MODES",
    "CREDIT_CHECK_DIR",
    "SIGNAL_KEYS",
    "CreditCheckConfig",
    "CreditCheckResult",
    "EstimatorRow",
    "Interval",
    "PrefixValues",
    "RewardFn",
    "TrajectoryUnits",
    "Variant",
    "check_task",
    "choose_boundaries",
    "cluster_bootstrap",
    "credit_check",
    "estimate_prefix_values",
    "exact_value",
    "format_table",
    "nucleus_probs",
    "paired_difference",
    "plan_rows",
    "plot_trajectories",
    "precision_at_k",
    "run_check_config",
    "sample_from_prefixes",
    "score_estimate",
    "span_shares",
    "span_sums",
    "spearman",
    "task_reward_fn",
    "top_k_shares",
    "truth_summary",
    "write_outputs",
]
