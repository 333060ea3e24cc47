"""Text rendering of a sweep plan for ``dptune plan``: one table per cell, then the totals."""
from __future__ import annotations

from typing import Callable

from .bracketing import AXES, MIN_BATCH_SIZE
from .planner import CellPlan, SweepPlan
from .search_sections import MODEL_BASED
from .proxy import MAX_AUTO_DIVISOR, MIN_AUTO_PROXY_BATCH, MIN_PROXY_SIGMA
from .racing import seed_rounds
from ..schema import BATCH_SIZE


def _count(value: float) -> str:
    """1234 → '1,234'; 12_345_678 → '12.3M'."""
    for size, unit in ((1e9, "G"), (1e6, "M")):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:,.0f}"


def _status(row: dict) -> str:
    if row["reason"] is not None:
        return row["reason"]
    return "kept" if row["searched"] else "kept, not searched"


def format_cell(plan: CellPlan, index: int, total: int, source: CellPlan | None = None) -> str:
    """The header, the candidate table (B, q, T, σ, σ√T, kept/reason, η), the trial count and what the
    levers save here (``source``: the cell this one transfers from)."""
    c = plan.cell
    note = ("" if not plan.declared else ", declared" if plan.registered
            else ", declared; not registered: planning only")
    lines = [f"cell {index}/{total}  ε={c.epsilon:g}  δ={c.delta:g}  backbone={c.backbone}  "
             f"dataset={c.dataset} (N={plan.dataset_size:,}{note})  epochs={c.epochs:g}"
             + "".join(f"  {k}={'null' if v is None else v}" for k, v in c.options)]
    multipliers = plan.space.learning_rate.multipliers
    header = f"  {'B':>6}  {'q':>8}  {'T':>7}  {'σ':>8}  {'σ√T':>8}  {'kept/reason':<18}  η"
    lines.append(header)
    recommended = plan.searched_batch_sizes[:1]
    for row in plan.rows:
        fits = row["reason"] != "exceeds_dataset"
        sigma = f"{row['noise_multiplier']:8.4f}" if fits else f"{'-':>8}"
        noise = f"{row['noise_sqrt_steps']:8.2f}" if fits else f"{'-':>8}"
        q = f"{row['sample_rate']:8.4g}" if fits else f"{'-':>8}"
        status = _status(row) + (" *" if row[BATCH_SIZE] in recommended else "")
        lrs = (" ".join(f"{plan.learning_rate(row[BATCH_SIZE], m):.3g}" for m in multipliers)
               if row["searched"] else "")
        line = f"  {row[BATCH_SIZE]:>6}  {q}  {row['steps']:>7}  {sigma}  {noise}  {status:<18}  {lrs}"
        lines.append(line.rstrip())
    steps, examples = plan.expected_cost()
    search = plan.space.search
    shape = (f"{len(plan.space.clip_bounds)} C × {len(plan.searched_batch_sizes)} B × {len(multipliers)} η")
    if search.algorithm != "grid":
        shape = f"{search.algorithm}: {plan.num_configurations} of {shape} = {len(plan.grid)}"
    seeds = len(plan.space.seeds)
    approx, upto = ("≈", "≤ ") if search.algorithm in MODEL_BASED else ("", "")  # a sampler may converge early
    if plan.private:
        lines += _selection_lines(plan)
    if plan.proxied:
        proxies = ", ".join(f"B={b} → {p.batch_size} (σ {p.noise_multiplier:.3g})" if p.batch_size < b else
                            f"B={b} at full scale (no k keeps σ/k ≥ {MIN_PROXY_SIGMA:g} and B/k ≥ {MIN_AUTO_PROXY_BATCH})"
                            for b in plan.searched_batch_sizes for p in [plan.proxy(b)])
        final_steps, final_examples = plan.final_cost()
        lines.append(f"  proxy runs: {proxies}; then the best at full scale: ≤ {_count(final_examples)} examples")
        steps, examples = steps + final_steps, examples + final_examples
    lines.append(f"  → {upto}{plan.num_trials} trials ({shape} × {seeds} seed{'s' if seeds > 1 else ''}"
                 + (" + the full-scale answer" if plan.proxied else "")
                 + f"); {approx}{_count(steps)} steps, {approx}{_count(examples)} examples")
    lines += _lever_lines(plan, source)
    return "\n".join(lines)


def _lever_lines(plan: CellPlan, source: CellPlan | None) -> list[str]:
    """What multi-fidelity and transfer are expected to save in this cell."""
    lines = []
    scheduler = plan.space.search.scheduler
    stoppable = [b for b in plan.searched_batch_sizes if plan.decisions(b)]
    if scheduler.name != "none" and not plan.private:
        if not stoppable:
            lines.append(f"  multi-fidelity: no {scheduler.name} decision falls before a run's last step here "
                         "(every run trains to the end)")
        else:
            lead = [b for b in stoppable if plan.lead_seed_first(b)]
            first = (f"; B={', '.join(map(str, lead))}: the lead seed first, the others once it passed every rung"
                     if lead else "")
            if scheduler.name == "asha":
                steps, examples = plan.expected_cost()
                h_steps, h_examples = plan.halving_cost()
                lines.append(f"  multi-fidelity: decisions at B={', '.join(map(str, stoppable))}{first}; ≈ "
                             f"{_count(h_steps)} steps, {_count(h_examples)} examples if each rung keeps "
                             f"1/{scheduler.reduction_factor:g} ({h_examples / max(examples, 1):.0%} of the examples)")
            else:
                lines.append(f"  multi-fidelity: decisions at B={', '.join(map(str, stoppable))}{first}")
    bracket = plan.space.search.bracket_extensions
    if bracket is not None and not plan.private:
        lines.append(f"  bracketing: {_bracket_text(plan, bracket)}")
    max_seeds = plan.space.search.racing_max_seeds
    if max_seeds is not None and not plan.private:
        rounds = seed_rounds(plan.space.seeds, max_seeds, budget=plan.space.search.racing_max_added is not None)
        lines.append(f"  racing: the configurations not distinguishable from the optimum get seeds in rounds of "
                     f"{' → '.join(str(len(r)) for r in rounds)}, tests corrected for {len(rounds)} looks; ≤ "
                     f"{max_seeds - len(plan.space.seeds)} trials added per contender"
                     + ("" if (added := plan.space.search.racing_max_added) is None else
                        f", ≤ {added:g}× a cell's compute in all (nearest the optimum first)"))
    if source is not None:
        radius = plan.space.search.transfer_radius
        dims = (len(plan.clip_bounds), len(plan.searched_batch_sizes), len(plan.space.learning_rate.multipliers))
        most = 1
        for n in dims:
            most *= min(n, 2 * radius + 1)
        lines.append(f"  transfer: searched after ε={source.cell.epsilon:g}, within {radius} grid step(s) of its best: "
                     f"≤ {min(most, len(plan.grid))} of {len(plan.grid)} configurations")
    return lines


def _bracket_text(plan: CellPlan, extensions: int) -> str:
    """What bracketing may add in a cell: per searched axis the next values beyond each end (in the
    grid's spacing; B within [16, N/2]) and the most configurations and trials it can add."""
    grids = (plan.clip_bounds, plan.searched_batch_sizes, plan.space.learning_rate.multipliers)
    parts, most = [], 0
    for axis, (name, grid, per) in enumerate(zip(AXES, grids, (3, 3, 1))):
        if len(grid) < 2:
            continue
        position = [0, 0, 0]
        low = plan.values(tuple(-1 if a == axis else 0 for a in range(3)))[axis]
        position[axis] = len(grid)
        high = plan.values(tuple(position))[axis]
        label = "η×" if axis == 2 else f"{name}="
        parts.append(f"{name}: {label}{low:.3g} below, {label}{high:.3g} above")
        most += per * extensions
    if not parts:
        return "nothing to bracket (every axis has one value)"
    seeds = len(plan.space.seeds)
    return (f"an optimum on an edge gets the next values beyond it, ≤ {extensions} extension(s) per axis ("
            + "; ".join(parts) + f"; B within [{MIN_BATCH_SIZE}, {plan.dataset_size // 2}]): ≤ {most} configurations, "
            f"≤ {most * seeds} trials added")


def _divisor_text(divisor: int | str) -> str:
    if divisor == "auto":
        return (f"B/k and σ/k, k per B the largest power of two ≤ {MAX_AUTO_DIVISOR} that keeps σ/k ≥ "
                f"{MIN_PROXY_SIGMA:g} and B/k ≥ {MIN_AUTO_PROXY_BATCH} (none: that B at full scale)")
    return f"B/{divisor} and σ/{divisor}"


def _selection_lines(plan: CellPlan) -> list[str]:
    """Private selection: K drawn, the score noise, and per searched B the per-trial ε beside the total."""
    selection = plan.space.selection
    law = selection.trial_count()
    shape = f", η={law.shape:g}" if law.distribution == "truncated_negative_binomial" else ""
    drew = (f"drew K = {len(plan.drawn)}" if plan.drawn is not None else
            "K and its trials are drawn secretly (the OS's CSPRNG) when the sweep starts")
    lines = [f"  private selection: K ~ {law.distribution}(mean {law.mean:g}{shape}); {drew} "
             f"(random draws from the pruned space); score noise {selection.score_noise:g} "
             f"(n_val={plan.validation_size:,}, sensitivity 1/n_val); σ above is per trial"]
    figures = [f"B={b}: {p.trial_epsilon:.3g} → {p.total_epsilon:.3g}" for b, p in sorted(plan.privacy.items())
               if b in plan.searched_batch_sizes]
    if figures:
        lines.append(f"  per-trial ε (training + noisy score) → total ε of the release, at δ={plan.cell.delta:g}: "
                     + "; ".join(figures))
    return lines


def format_plan(plan: SweepPlan, *, dry_run: bool = True, pack_line: Callable[[CellPlan], str] | None = None) -> str:
    """The whole plan: settings, a table per cell and the totals. * marks the recommended B.
    ``dry_run`` (`dptune plan`) ends the totals with "Nothing was launched."; a sweep prints the
    plan it is about to launch without it. ``pack_line``: what a cell packs (the platform's packed
    trials, when on)."""
    space = plan.space
    a, lr, pr = space.axes, space.learning_rate, space.pruning
    dims = [len(a.epsilon), len(a.backbone), len(a.dataset), len(a.epochs)]
    dims += [len(a.delta)] if len(a.delta) > 1 else []
    names = "ε × backbone × dataset × epochs" + (" × δ" if len(a.delta) > 1 else "")
    if space.trial.searched:   # searched trial options: one sub-cell per combination
        dims.append(len(space.trial.variants()))
        names += " × trial options"
    limit = "all kept B" if pr.max_batch_sizes is None else f"at most {pr.max_batch_sizes} kept B"
    out = [f"Sweep plan{f' for {plan.source}' if plan.source else ''}: {len(plan.cells)} cells "
           f"({names} = {' × '.join(map(str, dims))})",
           f"C grid: {', '.join(f'{c:.3g}' for c in space.clip_bounds)}; "
           f"η(B) = {lr.reference:g}·√(B/{lr.reference_batch_size}) × "
           f"{{{', '.join(f'{m:g}' for m in lr.multipliers)}}}",
           f"pruning: T ≥ {pr.min_steps} steps, σ√T within {pr.plateau_tol:.0%} of the cell's minimum, {limit} "
           f"searched (spread across the plateau; * = recommended)",
           f"search: {space.search.algorithm}"
           + (f", {space.search.budget} configurations per cell, seed {space.search.seed}"
              if space.search.budget is not None else "")
           + f"; training seeds: {', '.join(map(str, space.seeds))}; norm estimator: {space.trial.norm_estimator}"
           + (f" (k={space.trial.sketch_k})" if space.trial.sketch_k else ""),
           *([f"trial options searched (a sub-cell per combination, each with its own C, B, η search; denoise_* "
              "only where denoise is set): " + "; ".join(f"{k} ∈ {{{', '.join('null' if v is None else str(v) for v in vs)}}}"
                                                       for k, vs in space.trial.searched)]
             if space.trial.searched else []),
           "levers (the same answer for less compute; each turned off by name in `search`):",
           *[f"  {lever.line}" for lever in space.levers],
           *([f"proxy runs (Sander et al., TAN without a burn): each private cell's configurations ranked at "
              f"{_divisor_text(space.search.proxy_divisor)} for the cell's T, then its choice "
              "trained once at full scale (the answer); a proxy's ε is its own, not the cell's: proxy rows only "
              "rank"] if space.search.proxy_divisor != 1 else []),
           *([f"selection: private (Papernot & Steinke): each cell's ε, δ is the budget of the released model; "
              f"validation fraction {space.selection.validation_fraction:g}; the σ√T and minimum-step rules are "
              "data-independent and cost no privacy"] if space.selection.private else []), ""]
    sources = plan.transfer_sources()
    for i, cell in enumerate(plan.cells, 1):
        source = plan.cells[sources[i - 1]] if i - 1 in sources else None
        out += [format_cell(cell, i, len(plan.cells), source), *([pack_line(cell)] if pack_line else []), ""]
    steps, examples = plan.expected_cost
    approx, upto = ("≈", "≤ ") if space.search.algorithm in MODEL_BASED else ("", "")
    saving = ""
    if space.search.scheduler.name == "asha":
        _, h_examples = plan.halving_cost
        saving = f"; ≈ {_count(h_examples)} examples with multi-fidelity, if each rung keeps 1/" \
                 f"{space.search.scheduler.reduction_factor:g}"
    if sources:
        saving += "; transfer runs fewer in the smaller-ε cells"
    out.append(f"total: {upto}{plan.num_trials} trials, {approx}{_count(steps)} optimizer steps, "
               f"{approx}{_count(examples)} examples (per-sample gradients){saving}."
               + (" Nothing was launched." if dry_run else ""))
    out += [f"note: a sweep would refuse this: {problem}" for problem in plan.sweep_problems]
    return "\n".join(out)
