"""Every metric grpojob exports, listed once.

Exporters build their prometheus-client objects from these tables (grpojob.prom.build), and the
Grafana dashboard test checks that every name it uses is here. Histograms expose the usual
_bucket/_sum/_count series.

A gauge has a sample only while its value is known (grpojob.prom): nothing before the first step
reports it, nothing while a step does not compute it (grpojob_kl with klBeta 0). A dashboard panel
shows "no data" then, never a made-up 0.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    # The trainer step record's field that sets it (StatusBoard.observe): a gauge takes the value
    # (none: no sample), a counter grows by it. Empty: code sets the metric by its name.
    record: str = ""


_STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

# Served by trainer rank 0 on trainer.port at /metrics. Step, version and total steps mirror the
# trainer's /status; the rollout-server gauges are read from the weight-sync membership at scrape
# time; the rest come from each step's record.
TRAINER = (
    MetricDef("grpojob_trainer_step", "gauge", "Optimizer steps completed."),
    MetricDef("grpojob_trainer_total_steps", "gauge", "Steps the run will do."),
    MetricDef("grpojob_policy_version", "gauge", "Version of the newest policy weights."),
    MetricDef("grpojob_reward_mean", "gauge", "Mean reward of the last step, per reward function "
              "(reward=\"total\" for the weighted sum).", ("reward",)),
    MetricDef("grpojob_reward_std", "gauge", "Reward standard deviation of the last step.", ("reward",)),
    MetricDef("grpojob_advantage_mean", "gauge", "Mean advantage of the last step.", record="advantage_mean"),
    MetricDef("grpojob_advantage_std", "gauge", "Advantage standard deviation of the last step.",
              record="advantage_std"),
    MetricDef("grpojob_loss", "gauge", "Policy loss of the last step.", record="loss"),
    MetricDef("grpojob_kl", "gauge", "KL to the reference policy at the last step; no sample when "
              "algorithm.klBeta is 0 (not computed).", record="kl"),
    MetricDef("grpojob_entropy", "gauge", "Mean token entropy of the policy at the last step.", record="entropy"),
    MetricDef("grpojob_clip_fraction", "gauge", "Fraction of tokens whose ratio was clipped.",
              record="clip_fraction"),
    MetricDef("grpojob_importance_weight_mean", "gauge", "Mean truncated importance weight "
              "(rollout vs. training policy).", record="importance_weight_mean"),
    MetricDef("grpojob_importance_weight_max", "gauge", "Largest importance weight before truncation.",
              record="importance_weight_max"),
    MetricDef("grpojob_completion_length_mean", "gauge", "Mean completion length in tokens.",
              record="completion_length_mean"),
    MetricDef("grpojob_truncated_fraction", "gauge", "Fraction of completions cut at maxTokens.",
              record="truncated_fraction"),
    MetricDef("grpojob_zero_std_group_fraction", "gauge", "Fraction of groups whose rewards were all equal.",
              record="zero_std_group_fraction"),
    MetricDef("grpojob_grad_norm", "gauge", "Global gradient norm before clipping.", record="grad_norm"),
    MetricDef("grpojob_learning_rate", "gauge", "Current learning rate.", record="learning_rate"),
    MetricDef("grpojob_tokens_per_second", "gauge", "Training tokens per second at the last step.",
              record="tokens_per_second"),
    MetricDef("grpojob_policy_staleness", "gauge", "Mean policy-version lag of the last step's samples.",
              record="policy_staleness"),
    # The async pipeline (algorithm.maxStaleness): what the trainer waited for and what generation did.
    MetricDef("grpojob_policy_staleness_max", "gauge", "Largest policy-version lag among the last step's "
              "samples.", record="policy_staleness_max"),
    MetricDef("grpojob_trainer_wait_seconds", "gauge", "Seconds the trainer waited for groups in the last step.",
              record="wait_seconds"),
    MetricDef("grpojob_trainer_wait_fraction", "gauge", "Share of the last step the trainer waited for groups "
              "(wait / step seconds): spec.rollout.autoscale's scale-up signal, and one for an HPA or KEDA.",
              record="wait_fraction"),
    MetricDef("grpojob_rollout_idle_fraction", "gauge", "Fraction of the last step during which no group was "
              "being generated.", record="rollout_idle_fraction"),
    MetricDef("grpojob_groups_in_flight", "gauge", "Groups being generated or ready ahead of training at the "
              "end of the last step.", record="groups_in_flight"),
    MetricDef("grpojob_resampled_groups_total", "counter", "Extra groups generated to replace groups dropped "
              "by dynamic sampling (all-equal rewards).", record="groups_resampled"),
    MetricDef("grpojob_stale_groups_total", "counter", "Groups dropped because they became older than "
              "maxStaleness allows (their prompts are generated again).", record="groups_stale"),
    MetricDef("grpojob_generation_paused_seconds", "gauge", "Seconds generation was paused by the last weight "
              "push.", record="generation_paused_seconds"),
    MetricDef("grpojob_rollout_server_lag", "gauge", "Policy versions each rollout server in the weight-sync "
              "group is behind the trainer.", ("replica",)),
    MetricDef("grpojob_stage_seconds", "histogram", "Time per step stage "
              "(generate, score, train, sync, checkpoint).", ("stage",), _STAGE_BUCKETS),
    MetricDef("grpojob_step_seconds", "histogram", "Wall time per step.", (), _STAGE_BUCKETS),
    MetricDef("grpojob_stage_host_memory_peak_bytes", "gauge", "Peak resident host memory of trainer rank 0's "
              "process during each stage of the last step (generate, train, sync, checkpoint).", ("stage",)),
    MetricDef("grpojob_stage_device_memory_peak_bytes", "gauge", "Peak allocated GPU memory of trainer rank 0 "
              "during each stage of the last step; no sample on CPU.", ("stage",)),
    MetricDef("grpojob_weight_sync_seconds", "histogram", "Duration of a weight push to all rollout servers.",
              (), _STAGE_BUCKETS),
    MetricDef("grpojob_weight_sync_bytes_total", "counter", "Tensor bytes of the weight pushes, each counted once "
              "whatever the number of rollout servers (with model.lora: the adapter's alone).", record="sync_bytes"),
    MetricDef("grpojob_rollout_servers", "gauge", "Rollout servers in the weight-sync group; no sample "
              "when the trainer generates in-process."),
    # spec.mode service: the training API's calls (grpojob.service.app), by operation.
    MetricDef("grpojob_service_requests_total", "counter", "Training-service calls by operation (forward_backward, "
              "forward, optim_step, save_weights_for_sampler, sample, save_state, load_state) and result (ok; "
              "refused: the call's own fault, 4xx; failed: 5xx).", ("op", "result")),
    MetricDef("grpojob_service_request_seconds", "histogram", "Training-service call time, waiting in the queue "
              "included, by operation.", ("op",), _STAGE_BUCKETS),
    MetricDef("grpojob_service_tokens_total", "counter", "Tokens of the training-service calls that succeeded: "
              "the datums' tokens of forward and forward_backward, prompt and sampled tokens of sample.", ("op",)),
    MetricDef("grpojob_service_queued_requests", "gauge", "Training-service calls waiting for the trainer (they "
              "run one at a time); no sample in mode train."),
    # Evaluation (spec.evaluation): the last one, set when it ends (StatusBoard.observe_evaluation).
    MetricDef("grpojob_eval_step", "gauge", "Step whose policy the last evaluation measured (0: the initial one)."),
    MetricDef("grpojob_eval_reward_mean", "gauge", "Mean reward of the last evaluation on the held-out prompts, "
              "per reward function (reward=\"total\" for the weighted sum).", ("reward",)),
    MetricDef("grpojob_eval_pass_at_k", "gauge", "pass@k of the last evaluation: the chance that one of k "
              "completions reaches evaluation.passThreshold (unbiased estimator).", ("k",)),
    MetricDef("grpojob_eval_seconds", "gauge", "Wall time of the last evaluation (generation and scoring)."),
)

# Also on the trainer leader's /metrics, with spec.judges: its judges as the trainer sees them, per
# judge (grpojob.rewards.judge_watch; one registry per process, whatever scorer asks).
TRAINER_JUDGES = (
    MetricDef("grpojob_trainer_judge_request_seconds", "histogram", "Time of each answered scoring request as the "
              "trainer sees it (network, the judge's queue and forward passes), per judge.", ("judge",),
              _STAGE_BUCKETS),
    MetricDef("grpojob_trainer_judge_requests_in_flight", "gauge", "Scoring requests the trainer has sent to the "
              "judge and not had answered yet.", ("judge",)),
    MetricDef("grpojob_trainer_judge_failures_total", "counter", "Failed scoring attempts by reason: timeout, "
              "connection, server_error (5xx), refused (4xx), bad_answer, unparsed, not_ready (no replica ready "
              "within startupTimeoutSeconds).", ("judge", "reason")),
    MetricDef("grpojob_trainer_judge_unscored_groups_total", "counter", "Groups the judge left unscored after "
              "the retries: spec.judges[].onFailure decided (skip: generated again).", ("judge",)),
)

# Served by every rollout server on rollout.port at /metrics.
ROLLOUT = (
    MetricDef("grpojob_rollout_queue_depth", "gauge", "Requests waiting for the engine."),
    MetricDef("grpojob_rollout_running_requests", "gauge", "Requests being generated."),
    MetricDef("grpojob_rollout_generated_tokens_total", "counter", "Completion tokens generated."),
    MetricDef("grpojob_rollout_tokens_per_second", "gauge", "Generation throughput over the last request; "
              "no sample before the first one."),
    MetricDef("grpojob_rollout_requests_total", "counter", "Generate requests by result.", ("result",)),
    MetricDef("grpojob_rollout_weight_version", "gauge", "Policy version the server is serving."),
    MetricDef("grpojob_rollout_last_sync_seconds", "gauge", "Duration of the last weight load; no sample "
              "before the first push."),
)

# Served by every judge server (spec.judges) on its port at /metrics.
JUDGE = (
    MetricDef("grpojob_judge_queue_depth", "gauge", "Texts waiting for the judge's model."),
    MetricDef("grpojob_judge_requests_total", "counter", "Scoring requests by result (ok, refused: 4xx, "
              "failed: 5xx).", ("result",)),
    MetricDef("grpojob_judge_request_seconds", "histogram", "Scoring request time, queueing included.", (),
              _STAGE_BUCKETS),
    MetricDef("grpojob_judge_batch_size", "histogram", "Texts per forward pass.", (),
              (1, 2, 4, 8, 16, 32, 64, 128, 256)),
    MetricDef("grpojob_judge_scored_total", "counter", "Texts scored."),
    MetricDef("grpojob_judge_unparsed_total", "counter", "Generative judge answers the parser could not read "
              "(score.pattern): their groups go to onFailure."),
)

# Served by the operator on its metrics port.
OPERATOR = (
    MetricDef("grpojob_operator_reconciles_total", "counter", "Reconciles by result.", ("result",)),
    MetricDef("grpojob_operator_reconcile_seconds", "histogram", "Reconcile duration.", (),
              (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)),
    MetricDef("grpojob_operator_jobs", "gauge", "GRPOJobs by phase.", ("phase",)),
    MetricDef("grpojob_operator_child_errors_total", "counter", "Failed child-object operations.", ("kind",)),
    MetricDef("grpojob_job_step", "gauge", "Step of each job.", ("namespace", "job")),
    MetricDef("grpojob_job_total_steps", "gauge", "Total steps of each job (spec.training.steps).",
              ("namespace", "job")),
    MetricDef("grpojob_job_reward_mean", "gauge", "Mean reward of each job's last step; no sample before "
              "the trainer's first report.", ("namespace", "job")),
    MetricDef("grpojob_job_policy_lag", "gauge", "Policy versions the slowest rollout server is behind the "
              "trainer; no sample before the trainer reports it.", ("namespace", "job")),
    MetricDef("grpojob_job_trainer_ready", "gauge", "Ready trainer pods of each job.", ("namespace", "job")),
    MetricDef("grpojob_job_rollout_ready", "gauge", "Ready rollout pods of each job.", ("namespace", "job")),
    MetricDef("grpojob_job_restarts", "gauge", "Trainer restarts of each job.", ("namespace", "job")),
    MetricDef("grpojob_job_rollout_desired", "gauge", "Rollout pods each job wants (with spec.rollout.autoscale: "
              "the autoscaler's number; against grpojob_job_rollout_ready).", ("namespace", "job")),
    MetricDef("grpojob_job_autoscale_wait_fraction", "gauge", "spec.rollout.autoscale's scale-up signal: the share "
              "of the trainer's last step spent waiting for groups; no sample without autoscale or before the "
              "trainer's first step.", ("namespace", "job")),
    MetricDef("grpojob_job_autoscale_idle_fraction", "gauge", "spec.rollout.autoscale's scale-down signal: the "
              "rollout servers' idle share of the trainer's last step; no sample without autoscale or before it is "
              "known.", ("namespace", "job")),
)

ALL = TRAINER + TRAINER_JUDGES + ROLLOUT + JUDGE + OPERATOR
BY_NAME = {m.name: m for m in ALL}


def series_names() -> set[str]:
    """Every series name Prometheus will see (histograms expand, counters keep _total)."""
    out = set()
    for m in ALL:
        out.add(m.name)
        if m.kind == "histogram":
            out.update({m.name + "_bucket", m.name + "_sum", m.name + "_count"})
    return out
