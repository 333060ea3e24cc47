"""The release of private selection: per cell, the trial with the best noisy validation score,
tested once ("Hyperparameter Tuning with Renyi Differential Privacy", Papernot & Steinke, ICLR 2022).

Under ``selection.mode: private`` each cell is one selection. When every one of its K drawn trials
has ended, the trial with the highest noisy score (the earliest draw on a tie) is the released
model; its checkpoint is rebuilt and evaluated on the test split — the only time a private-selection
sweep touches the test data — and its ``trials`` row is rewritten with ``selected = true`` and
``test_accuracy``. A cell already released is not tested again (``dptune resume``), and a cell whose
K trials have not all ended releases nothing (resume it first): the total ε holds for the K drawn.
"""
from __future__ import annotations

import sys
from typing import Iterable, TextIO

from ...schema import BATCH_SIZE, CLIP_BOUND, LEARNING_RATE
from .kept import config_id
from ..store.layout import ExperimentPaths
from ..store.records import epoch_rows, gradnorm_rows, trial_row
from ..store.results_store import ResultsStore
from .trial_config import resolved
from .tune_adapter import checkpoint_state


def selected_test_accuracy(state: dict) -> float:
    """Test accuracy of the model in a trial's final checkpoint state (rebuilt from its config)."""
    from ...schema import TrainConfig
    from ...trainables.training import Trainer   # torch: only where a release is tested

    trainer_state = state["trainer"]
    trainer = Trainer(TrainConfig.from_dict({**trainer_state["config"], "device": "cpu"}))
    trainer.model.load_state_dict(trainer_state["model"], strict=False)
    return float(trainer.task.evaluate(trainer.model, trainer.data.test, trainer.device, "test")["test_accuracy"])


def release_selections(results: Iterable, paths: ExperimentPaths, *, out: TextIO | None = None) -> list[dict]:
    """Release every private cell of a finished sweep; returns the rows written (one per cell released
    now). The scores come from the store (written as each trial ended, so a resumed sweep's kept trials
    count too); the winner's model from its checkpoint in ``results`` (Ray Tune's ResultGrid)."""
    by_config = {config_id(r.config): r for r in results}
    if not any(r.config.get("selection_k") is not None for r in by_config.values()):
        return []
    store = ResultsStore(paths.store)
    rows = store.query("SELECT * FROM trials WHERE selection_k IS NOT NULL")
    written = []
    for cell, group in sorted(rows.groupby("cell"), key=lambda g: g[0]):
        k = int(group.selection_k.iloc[0])
        if group.selected.fillna(False).astype(bool).any():
            continue   # released before: the test data is used once
        ended = group[(group.status == "finished") & group.selection_score.notna()].drop_duplicates("selection_draw")
        if len(ended) < k:
            print(f"dptune: private selection of {cell}: {len(ended)} of its K={k} trials ended; nothing released "
                  "(resume the sweep: the total ε covers exactly the K drawn)", file=out)
            continue
        best = ended.sort_values(["selection_score", "selection_draw"], ascending=[False, True]).iloc[0]
        result = by_config.get(best.config_id)
        state = checkpoint_state(result.checkpoint) if result is not None else None
        if state is None:
            print(f"dptune: private selection of {cell}: the selected trial {best.trial_id} has no checkpoint; "
                  "nothing released", file=out)
            continue
        history = state["history"]
        row = trial_row(best.trial_id, resolved(result.config), {**result.metrics, "history": history},
                        status="finished", experiment=paths.name)
        row["config_id"] = best.config_id
        row.update(selected=True, test_accuracy=selected_test_accuracy(state))
        store.write_trial(row, epoch_rows(history, row["metric"]), gradnorm_rows(history))
        written.append(row)
        print(f"dptune: private selection of {cell}: K={k}, per-trial ε={row['trial_epsilon']:.3g}, total "
              f"ε={row['total_epsilon']:.3g}; released trial {row['trial_id']} (C={row[CLIP_BOUND]:g}, "
              f"B={row[BATCH_SIZE]}, η={row[LEARNING_RATE]:.3g}, noisy score {row['selection_score']:.4f}), "
              f"test accuracy {row['test_accuracy']:.4f}", file=out)
    return written
