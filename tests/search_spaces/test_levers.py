"""The levers on by default where they are safe (issue 33, item 1): which a spec gets when it names
none, why each is off where it cannot apply, each turned off by name; where a scheduler can decide
(checked against Ray Tune's own ASHA bracket); and the plan's estimate of what they save."""
import dataclasses
from types import SimpleNamespace

import pytest
from ray.tune.schedulers.async_hyperband import _Bracket

from dptune.search_spaces.spec import SpecError
from dptune.platform.sweep.pack_policy import PackPolicy
from dptune.platform.sweep.spec_sections import Resources
from dptune.privacy.schedule import epoch_end_steps
from dptune.search_spaces import SearchSpace, load_spec, plan_sweep
from dptune.search_spaces.levers import DEFAULT_SCHEDULER, decision_steps, halving_steps, with_levers
from dptune.search_spaces.plan_table import format_plan
from dptune.search_spaces.search_sections import Scheduler


def bare(toy_spec, **overrides) -> dict:
    """The toy spec whose ``search`` names only what ``overrides`` gives (none: no section at all), every
    other lever left to dptune."""
    spec = toy_spec(**overrides)
    spec.pop("search", None)
    if overrides.get("search") is not None:
        spec["search"] = overrides["search"]
    return spec


def levers(spec, catalog) -> dict:
    space = with_levers(SearchSpace.from_spec(load_spec(spec, catalog)), catalog.packable)
    return space, {lever.key: lever for lever in space.levers}


def test_a_spec_that_names_no_lever_gets_all_four_where_safe(catalog, toy_spec):
    space, got = levers(bare(toy_spec), catalog)            # ε ∈ {1, 4}, one seed, grid
    assert all(lever.on for key, lever in got.items() if key != "racing")
    assert not got["racing"].on and "one seed" in got["racing"].why
    assert space.search.scheduler == DEFAULT_SCHEDULER and space.search.scheduler.grace_steps == 20
    assert space.search.proxy_divisor == "auto" and space.search.transfer_radius == 1 and space.search.pack
    assert "on by default" in got["scheduler"].why and "scheduler: none" in got["scheduler"].why


def test_several_seeds_keep_multi_fidelity_but_not_proxies_nor_transfer(catalog, toy_spec):
    space, got = levers(bare(toy_spec, seeds=[0, 1, 2]), catalog)
    assert got["scheduler"].on and not got["transfer"].on and not got["proxy"].on
    assert space.search.proxy_divisor == 1 and "3 seeds: the error bars compare full-scale runs" in got["proxy"].why
    assert space.search.transfer_radius is None and "3 seeds: the error bars and the between-cell" in got["transfer"].why
    assert got["racing"].on and space.search.racing_max_seeds == 10 and space.search.racing_max_added == 0.25
    assert "on by default with 3 seeds" in got["racing"].why and "racing: off" in got["racing"].why
    # named, each still runs with seeds
    space, got = levers(bare(toy_spec, seeds=[0, 1], search={"transfer": {"radius": 2}}), catalog)
    assert got["transfer"].on and space.search.transfer_radius == 2


@pytest.mark.parametrize("search, off, why", [
    ({"scheduler": "none"}, "scheduler", "named off in the spec"),
    ({"scheduler": False}, "scheduler", "named off in the spec"),
    ({"proxy": "off"}, "proxy", "named off in the spec"),
    ({"proxy": False}, "proxy", "named off in the spec"),     # YAML reads `proxy: off` as false
    ({"transfer": "off"}, "transfer", "named off in the spec"),
    ({"algorithm": "random", "budget": 3}, "transfer", "grid searches only (random)"),
    ({"algorithm": "optuna", "budget": 3}, "transfer", "warm_start is its transfer"),
    ({"algorithm": "optuna", "budget": 3, "transfer": "off"}, "pack", "TPE proposes one configuration at a time"),
    ({"pack": "off"}, "pack", "named off in the spec"),
    ({"pack": False}, "pack", "named off in the spec"),
])
def test_each_lever_is_off_by_name_or_where_it_cannot_apply(catalog, toy_spec, search, off, why):
    space, got = levers({**toy_spec(), "search": search}, catalog)
    assert not got[off].on and why in got[off].why
    optuna = search.get("algorithm") == "optuna"   # neither transfer nor packs: both are named in one case
    assert all(lever.on for key, lever in got.items()   # racing: off with one seed
               if key not in (off, "racing") and not (optuna and key in ("transfer", "pack")))
    assert {"scheduler": space.search.scheduler.name == "none", "proxy": space.search.proxy_divisor == 1,
            "transfer": space.search.transfer_radius is None, "pack": not space.search.pack}[off]


@pytest.mark.parametrize("change, why", [
    (dict(axes={"epsilon": [1, 4], "backbone": "resnet", "dataset": "toy", "epochs": 2}),
     "resnet not among the backbones packed by default"),
    (dict(axes={"epsilon": [1, 4], "backbone": {"name": "mlp", "peft": "full"}, "dataset": "toy", "epochs": 2}),
     "mlp[peft=full]"),
])
def test_packs_are_off_for_a_backbone_or_an_option_a_pack_cannot_batch(catalog, toy_spec, change, why):
    catalog = dataclasses.replace(catalog, backbones=("mlp", "cnn", "resnet"))
    _, got = levers(bare(toy_spec, **change), catalog)
    assert not got["pack"].on and why in got["pack"].why


def test_denoising_and_diagnostics_keep_packs_on(catalog, toy_spec):
    """A pack denoises and observes each member's step as its own (tests/trainables/test_packs.py)."""
    _, got = levers(bare(toy_spec, trial={"denoise": "rmt", "diagnostics": ["denoise_cosine"]}), catalog)
    assert got["pack"].on


def test_one_private_eps_has_nothing_to_transfer(catalog, toy_spec):
    _, got = levers(bare(toy_spec, axes={"epsilon": [1, float("inf")], "backbone": "mlp", "dataset": "toy",
                                         "epochs": 2}), catalog)
    assert not got["transfer"].on and "one private ε" in got["transfer"].why


def test_private_selection_gets_no_lever(catalog, toy_spec):
    spec = bare(toy_spec, search={"algorithm": "random"}, selection={"mode": "private"})
    space, got = levers(spec, catalog)
    assert not any(lever.on for lever in got.values())
    assert all("private selection" in lever.why for lever in got.values())
    assert space.search.scheduler.name == "none" and space.search.proxy_divisor == 1


def ray_decisions(scheduler: Scheduler, epochs: float, steps: int) -> list[int]:
    """Where Ray Tune's own ASHA bracket records a run reporting at every epoch end before its last
    (with max_t as dptune sets it in steps: a bound above any T)."""
    bracket = _Bracket(scheduler.grace_steps, 2 ** 31, scheduler.reduction_factor, 0)
    trial = SimpleNamespace(trial_id="t")
    taken = []
    for t in epoch_end_steps(epochs, steps):
        if t >= steps:
            break
        before = sum(len(recorded) for _, recorded in bracket._rungs)
        bracket.on_result(trial, t, 0.5)
        if sum(len(recorded) for _, recorded in bracket._rungs) > before:
            taken.append(t)
    return taken


@pytest.mark.parametrize("epochs, steps", [(16, 719), (16, 180), (16, 45), (1, 45), (8, 3000), (2.5, 77), (30, 30)])
@pytest.mark.parametrize("grace, rf", [(20, 3.0), (5, 2.0), (1, 4.0)])
def test_decisions_fall_where_rays_asha_records_a_rung(epochs, steps, grace, rf):
    scheduler = Scheduler("asha", grace_steps=grace, reduction_factor=rf)
    assert [t for t, _ in decision_steps(scheduler, epochs, steps)] == ray_decisions(scheduler, epochs, steps)


def test_one_epoch_leaves_nothing_to_decide_and_the_median_rule_decides_every_epoch_after_grace():
    assert decision_steps(DEFAULT_SCHEDULER, 1, 45) == []
    median = Scheduler("median", grace_epochs=2)
    assert [t for t, _ in decision_steps(median, 4, 40)] == [20, 30]       # epochs 2 and 3; 4 is the end


def test_halving_estimate_by_hand():
    # T = 45 over 16 epochs: one rung, at the first epoch end at or past 20 steps (epoch 7: 7·45/16 = 19.7 → 20)
    scheduler = Scheduler("asha", grace_steps=20, reduction_factor=3.0)
    assert decision_steps(scheduler, 16, 45) == [(20, 1)]
    # 9 runs to step 20, then 9/3 = 3 to the end: 9·20 + 3·25
    assert halving_steps(scheduler, 16, 45, 9) == (pytest.approx(9 * 20 + 3 * 25), pytest.approx(3))
    # never fewer than one run survives: 2 runs → 2·20 + 1·25
    assert halving_steps(scheduler, 16, 45, 2) == (pytest.approx(2 * 20 + 25), pytest.approx(1))
    assert halving_steps(Scheduler("none"), 16, 45, 4) == (180, 4)


def test_the_plan_says_which_levers_are_on_and_what_they_save(catalog, toy_spec):
    spec = bare(toy_spec, seeds=[0, 1, 2], axes={"epsilon": [1, 4], "backbone": "mlp", "dataset": "toy",
                                                 "epochs": 8}, search={"transfer": {"radius": 1}})
    plan = plan_sweep(load_spec(spec, catalog), catalog, workers=1)
    text = format_plan(plan)
    assert "multi-fidelity: on — on by default" in text and "proxy runs: off — 3 seeds" in text
    assert "transfer across ε: on — named in the spec (radius 1" in text
    # the smaller ε transfers from the larger: at most three values (the best's and its neighbours) of each
    small = next(c for c in plan.cells if c.cell.epsilon == 1)
    most = 3 * min(3, len(small.searched_batch_sizes)) * 3
    assert f"transfer: searched after ε=4, within 1 grid step(s) of its best: ≤ {most} of {len(small.grid)}" in text
    # where a rung falls, a configuration runs its lead seed first
    lead = [b for b in small.searched_batch_sizes if small.lead_seed_first(b)]
    assert lead and all(small.decisions(b) for b in lead)
    assert "the lead seed first" in text
    steps, examples = plan.expected_cost
    assert plan.halving_cost[1] < examples and "with multi-fidelity" in text


def test_the_estimate_keeps_all_seeds_of_the_survivors(catalog, toy_spec):
    """Per B: the lead seed's runs halved at each rung Ray's bracket records (at least one survives),
    plus both other seeds of the survivors, in examples (steps × B)."""
    spec = bare(toy_spec, seeds=[0, 1, 2], axes={"epsilon": [1], "backbone": "mlp", "dataset": "toy", "epochs": 8})
    cell = plan_sweep(load_spec(spec, catalog), catalog, workers=1).cells[0]
    expected = 0.0
    for b in cell.searched_batch_sizes:
        steps = int(cell.row(b)["steps"])
        alive, last, total = float(len(cell.clip_bounds) * len(cell.space.learning_rate.multipliers)), 0, 0.0
        rungs = ray_decisions(DEFAULT_SCHEDULER, 8, steps)
        for t in rungs:
            total, last, alive = total + alive * (t - last), t, max(1.0, alive / 3)
        total += alive * (steps - last)
        expected += (total + 2 * alive * steps if rungs else 3 * total) * b
    assert any(ray_decisions(DEFAULT_SCHEDULER, 8, int(cell.row(b)["steps"])) for b in cell.searched_batch_sizes)
    assert cell.halving_cost()[1] == pytest.approx(expected)


def test_a_spec_may_bound_a_packs_members_and_the_plan_says_what_each_cell_packs(catalog, toy_spec):
    space, got = levers({**toy_spec(), "search": {"pack": 4}}, catalog)
    assert got["pack"].on and space.search.pack and space.search.pack_members == 4
    for bad in (1, 0, "some", 2.5):
        with pytest.raises(SpecError, match=r"search.pack: must be on, off or the most members of one pack"):
            load_spec({**toy_spec(), "search": {"pack": bad}}, catalog)
    spec = toy_spec(axes={"epsilon": [1, float("inf")], "backbone": "mlp", "dataset": "toy", "epochs": 2},
                    batch_size=[20, 150], pruning={"min_steps": 1, "plateau_tol": 100}, search={"pack": 4})
    plan = plan_sweep(load_spec(spec, catalog), catalog, workers=1)
    private, baseline = sorted(plan.cells, key=lambda c: c.cell.epsilon)
    assert list(private.searched_batch_sizes) == [20, 150]
    cpu = PackPolicy.for_sweep(plan.space.search, Resources())
    assert cpu.cell_line(private) == ("  packs: B=20: configurations that differ only in C, η (and ε) train together, "
                                      "≤ 4 per pack; B=150: each alone (B > 128 on a CPU, where a pack does not pay)")
    # the lever on by default (not named) packs on a CPU only while its packs measure faster than its lone trials
    default = PackPolicy.for_sweep(plan_sweep(load_spec({**spec, "search": {}}, catalog), catalog, workers=1).space.search,
                                   Resources())
    assert default.measured and not cpu.measured
    assert default.cell_line(private).startswith("  packs: B=20: configurations that differ only in C, η (and ε) train "
                                                 "together, ≤ 32 per pack while their packs measure ≥ 1.2× cheaper "
                                                 "per configuration-step than their lone trials; B=150: each alone")
    assert cpu.cell_line(baseline).startswith("  packs: B=20: configurations that differ only in η (non-private "
                                              "baselines) train together, ≤ 4 per pack; B=150: each alone")
    gpu = PackPolicy.for_sweep(plan.space.search, Resources(gpu=1))
    assert gpu.cell_line(private).startswith("  packs: B=20, 150: configurations")
    # trials on several workers pack too (issue 49), as one-worker trials on the same device would
    assert PackPolicy.for_sweep(plan.space.search, Resources(workers=2)).cell_line(private) == cpu.cell_line(private)
    assert cpu.cell_line(private) in format_plan(plan, pack_line=cpu.cell_line)
