"""calibrate_noise: never overshoots the target, is tight, agrees with Opacus, and is cached."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dptune.privacy.prv as prv
from dptune.privacy import cache, calibrate_noise, epsilon_spent


@settings(max_examples=8, deadline=None, derandomize=True)
@given(epsilon=st.floats(0.3, 10.0), q=st.floats(0.005, 0.3), steps=st.integers(5, 400))
def test_sigma_never_exceeds_target_and_is_tight(epsilon, q, steps):
    sigma = calibrate_noise(epsilon, 1e-5, q, steps)
    assert epsilon_spent(sigma, 1e-5, q, steps) <= epsilon
    # the smallest such σ to 0.5%: a little less noise overshoots
    assert epsilon_spent(sigma / 1.005, 1e-5, q, steps) > epsilon


def test_no_larger_than_opacus():
    from opacus.accountants.utils import get_noise_multiplier

    ours = calibrate_noise(3.0, 1e-5, 0.02, 489)
    theirs = get_noise_multiplier(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.02, steps=489,
                                  accountant="prv")
    assert ours <= theirs


@pytest.mark.parametrize("kwargs,field", [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"), (dict(epsilon=float("inf")), "epsilon"),
    (dict(delta=2.0), "delta"), (dict(sample_rate=0.0), "sample_rate"), (dict(steps=0), "steps"),
])
def test_bad_input_names_the_argument(kwargs, field):
    args = dict(epsilon=1.0, delta=1e-5, sample_rate=0.1, steps=10) | kwargs
    with pytest.raises(ValueError, match=field):
        calibrate_noise(**args)


def test_infeasible_target_is_a_clear_error():
    with pytest.raises(ValueError, match="epsilon=5000"):
        calibrate_noise(5000.0, 1e-5, 0.5, 3)  # needs σ far below any useful value


def test_cached_in_memory_and_on_disk(monkeypatch, tmp_path):
    calls = []
    original = prv.compose_epsilon
    monkeypatch.setattr(prv, "compose_epsilon", lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.setenv("DPTUNE_CACHE_DIR", str(tmp_path))   # an empty disk cache …
    cache.clear_memory()                                     # … and memory: the first call must compute
    first = calibrate_noise(2.0, 1e-5, 0.05, 60)
    assert calls, "the first calibration must run the accountant"
    calls.clear()
    assert calibrate_noise(2.0, 1e-5, 0.05, 60) == first and not calls  # memory
    cache.clear_memory()
    assert calibrate_noise(2.0, 1e-5, 0.05, 60) == first and not calls  # disk
