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

from ..trainables.config import TrainConfig
from ..trainables.training import Trainer, evaluate
from .callbacks import resolved
from .kept import config_id
from .layout import ExperimentPaths
from .records import epoch_rows, gradnorm_rows, trial_row
from .store import ResultsStore
from .trial_config import unflatten
from .tune_adapter import checkpoint_state


def selected_test_accuracy(state: dict) -> float:
    """Test accuracy of the model in a trial's final checkpoint state (rebuilt from its config)."""
    trainer_state = state["trainer"]
    trainer = Trainer(TrainConfig.from_dict({**trainer_state["config"], "device": "cpu"}))
    trainer.model.load_state_dict(trainer_state["model"], strict=False)
    data = trainer.data
    return float(evaluate(trainer.model, data.test, data.num_classes, trainer.device)["accuracy"])


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def release_selections(results: Iterable, paths: ExperimentPaths, *, out: TextIO = sys.stdout) -> list[dict]:
    """Release every private cell of a finished sweep (``results``: Ray Tune's ResultGrid); returns
    the rows written (one per cell released now)."""
    cells: dict[str, list] = {}
    for result in results:
        spec = unflatten(result.config)
        if spec.get("meta", {}).get("selection_k") is not None:
            cells.setdefault(spec["meta"]["cell"], []).append((result, spec))
    if not cells:
        return []
    store = ResultsStore(paths.store)
    written = []
    for cell, entries in sorted(cells.items()):
        k = int(entries[0][1]["meta"]["selection_k"])
        if store.query(f"SELECT count(*) AS n FROM trials WHERE cell = {_quoted(cell)} AND selected")["n"][0]:
            continue
        ended = [(r, s) for r, s in entries if r.error is None and (r.metrics or {}).get("selection_score") is not None]
        if len(ended) < k:
            print(f"dptune: private selection of {cell}: {len(ended)} of its K={k} trials ended; nothing released "
                  "(resume the sweep: the total ε covers exactly the K drawn)", file=out)
            continue
        result, spec = max(ended, key=lambda e: (e[0].metrics["selection_score"], -e[1]["meta"]["selection_draw"]))
        state = checkpoint_state(result.checkpoint)
        history = state["history"]
        last = {**result.metrics, "history": history}
        row = trial_row(result.metrics["trial_id"], resolved(spec), last, status="finished",
                        experiment=paths.name)
        row["config_id"] = config_id(result.config)
        row.update(selected=True, test_accuracy=selected_test_accuracy(state))
        store.write_trial(row, epoch_rows(history), gradnorm_rows(history))
        written.append(row)
        print(f"dptune: private selection of {cell}: K={k}, per-trial ε={row['trial_epsilon']:.3g}, total "
              f"ε={row['total_epsilon']:.3g}; released trial {row['trial_id']} (C={row['clip_bound']:g}, "
              f"B={row['batch_size']}, η={row['learning_rate']:.3g}, noisy score {row['selection_score']:.4f}), "
              f"test accuracy {row['test_accuracy']:.4f}", file=out)
    return written
