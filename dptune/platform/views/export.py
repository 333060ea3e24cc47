"""`dptune export`: the thing to share from a sweep — a trained model, its configuration and its ε.

A sweep's experiment folder holds far more than its release: every trial's model and curve, and
under private selection every noisy score and the secret K ("Hyperparameter Tuning with Renyi
Differential Privacy", Papernot & Steinke, ICLR 2022). That folder is as private as the training
data. What may leave it, per trial exported, is:

```
<out>/<trial id>/model.safetensors   the final weights (every tensor of the model's state dict)
<out>/<trial id>/release.json        configuration, ε and δ and what they cover, the released scores
```

Only a trial that ran with secure randomness is exported (a reproducible one's noise can be
regenerated from its seed). Without ``--trial``, the released model of each private-selection
cell: its ε is the cell's total ε, tuning included. With ``--trial``, one finished trial: under
private selection it must be a released one (any other would spend privacy the total ε does not
cover); otherwise its ε covers its training run only, not its choice among the sweep's trials
(made on a non-private metric), and release.json says so.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import TextIO

import pandas as pd

from ...errors import NotFound, UserError
from ..store.layout import ExperimentPaths
from ..store.results_store import ResultsStore

#: What release.json says the ε covers.
COVERS_SELECTION = "training and the private selection of this model among the cell's trials (tuning included)"
COVERS_TRAINING = ("this training run only: NOT the choice of this trial among the sweep's trials, which "
                   "compared a non-private metric")
#: Training options that say nothing about the model and are left out of release.json.
LOCAL_OPTIONS = ("device", "data_dir", "max_physical_batch_size")


def releasable(trials: pd.DataFrame, trial_id: str | None) -> pd.DataFrame:
    """The ``trials`` rows to export (each cell's released model, or ``trial_id``), refusing with a
    :class:`UserError` anything that is not a private release."""
    if trial_id is None:
        chosen = trials[trials["selected"].fillna(False).astype(bool)] if "selected" in trials else trials.iloc[:0]
        if chosen.empty:
            raise UserError("no released model in this store: a private-selection sweep releases one per cell "
                            "when its K trials have ended; for another sweep name the trial with --trial")
    else:
        chosen = trials[trials["trial_id"] == trial_id]
        if chosen.empty:
            raise NotFound(f"--trial: no trial {trial_id!r} in this store")
        row = chosen.iloc[0]
        if row["status"] != "finished":
            raise UserError(f"--trial: trial {trial_id} is {row['status']}, not finished")
        if pd.notna(row.get("selection_k")) and not bool(row.get("selected")):
            raise UserError(f"--trial: trial {trial_id} was not selected: under private selection only the "
                            "released model of a cell may leave the experiment (the total ε covers that one)")
    for _, row in chosen.iterrows():
        if not bool(row.get("private", True)) or not math.isfinite(float(row["epsilon"])):
            raise UserError(f"trial {row['trial_id']} is a non-private baseline (ε = ∞): nothing private to release")
        mode = row.get("randomness")
        if mode != "secure":
            raise UserError(f"trial {row['trial_id']} ran with {mode or 'reproducible'} randomness: its batches and "
                            "noise can be regenerated from its seed, so its model is not private; rerun it with "
                            "trial: {randomness: secure}")
    return chosen


def release_record(row: pd.Series, config: dict) -> dict:
    """release.json of one trial: its configuration, privacy and released scores (never K or the trial's
    draw: those stay in the experiment)."""
    selected = pd.notna(row.get("selection_k"))
    epsilon = float(row["total_epsilon"]) if selected else float(row["epsilon_spent"])
    record = {"trial_id": row["trial_id"], "cell": row["cell"],
              "configuration": {k: v for k, v in config.items() if k not in LOCAL_OPTIONS},
              "privacy": {"epsilon": epsilon, "delta": float(row["delta"]), "randomness": "secure",
                          "covers": COVERS_SELECTION if selected else COVERS_TRAINING,
                          "noise_multiplier": float(row["noise_multiplier"]), "steps": int(row["steps"]),
                          "sample_rate": float(row["sample_rate"])}}
    if selected:
        record["noisy_validation_score"] = float(row["selection_score"])
        record["test_accuracy"] = float(row["test_accuracy"])
    elif pd.notna(row.get("test_accuracy")):
        record["test_accuracy"] = float(row["test_accuracy"])
    return record


def export_release(store: str, out_dir: str, *, trial_id: str | None = None, out: TextIO | None = None) -> list[str]:
    """Export the release of a local experiment (see the module docstring); returns the folders written."""
    from safetensors.torch import save_file

    from .checkpoint_gradients import trained_state

    paths = ExperimentPaths.find(store)
    if paths.is_uri:
        raise UserError(f"export reads checkpoints from a local experiment folder; copy {paths.root} here first")
    chosen = releasable(ResultsStore(paths.store).table("trials"), trial_id)
    written = []
    for _, row in chosen.iterrows():
        state = trained_state(paths.root, str(row["trial_id"]))
        folder = os.path.join(out_dir, str(row["trial_id"]))
        os.makedirs(folder, exist_ok=True)
        save_file({k: v.detach().contiguous().clone() for k, v in state.model.items()},
                  os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        record = release_record(row, state.config)
        with open(os.path.join(folder, "release.json"), "w") as f:
            json.dump(record, f, indent=1)
        written.append(folder)
        print(f"exported trial {row['trial_id']} ({row['cell']}): ε={record['privacy']['epsilon']:.3g}, "
              f"δ={record['privacy']['delta']:g} covering {record['privacy']['covers']}; to {folder}", file=out)
    return written
