"""The C* diagnostic of `dptune optimal-clip`: summary lines, a figure and a JSON record.

C* is Theorem 5.2 of "On optimal hyperparameters for DP deep transfer learning" (ICLR 2026).

NOT differentially private: the input is the true per-sample gradients of private training
examples (at a trial's checkpoint). The gradients themselves come from the caller (the CLI reads
the checkpoint through the platform), so this module needs only numpy and matplotlib.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TextIO

import numpy as np

from .optimal_clipping import clip_mse, clip_summary, per_sample_norms
from .figures import clip_mse_figure, save

WARNING = ("NON-PRIVATE DIAGNOSTIC: computed from the true per-sample gradients of private training examples; "
           "not differentially private. Do not publish it as DP output.")


def source_label(source: str) -> str:
    """A short name for a gradient source: "trial <id>, checkpoint_…" for a Ray checkpoint's state file."""
    path = Path(source)
    trial = re.search(r"_([0-9a-f]{5}_\d{5})_", path.parent.parent.name)
    return f"trial {trial.group(1)}, {path.parent.name}" if trial else path.name


def clip_diagnostic(grads: np.ndarray, labels: np.ndarray, noise_multiplier: float, clip_bound: float, *,
                    source: str, out: TextIO, folder: str | Path | None = None) -> dict:
    """Print C*, MSE(C*) against MSE at the trial's C, and per-class retention at both; with
    ``folder``, also write ``optimal_clip.png``/``.svg`` (MSE curve, retention) and ``optimal_clip.json``."""
    s = clip_summary(grads, labels, noise_multiplier, clip_bound)
    best, given = s["optimal"], s["given"]
    print(WARNING, file=out)
    print(f"source: {source}", file=out)
    print(f"n = {s['n']} examples, d = {s['dim']:,} parameters, σ = {noise_multiplier:.4g}; "
          f"norm 10/50/90% = " + "/".join(f"{v:.4g}" for v in s["norm_quantiles"].values()), file=out)
    print(f"C* = {s['c_star']:.6g} (Theorem 5.2, exact): MSE = {best['mse']:.4g} = bias {best['bias']:.4g} "
          f"+ noise {best['noise']:.4g}; {best['clipped_fraction']:.0%} clipped", file=out)
    ratio = given["mse"] / best["mse"] if best["mse"] > 0 else float("inf")
    print(f"trial's C = {clip_bound:g}: MSE = {given['mse']:.4g} ({ratio:.3g} × the minimum) = bias "
          f"{given['bias']:.4g} + noise {given['noise']:.4g}; {given['clipped_fraction']:.0%} clipped", file=out)
    print("class  n_y  retention w_y at C*  at the trial's C", file=out)
    counts = dict(zip(*np.unique(labels, return_counts=True)))
    for label, w in given["retention"].items():
        at_star = best["retention"].get(label, float("nan"))
        print(f"{label!s:>5}  {counts.get(label, 0):>3}  {at_star:>19.3f}  {w:>15.3f}", file=out)
    if folder is not None:
        folder = Path(folder)
        fig = clip_mse_figure(clip_mse(grads, noise_multiplier), per_sample_norms(grads), labels,
                              trial_clip=clip_bound, title=f"C* from {s['n']} examples, {source_label(source)}")
        paths = save(fig, folder / "optimal_clip") + [folder / "optimal_clip.json"]
        record = {**s, "nonprivate": True, "source": source}
        paths[-1].write_text(json.dumps(record, indent=1, default=str))
        for path in paths:
            print(f"wrote {path}", file=out)
    return s
