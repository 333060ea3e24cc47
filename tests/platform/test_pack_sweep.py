"""Packed trials in a sweep (issue 36, part 2): configurations that differ only in C, η and ε run as
one Ray Tune trial; each member is still one row in the store with its own status and curve, equal
to the same sweep run unpacked (the independent reference: every configuration its own trial); a
diverging member is recorded with its message while the others finish; the scheduler stops members
alone, as Ray Tune's own ASHA decides on the members' results."""
import math

import pandas as pd
import pytest
from ray.tune.schedulers.async_hyperband import _Bracket

from collections import deque

from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.sweep.pack_policy import PackPolicy, PackSpeeds, pack_key, take_pack
from dptune.platform.sweep.searcher import SweepSearcher
from dptune.platform.sweep.spec_sections import Resources
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import run_sweep
from sweep_plans import digits_spec, plan_of


def rows_of(tmp_path, name: str, spec: dict, resources: Resources = Resources()):
    settings = RunSettings(experiment=name, storage=str(tmp_path), max_failures=0, verbose=0, resources=resources)
    outcome = run_sweep(plan_of(spec), settings)
    store = ResultsStore(settings.paths.store)
    return outcome, store.table("trials").set_index("config_id"), store.table("epochs")


def test_a_packed_sweep_records_every_member_as_the_sweep_run_apart(local_ray, tmp_path, capsys):
    # two ε × two C × η multipliers {1, 1e38} at one B and seed; clip-equivalence hands out each (B, η)'s
    # larger C first, so (one slot: nothing to split over) two packs of four (C = 2, then C = 0.5); the 4
    # with η × 1e38 diverge
    spec = dict(epsilon=[2.0, 8.0], batch_size=[64], clip_bound=[0.5, 2.0], multipliers=[1.0, 1e38], epochs=2,
                model_options={"hidden": 32})
    packed, rows, epochs = rows_of(tmp_path, "packed", digits_spec(**spec, search={"pack": "on"}),
                                   Resources(max_concurrent=1))
    apart, reference, reference_epochs = rows_of(tmp_path, "apart", digits_spec(**spec))
    assert len(packed.results) == 2 and len(apart.results) == 8     # two Ray Tune trials against eight
    assert (packed.finished, packed.errored) == (apart.finished, apart.errored) == (4, 4)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert sum(" finished " in line for line in lines) == 8 and sum(" ERRORED " in line for line in lines) == 8

    assert sorted(rows.index) == sorted(reference.index) and rows.trial_id.is_unique
    assert rows.trial_id.str.fullmatch(r".+-m[0-7]").all()
    for config_id, row in rows.iterrows():
        alone = reference.loc[config_id]
        assert row.status == alone.status
        assert (row.epsilon, row.clip_bound, row.learning_rate, row.batch_size) == \
            (alone.epsilon, alone.clip_bound, alone.learning_rate, alone.batch_size)
        assert row.noise_multiplier == alone.noise_multiplier and row.steps == alone.steps
        mine = epochs[epochs.trial_id == row.trial_id].sort_values("epoch")
        theirs = reference_epochs[reference_epochs.trial_id == alone.trial_id].sort_values("epoch")
        assert list(mine.epoch) == list(theirs.epoch)
        if row.status == "error":
            assert row.learning_rate > 1e37 and "loss became" in row.error and "loss became" in alone.error
            continue
        assert pd.isna(row.error) and row.step == row.steps
        assert row.accuracy == pytest.approx(alone.accuracy, abs=1 / 360)
        assert row.loss == pytest.approx(alone.loss, rel=1e-4)
        assert row.epsilon_spent == alone.epsilon_spent <= row.epsilon
        assert row.clipped_fraction == pytest.approx(alone.clipped_fraction, abs=2e-3)
        assert list(mine.accuracy) == pytest.approx(list(theirs.accuracy), abs=1 / 360)


def test_the_scheduler_stops_members_of_a_pack_alone_as_ray_tunes_asha_decides(local_ray, tmp_path):
    # one cell, one B: four members in one ASHA group; rungs at 10 and 20 steps (epoch ends 12 and 23 of 34)
    spec = digits_spec(epsilon=[4.0], batch_size=[128], multipliers=[0.5, 2.0, 8.0, 32.0], epochs=3,
                       model_options={"hidden": 32},
                       search={"pack": "on", "scheduler": {"name": "asha", "grace_steps": 10, "reduction_factor": 2}})
    outcome, rows, epochs = rows_of(tmp_path, "asha", spec, Resources(max_concurrent=1))   # one slot: one pack
    assert len(outcome.results) == 1 and outcome.errored == 0
    assert set(rows.status) == {"finished", "stopped"}
    order = rows.sort_values("trial_id")          # members report in their order within each epoch
    # Ray Tune's own ASHA bracket, fed each member's result at each epoch end, takes the same decisions
    bracket = _Bracket(min_t=10, max_t=2**31, reduction_factor=2, s=0)
    alive = list(order.trial_id)
    for epoch in (1, 2, 3):
        for trial_id in list(alive):
            at = epochs[(epochs.trial_id == trial_id) & (epochs.epoch == epoch)]
            assert len(at) == 1, (trial_id, epoch)
            row = at.iloc[0]
            decision = bracket.on_result(type("T", (), {"trial_id": trial_id})(), row.step, row.accuracy)
            if decision == "STOP" and row.step < order.set_index("trial_id").steps[trial_id]:
                alive.remove(trial_id)
                assert epochs[epochs.trial_id == trial_id].epoch.max() == epoch   # it stopped here, alone
    stopped = set(order[order.status == "stopped"].trial_id)
    assert stopped == set(order.trial_id) - set(alive) and 0 < len(stopped) < 4
    for row in order.itertuples():
        if row.status == "stopped":
            assert row.step < row.steps and row.epsilon_spent < row.epsilon
        else:
            assert row.step == row.steps and not math.isnan(row.accuracy)


def test_a_group_ready_is_split_over_the_free_slots_so_that_none_idles():
    """12 configurations that may share a pack, two slots: two packs of 6 (one pack of 12 left a core
    idle: 0.88× the sweep run apart); with one slot taken, the rest in one; never above max_members."""
    def entries(n, b=64):
        return deque((0, f"p{i}", {"epsilon": 2.0, "batch_size": b, "clip_bound": 0.1 * (i + 1)}) for i in range(n))

    def sizes(n, policy, running):
        pending, out = entries(n), []
        while pending:
            out.append(len(take_pack(pending, policy, running=running)))
            running += 1
        return out

    assert sizes(12, PackPolicy(slots=2), 0) == [6, 6]
    assert sizes(12, PackPolicy(slots=2), 1) == [12]            # one slot free: all of it there
    assert sizes(3, PackPolicy(slots=2), 0) == [2, 1]
    assert sizes(12, PackPolicy(slots=4), 0) == [3, 3, 3, 3]
    assert sizes(12, PackPolicy(slots=1), 0) == [12]
    assert sizes(40, PackPolicy(slots=1, max_members=16), 0) == [16, 16, 8]
    mixed = entries(4) + entries(2, b=32)                     # another B: its own packs, the order kept
    first = take_pack(mixed, PackPolicy(slots=2), running=0)
    assert [e[1] for e in first] == ["p0", "p1"] and [e[1] for e in mixed] == ["p2", "p3", "p0", "p1"]
    assert [e[2]["batch_size"] for e in mixed] == [64, 64, 32, 32]

    # the searcher: the first two suggestions of a cell of 12 configurations at one B, one seed
    plan = plan_of(digits_spec(epsilon=[2.0], batch_size=[64], clip_bound=[0.1, 0.3, 1.0, 3.0], multipliers=[0.5, 1.0, 2.0],
                               search={"pack": "on", "bracket": "off", "scheduler": "none", "proxy": "off"}))
    searcher = SweepSearcher(plan, metric="test_accuracy", clip_equivalence=False, pack=PackPolicy(slots=2))
    first, second = searcher.suggest("a"), searcher.suggest("b")
    assert len(first["pack"]) == len(second["pack"]) == 6
    assert {m["clip_bound"] for m in first["pack"] + second["pack"]} == {0.1, 0.3, 1.0, 3.0}


def test_on_a_cpu_a_group_packs_only_while_its_packs_cost_less_per_configuration_step():
    """The searcher weighs its own trials: a lone trial's training seconds per step against a pack's
    per configuration-step (its members' steps); a group's first configuration runs alone, to be
    measured; a group whose packs do not cost 1.2× less is handed out alone from then on, one whose
    packs do (or that is not measured both ways yet) still packs."""
    plan = plan_of(digits_spec(epsilon=[2.0], batch_size=[64], clip_bound=[0.1, 1.0, 3.0], multipliers=[1.0],
                               search={"pack": "on", "bracket": "off", "scheduler": "none", "proxy": "off"}))
    searcher = SweepSearcher(plan, metric="test_accuracy", clip_equivalence=False,
                             pack=PackPolicy(slots=2, measured=True))
    alone, pack = searcher.suggest("a"), searcher.suggest("b")   # three ready: the first alone, to be measured
    assert "pack" not in alone and len(pack["pack"]) == 2          # the other two packed in the other slot
    key = pack_key(alone)
    assert searcher.speeds.pays(key)                               # nothing measured yet
    searcher.on_trial_complete("a", {"test_accuracy": 0.5, "score": 0.5, "step": 100, "steps": 100, "train_time_s": 1.0})
    assert searcher.speeds.pays(key)                               # only the lone trials measured
    searcher.on_trial_complete("b", {"step": 100, "steps": 100, "train_time_s": 2.4, "member_steps": 200,
                                     "members": {str(k): {"step": 100, "steps": 100, "test_accuracy": 0.5, "score": 0.5}
                                                 for k in range(2)}})
    assert searcher.speeds.per_step(key) == {"alone": pytest.approx(0.010), "packed": pytest.approx(0.012)}
    assert not searcher.speeds.pays(key)                           # 12 ms per configuration-step packed > 10 ms alone

    def entries(n, b=64):
        return deque((0, f"p{i}", {"epsilon": 2.0, "batch_size": b, "clip_bound": 0.1 * (i + 1)}) for i in range(n))

    speeds = PackSpeeds()
    speeds.record([entries(1)[0][2]], {"step": 100, "train_time_s": 1.0})
    speeds.record([e[2] for e in entries(4)], {"member_steps": 400, "train_time_s": 4.4})
    measured = PackPolicy(slots=1, measured=True)
    assert len(take_pack(entries(4), measured, speeds=speeds)) == 1                       # 11 ms > 10 ms: alone
    assert len(take_pack(entries(4), PackPolicy(slots=1), speeds=speeds)) == 4             # a GPU's: not measured
    other = entries(4, b=32)                                                              # another B: unmeasured
    assert [len(take_pack(other, measured, speeds=speeds)) for _ in range(2)] == [1, 3]   # one alone, to measure
    speeds.record([e[2] for e in entries(4)], {"member_steps": 400, "train_time_s": 1.0})   # 5.4 s / 800: 1.48×
    assert len(take_pack(entries(4), measured, speeds=speeds)) == 4
    close = PackSpeeds()
    close.record([entries(1)[0][2]], {"step": 100, "train_time_s": 1.0})
    close.record([e[2] for e in entries(4)], {"member_steps": 400, "train_time_s": 3.6})    # 9 ms: only 1.11×
    assert not close.pays(pack_key(entries(1)[0][2]))


def test_a_member_that_ended_is_told_to_its_cell_before_its_pack_ends():
    """A pack member the pack reports ended (stopped at step 10 of 20) is a result for its cell at that
    report: the next C of its clip-equivalence chain is handed out while its pack still trains the
    others, and the pack's end tells each member once — every configuration is handed out once."""
    plan = plan_of(digits_spec(epsilon=[2.0], batch_size=[64], clip_bound=[0.5, 2.0], multipliers=[0.5, 1.0],
                               search={"pack": "on", "bracket": "off", "scheduler": "none", "proxy": "off"}))
    searcher = SweepSearcher(plan, metric="test_accuracy", pack=PackPolicy(slots=1))
    pack = searcher.suggest("a")
    assert [m["clip_bound"] for m in pack["pack"]] == [2.0, 2.0]   # each η's largest C first
    assert searcher.suggest("b") is None                            # the C = 0.5 wait for them

    def member(status, step, value=0.5):
        return {"member_status": status, "step": step, "steps": 20, "test_accuracy": value, "score": value,
                "fully_clipped": 0}

    searcher.on_trial_result("a", {"epoch": 1, "members/0/member_status": "ended", "members/0/step": 10,
                                   "members/0/steps": 20, "members/0/score": 0.4, "members/0/test_accuracy": 0.4,
                                   "members/0/fully_clipped": 0,
                                   **{f"members/1/{k}": v for k, v in member("running", 10).items()}})
    nxt = searcher.suggest("b")                                      # Tune's flat result: member 0 stopped
    assert nxt["clip_bound"] == 0.5 and nxt["learning_rate"] == pack["pack"][0]["learning_rate"]
    searcher.on_trial_complete("a", {"members": {"0": member("ended", 10, 0.4), "1": member("ended", 20)}})
    last = searcher.suggest("c")
    assert last["clip_bound"] == 0.5 and last["learning_rate"] == pack["pack"][1]["learning_rate"]
    for trial_id in ("b", "c"):
        searcher.on_trial_complete(trial_id, {**member("ended", 20), "step": 20})
    assert searcher.suggest("d") == "FINISHED" and searcher.unrun() == 0
    assert len(searcher.cells[0].finished) == 4                     # each configuration's result once


class Recorder:
    """A callback that notes what it is told: (hook, trial id, the trial's last result's epoch)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, hook):
        return lambda iteration, trials, trial=None, *args, **info: self.calls.append(
            (hook, trial.trial_id, (trial.last_result or {}).get("epoch")))


def test_a_member_that_ended_leaves_the_live_views_at_the_report_that_says_so():
    """A member stopped (or diverged) after epoch 1 is passed on as ended when the pack's epoch-2
    report says so, with its own last result (Ray Tune hands callbacks a result before it updates
    the trial); the pack's end then passes on only the others, each once."""
    from types import SimpleNamespace

    from dptune.platform.sweep.packs import PerMember

    pack = SimpleNamespace(trial_id="p", config={"pack": [{"clip_bound": 1.0}, {"clip_bound": 2.0}, {"clip_bound": 3.0}]},
                           last_result=None)
    recorder = Recorder()
    views = PerMember(recorder)
    running = {"member_status": "running", "step": 10, "steps": 20}
    first = {"epoch": 1, "members": {str(k): {**running, "epoch": 1} for k in range(3)}}
    views.on_trial_result(0, [pack], pack, first)
    pack.last_result = first
    second = {"epoch": 2, "members": {
        "0": {"epoch": 2, "member_status": "ended", "step": 20, "steps": 20},
        "1": {"epoch": 1, "member_status": "ended", "step": 10, "steps": 20},                          # stopped
        "2": {"epoch": 2, "member_status": "ended", "step": 20, "steps": 20, "error": "loss became nan"}}}
    views.on_trial_result(1, [pack], pack, second)
    ends = [c for c in recorder.calls if c[0] in ("on_trial_complete", "on_trial_error")]
    assert ends == [("on_trial_complete", "p-m0", 2), ("on_trial_complete", "p-m1", 1), ("on_trial_error", "p-m2", 2)]
    pack.last_result = second
    views.on_trial_complete(2, [pack], pack)
    assert [c for c in recorder.calls if c[0] in ("on_trial_complete", "on_trial_error")] == ends   # once each


def test_denoised_observed_and_non_private_trials_pack_and_record_as_the_sweep_run_apart(local_ray, tmp_path):
    """ε ∈ {4, inf} with RMT denoising and the cosine diagnostic: the private configurations pack
    (denoised and observed per member), the non-private baselines pack among themselves (never with a
    private member), and every row and epoch equals the same sweep run unpacked. Before: all six alone."""
    spec = dict(epsilon=[4.0, float("inf")], batch_size=[64], clip_bound=[0.5, 2.0], multipliers=[0.1, 0.4],
                model_options={"hidden": 32}, trial={"denoise": "rmt", "diagnostics": ["denoise_cosine"]})
    packed, rows, epochs = rows_of(tmp_path, "packed", digits_spec(**spec, search={"pack": "on"}),
                                   Resources(max_concurrent=1))
    apart, reference, reference_epochs = rows_of(tmp_path, "apart", digits_spec(**spec))
    packs = [[m["epsilon"] for m in trial.config["pack"]] for trial in packed.results if "pack" in trial.config]
    assert [4.0, 4.0] in packs and [math.inf, math.inf] in packs and len(packed.results) < len(apart.results)
    assert sorted(rows.index) == sorted(reference.index)
    for config_id, row in rows.iterrows():
        alone = reference.loc[config_id]
        assert row.status == alone.status
        if row.status == "equivalent":   # C = 0.5 clipped every example at C = 2: recorded, not trained
            continue
        assert row.accuracy == pytest.approx(alone.accuracy, abs=1 / 360)
        assert row.loss == pytest.approx(alone.loss, rel=1e-4)
        assert row.epsilon_spent == pytest.approx(alone.epsilon_spent, nan_ok=True)   # the store's NaN: none
        mine = epochs[epochs.trial_id == row.trial_id].iloc[-1]
        theirs = reference_epochs[reference_epochs.trial_id == alone.trial_id].iloc[-1]
        private = row.epsilon == 4.0   # the store holds a baseline's ε = inf as NULL
        assert private or pd.isna(row.epsilon)
        for figure in ("denoise_gate_rate", "nonprivate_cos_denoised", "nonprivate_cos_noisy"):
            if private:
                assert mine[figure] == pytest.approx(theirs[figure], rel=1e-3, nan_ok=True), figure
            else:
                assert pd.isna(mine.get(figure)) and pd.isna(theirs.get(figure))
        assert not private or 0 < mine["nonprivate_cos_noisy"] < 1   # observed, per member
