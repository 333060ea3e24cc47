"""Trials a resumed sweep does not train again: those the results store already holds as ended.

Ray Tune snapshots its experiment state on a timer (every ≥ 10 s) and uploads the files of a
snapshot one by one, so after the driver is killed the snapshot can lag the store: a trial that
finished may come back as running (and train its last epoch again), and a searcher state older
than the trial list hands out a configuration a second time under a new trial id. The store is
written when a trial ends, so it is the record of what ended: ``dptune resume`` reads it once, and
a trial whose configuration it holds as finished or stopped reports the stored result instead of
training (the store callback then leaves the stored rows as they are); a pack all of whose members
it holds reports theirs.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Callable

from ...schema import DEFAULT_METRIC, METRICS, SCORE
from ...schema.metrics import SCORES
from . import tune_adapter
from .trial_config import PACK
from ..store.results_store import ResultsStore, selected_values

#: Set in the one report of a trial that was kept from the store (the store callback skips it).
KEPT = "kept_from_store"
#: Results a kept trial reports again (what the searcher, schedulers and progress lines read).
RESULT_COLUMNS = (*METRICS, SCORE, *SCORES, "epsilon_spent", "epoch", "step", "steps", "fully_clipped", "noise_multiplier",
                  "sample_rate", "noise_sqrt_steps", "clipped_fraction", "train_time_s")


def config_id(config: dict) -> str:
    """A trial configuration's identity (its Ray Tune config, canonical JSON, hashed)."""
    text = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def kept_results(store: ResultsStore) -> dict[str, dict]:
    """{config id: final result} of every trial the store holds as finished, stopped or a finished
    proxy run, whole (one
    recorded without its curve, its checkpoint lost, trains again if Ray Tune hands it out)."""
    trials = store.table("trials")
    if "config_id" not in trials.columns or "status" not in trials.columns:  # empty, or written before config ids
        return {}
    whole = trials.error.isna() if "error" in trials.columns else True
    ended = trials[trials.status.isin(["finished", "stopped", "proxy"]) & trials.config_id.notna() & whole]
    ended = ended.assign(**{SCORE: selected_values(ended)["score"]})   # a store written before the score: signed here
    return {row["config_id"]: {k: _scalar(row[k]) for k in RESULT_COLUMNS if k in row and _scalar(row[k]) is not None}
            for _, row in ended.iterrows()}


def keeping(trainable: Callable[[dict], None], kept: dict[str, dict]) -> Callable[[dict], None]:
    """``trainable``, except that a configuration in ``kept`` reports its stored result and ends."""
    @functools.wraps(trainable)
    def run(config: dict, **options: object) -> None:
        if PACK in config:   # a pack is kept when all its members are
            results = [kept.get(config_id(c)) for c in config[PACK]]
            if None in results:
                trainable(config, **options)
            else:
                metric = config[PACK][0].get("metric", DEFAULT_METRIC)   # Ray Tune wants it in every result
                tune_adapter.report({metric: math.nan, SCORE: math.nan, KEPT: 1, "members": {str(k): {**r, KEPT: 1, "member_status": "ended"}
                                                          for k, r in enumerate(results)}})
            return
        result = kept.get(config_id(config))
        if result is None:
            trainable(config, **options)
        else:
            tune_adapter.report({**result, KEPT: 1})
    return run


def _scalar(value: object) -> float | int | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None if value is None or not hasattr(value, "item") else _scalar(value.item())
    return None if isinstance(value, float) and not math.isfinite(value) else value
