"""Rows of the results store built from a trial's config and its reported history (pure functions)."""
from __future__ import annotations

import math

from ...schema import DEFAULT_METRIC, METRICS, SCORE, names, signed
from ...schema.metrics import SCORES
from .results_store import to_json

#: The trial schema's axes, and its other fields the store keeps as columns (C, B, η, the options
#: that split cells, the seed, the randomness mode).
AXES = names(role="axis")
STORED_FIELDS = tuple(name for name in names(column=True) if name not in AXES)
SELECTION_FIELDS = ("selection_k", "selection_draw", "trial_epsilon", "total_epsilon")
EPOCH_FIELDS = ("epoch", "step", "epsilon_spent", "clipped_fraction", "train_time_s")


def stopped_early(last: dict | None) -> bool:
    """Whether a trial that ended without error took fewer steps than planned (a scheduler stopped it)."""
    last = last or {}
    step, steps = last.get("step"), last.get("steps")
    return step is not None and steps is not None and int(step) < int(steps)


#: What Ray Tune fills in for a trial before its first report (where and when it runs): not a result.
RUN_METADATA = frozenset(("trial_id", "date", "timestamp", "pid", "hostname", "node_ip", "config", "experiment_tag"))


def reported(last: dict | None) -> bool:
    """Whether a trial reported at least once: one the sweep stopped before its first report (an
    error of the input stopped the sweep meanwhile) ran nothing, and gets no row."""
    return bool(set(last or {}) - RUN_METADATA)


def selected_on(metrics: dict, metric: str) -> dict:
    """What a row selected on: the sweep's ``metric`` (its name; its value is in its own column),
    its direction ``metric_mode`` (``max`` or ``min``), its signed ``score`` (higher is better:
    what every ranking reads), its ``loss``, and ``accuracy`` where the metric is an accuracy (test
    or validation accuracy, NOT private, or private selection's noisy score; NULL for a language
    model's NLL)."""
    declared = METRICS[metric]
    value = metrics.get(metric)
    return {"metric": metric, "metric_mode": declared.mode, SCORE: signed(metric, value),
            "accuracy": value if declared.accuracy else None,
            "loss": None if declared.loss is None else metrics.get(declared.loss)}


def trial_row(trial_id: str, config: dict, last: dict | None, *, status: str, error: str | None = None,
              experiment: str = "") -> dict:
    """One ``trials`` row from a trial's flat config (:mod:`dptune.platform.sweep.trial_config`) and last result: axes,
    hyperparameters, privacy figures, final results, status, the config itself."""
    last = last or {}
    metric = config.get("metric") or DEFAULT_METRIC
    row = {"trial_id": trial_id, "experiment": experiment, "status": status, "error": error,
           "cell": config.get("cell")}
    row.update({k: config.get(k) for k in AXES + STORED_FIELDS})
    # backbone and dataset with their options (the cell's labels), e.g. bbc_news[max_length=32]
    row["backbone"] = config.get("backbone_label") or config.get("model")
    row["dataset"] = config.get("dataset_label") or row["dataset"]
    row["private"] = math.isfinite(float(config.get("epsilon", math.inf)))
    for k in ("noise_multiplier", "sample_rate", "steps", "noise_sqrt_steps"):
        row[k] = last.get(k, config.get(k))
    row["step"], row["fully_clipped"] = last.get("step"), last.get("fully_clipped")
    history = last.get("history", [])
    final = history[-1] if history else last  # the checkpointed history is authoritative
    for k in ("epsilon_spent", "clipped_fraction", "train_time_s", "epoch"):
        row[k] = final.get(k)
    row.update(selected_on(final, metric))
    row["per_class_accuracy"] = final.get("per_class_accuracy")
    for k in (*METRICS, *SCORES):   # every metric under its own name; a validation split's are NOT private
        row[k] = final.get(k)
    row["validation_nonprivate"] = bool(final.get("validation_nonprivate", False))
    # private selection: K, this draw, per-trial and total ε, the noisy score (above); the selected
    # trial's row is rewritten with selected = true and its test accuracy (platform/sweep/selection_release.py)
    for k in SELECTION_FIELDS:
        row[k] = config.get(k)
    row["selected"] = False if config.get("selection_k") is not None else None
    # proxy runs (search.proxy) rank at B/k and σ/k: their ε is their own, so a finished one is
    # labelled ``proxy``, never taken as the cell's result; the full-scale answer run is ``final``
    row["proxy_divisor"], row["full_batch_size"] = config.get("proxy_divisor"), config.get("full_batch_size")
    row["final"] = bool(config.get("final", False))
    row["looks"] = config.get("looks")   # racing: the error bars' correction for repeated tests
    if row["proxy_divisor"] is not None and status == "finished":
        row["status"] = "proxy"
    row["config_json"] = to_json(config)
    return row


def epoch_rows(history: list[dict], metric: str = DEFAULT_METRIC) -> list[dict]:
    """One ``epochs`` row per epoch: the curve (the sweep's ``metric``, ``score`` and ``loss``, as in
    the trials row), per-class accuracy and every other scalar metric under its own name."""
    rows = []
    for m in history:
        row = {**{k: m.get(k) for k in EPOCH_FIELDS}, **selected_on(m, metric)}
        row["per_class_accuracy"] = m.get("per_class_accuracy")
        row.update({k: v for k, v in m.items() if k not in row and isinstance(v, (int, float))
                    and not isinstance(v, bool)})
        rows.append(row)
    return rows


def gradnorm_rows(history: list[dict]) -> list[dict]:
    """One ``gradnorms`` row per (epoch, class): non-private per-class norm statistics."""
    rows = []
    for m in history:
        for label, s in (m.get("nonprivate_gradnorms") or {}).items():
            row = {"epoch": m["epoch"], "label": int(label), "count": s["count"],
                   "clipped_fraction": s["clipped_fraction"], "histogram": s.get("histogram")}
            row.update({f"norm_q{round(float(q) * 100):02d}": v for q, v in s["norm_quantiles"].items()})
            rows.append(row)
    return rows
