"""batch_plan: σ and T against direct calibrate_noise calls, the pruning rules, B > N."""
import math

import numpy as np
import pandas as pd
import pytest

from dptune.privacy import calibrate_noise
from dptune.search_spaces import batch_plan, prune_batches
from dptune.search_spaces.batches import COLUMNS, REASONS

N, EPOCHS = 200, 2
CANDIDATES = [5, 10, 20, 40, 100, 400]


def test_sigma_and_steps_agree_with_direct_calibration():
    plan = batch_plan(1.0, 1e-5, N, EPOCHS, CANDIDATES, min_steps=1, plateau_tol=10.0)
    assert list(plan.columns) == list(COLUMNS)
    assert plan["batch_size"].tolist() == CANDIDATES
    fits = plan[plan["batch_size"] <= N]
    for row in fits.itertuples():
        steps = math.ceil(EPOCHS * N / row.batch_size)
        assert row.steps == steps and row.sample_rate == row.batch_size / N
        sigma = calibrate_noise(1.0, 1e-5, row.batch_size / N, steps)
        assert row.noise_multiplier == sigma
        assert row.noise_sqrt_steps == pytest.approx(sigma * math.sqrt(steps), rel=1e-12)
    # a larger q needs more noise per step: the rows are not copies of one value
    assert fits["noise_multiplier"].is_monotonic_increasing and fits["noise_multiplier"].nunique() == len(fits)


def test_batch_larger_than_dataset_is_rejected():
    plan = batch_plan(1.0, 1e-5, N, EPOCHS, [20, 200, 400], min_steps=1, plateau_tol=10.0)
    too_big = plan.set_index("batch_size").loc[400]
    assert not too_big["kept"] and too_big["reason"] == "exceeds_dataset"
    assert math.isnan(too_big["noise_multiplier"]) and math.isnan(too_big["noise_sqrt_steps"])
    assert plan.set_index("batch_size").loc[200, "kept"]          # B = N (q = 1) is allowed


def test_min_steps_rule_on_a_hand_checked_case():
    # T = ⌈2·200/B⌉: 80, 40, 20, 10, 4 → with min_steps 20, B = 40 (T 10) and 100 (T 4) go.
    plan = batch_plan(1.0, 1e-5, N, EPOCHS, CANDIDATES, min_steps=20, plateau_tol=10.0).set_index("batch_size")
    assert plan.loc[[40, 100], "reason"].tolist() == ["min_steps", "min_steps"]
    assert plan.loc[[5, 10, 20], "kept"].all() and plan.loc[[5, 10, 20], "reason"].isna().all()
    assert plan.loc[400, "reason"] == "exceeds_dataset"
    assert not np.isnan(plan.loc[[40, 100], "noise_multiplier"]).any()  # σ still shown for dropped B
    assert set(plan["reason"].dropna()) <= set(REASONS)


def test_plateau_rule_on_a_hand_checked_case():
    frame = pd.DataFrame({"batch_size": [8, 16, 32, 64, 128, 256], "sample_rate": 0.1,
                          "steps": [400, 200, 100, 50, 25, 12],
                          "noise_multiplier": np.nan,
                          "noise_sqrt_steps": [13.0, 10.6, 10.4, 10.0, 10.49, 5.0],
                          "kept": False, "reason": [None] * 6})
    out = prune_batches(frame, min_steps=20, plateau_tol=0.05)
    # B = 256 has T = 12 < 20 and is dropped first, so the floor is 10.0 (B = 64), not 5.0;
    # the plateau is σ√T ≤ 10.5: B = 32, 64, 128 stay; 8 and 16 are off it.
    assert out["reason"].tolist() == ["off_plateau", "off_plateau", None, None, None, "min_steps"]
    assert out["kept"].tolist() == [False, False, True, True, True, False]
    wider = prune_batches(frame, min_steps=20, plateau_tol=0.07)       # 10.7: B = 16 joins
    assert wider["kept"].tolist() == [False, True, True, True, True, False]
    assert frame["reason"].isna().all()                                 # the input is left as it was


def test_real_plateau_matches_the_rule_applied_to_direct_sigmas():
    candidates = CANDIDATES[:5]
    sqrt_t = {b: calibrate_noise(4.0, 1e-5, b / N, math.ceil(EPOCHS * N / b)) * math.sqrt(math.ceil(EPOCHS * N / b))
              for b in candidates}
    floor = min(v for b, v in sqrt_t.items() if math.ceil(EPOCHS * N / b) >= 5)
    tol = 0.25
    expected = [b for b in candidates if math.ceil(EPOCHS * N / b) >= 5 and sqrt_t[b] <= (1 + tol) * floor]
    plan = batch_plan(4.0, 1e-5, N, EPOCHS, candidates, min_steps=5, plateau_tol=tol)
    assert plan.loc[plan["kept"], "batch_size"].tolist() == expected
    assert 0 < len(expected) < 4   # the case is not trivial: some B are off the plateau


def test_lower_epsilon_keeps_smaller_batches_on_the_plateau():
    """Stronger privacy flattens σ√T, so smaller B stay on the plateau (digits, E = 5), as in
    "On optimal hyperparameters for DP deep transfer learning"."""
    candidates = [16, 32, 64, 128, 256, 512, 1024]
    strong = batch_plan(1.0, 1e-5, 1437, 5, candidates)
    weak = batch_plan(4.0, 1e-5, 1437, 5, candidates)
    kept_strong = strong.loc[strong["kept"], "batch_size"].tolist()
    kept_weak = weak.loc[weak["kept"], "batch_size"].tolist()
    assert min(kept_strong) < min(kept_weak)
    assert len(kept_strong) > len(kept_weak)


@pytest.mark.parametrize("kwargs, message", [
    (dict(dataset_size=0), "dataset_size"),
    (dict(epochs=0), "epochs"),
    (dict(candidates=[]), "at least one"),
    (dict(candidates=[0, 8]), "whole numbers >= 1"),
    (dict(min_steps=0), "min_steps"),
    (dict(plateau_tol=-0.1), "plateau_tol"),
])
def test_bad_arguments_fail_before_calibrating(kwargs, message):
    args = dict(epsilon=1.0, delta=1e-5, dataset_size=N, epochs=EPOCHS, candidates=[10])
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        batch_plan(args.pop("epsilon"), args.pop("delta"), args.pop("dataset_size"), args.pop("epochs"),
                   args.pop("candidates"), **args)
