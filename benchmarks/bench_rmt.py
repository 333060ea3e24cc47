"""Is RMT denoising worth turning on? (issue 18): the non-private cosine diagnostic and steps to a
target accuracy, plain DP vs ``denoise="rmt"`` vs its ablations, on real gradients.

    python benchmarks/bench_rmt.py cosine   # digits mlp/cnn, B ∈ {256, 1024}, ε ∈ {1, 8}, seeds 0-2
    python benchmarks/bench_rmt.py steps    # digits mlp/cnn, ε = 8, B = 1024 and mlp ε = 1, B = 256: plain/rmt/ablations, η grid, seeds 0-2
    python benchmarks/bench_rmt.py text     # BBC News, pretrained MiniLM + LoRA (top layer; frozen prefix cached)
    python benchmarks/bench_rmt.py window   # per step vs summed over K steps: cos(Σĝ, Σḡ) vs cos(Σrmt(ĝ), Σḡ)
    python benchmarks/bench_rmt.py textsteps  # MiniLM + LoRA, ε = 8, B = 256: plain vs rmt, accuracy after every step
    python benchmarks/bench_rmt.py textlr     # the same at AdamW lr 2.5e-3 and 1e-2 (lr tuned per variant)
    python benchmarks/bench_rmt.py report   # print the markdown of what benchmarks/results/rmt.json holds
    python benchmarks/bench_rmt.py cosine --quick   # a smoke run (1 seed, 1 setting, 2 epochs)

Accuracy, steps and cosines only (no timings), so the figures do not depend on the machine's load.

**cosine**: each run trains plain DP-SGD with ``diagnostics=["denoise_cosine"]``: at every step and
for every 2-D weight, the engine compares cos(ĝ, ḡ) with cos(rmt(ĝ), ḡ), ḡ being the same step's
clipped mean before noise (a counterfactual: the plain step is taken). Reported per setting over
all (layer, step) pairs of all seeds: the share whose gate opened, the share of those whose cosine
improved, the mean gain, the kept rank and the shrinkage ‖X̂‖/‖ĝ‖.

**steps**: each variant trains with an η grid and 3 seeds; test accuracy after every step. The η of
each variant is the one with the best mean final accuracy (tuned per variant). The target is 90 % of
the tuned plain run's mean final accuracy; steps to reach it are given per seed. The diagnostic is
on in the rmt runs too (cosines along their own trajectory).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from dptune.trainables.config import TrainConfig
from dptune.trainables.data.catalog import load_dataset
from dptune.trainables.engine.denoise import epoch_cosine_metrics
from dptune.trainables.training import Trainer, evaluate

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "rmt.json"
SEEDS = (0, 1, 2)
#: variant name -> TrainConfig overrides (the ablations of issue 18; scope=lora needs a LoRA model)
VARIANTS = {"plain": {}, "rmt": {"denoise": "rmt"},
            "rmt, no norm correction": {"denoise": "rmt", "denoise_norm_correction": False},
            "rmt, κ = 1.1": {"denoise": "rmt", "denoise_kappa": 1.1},
            "rmt, κ = 1.25": {"denoise": "rmt", "denoise_kappa": 1.25}}
#: (model, B, ε) of the steps part: where the gate opens most (ε = 8, B = 1024) and issue 5's setting
STEP_SETTINGS = (("mlp", 1024, 8.0), ("cnn", 1024, 8.0), ("mlp", 256, 1.0))


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def save(part: str, result: dict) -> None:
    """Write one part's results, keeping the other parts' (re-read now: parts may run in parallel)."""
    results = load()
    results[part] = result
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(_rounded(results), separators=(",", ":")))


def _rounded(value: object) -> object:
    """Floats to 5 significant digits (the file keeps every step's accuracy of every run)."""
    if isinstance(value, float):
        return float(f"{value:.5g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def run(cfg: TrainConfig, data, *, every_step: bool) -> dict:
    """Train to the end; the diagnostic's rows of every step, per-layer gains, and the accuracy curve."""
    trainer = Trainer(cfg, data)
    steps, curve = [], []
    while not trainer.done:
        out = trainer.train_step()
        if out is not None and out[3] is not None:
            steps.append(out[3])
        if every_step or trainer.done:
            curve.append(evaluate(trainer.model, trainer.data.test, trainer.data.num_classes,
                                  trainer.device)["accuracy"])
    layers: dict[str, list[dict]] = {}
    for step in steps:
        for row in step:
            layers.setdefault(row["layer"], []).append(row)
    return {"steps": trainer.plan.steps, "sigma": trainer.plan.noise_multiplier, "curve": curve,
            "cosine": epoch_cosine_metrics(steps),
            "per_layer": {name: epoch_cosine_metrics([rows]) for name, rows in layers.items()},
            "pairs": sum(1 for s in steps for r in s if not math.isnan(r["cos_noisy"]))}  # with a defined cosine


def cosine(quick: bool) -> dict:
    """The diagnostic along plain DP-SGD trajectories (η = 1, C = 1, E = 20 epochs)."""
    data = load_dataset("digits", seed=0)
    settings = [(m, b, e) for m in ("mlp", "cnn") for b in (256, 1024) for e in (1.0, 8.0)]
    seeds, epochs = SEEDS, 20.0
    if quick:
        settings, seeds, epochs = settings[:1], (0,), 2.0
    out = {}
    for model, batch, eps in settings:
        runs = []
        for seed in seeds:
            t = time.perf_counter()
            cfg = TrainConfig(dataset="digits", model=model, epsilon=eps, batch_size=batch, epochs=epochs,
                              learning_rate=1.0, clip_bound=1.0, seed=seed, diagnostics=["denoise_cosine"])
            r = run(cfg, data, every_step=False)
            runs.append(r)
            print(f"cosine {model} B={batch} eps={eps:g} seed={seed}: {r['cosine']} "
                  f"acc={r['curve'][-1]:.3f} ({time.perf_counter() - t:.0f} s)", flush=True)
        out[f"{model}/B={batch}/eps={eps:g}"] = {"model": model, "batch": batch, "epsilon": eps, "epochs": epochs,
                                                 "seeds": list(seeds), "runs": runs}
    return out


def steps_to_target(quick: bool, extend: dict[str, tuple[float, ...]] | None = None) -> dict:
    """Plain vs rmt vs ablations on digits, DP-SGD, C = 1, E = 30, per setting of STEP_SETTINGS.
    ``extend`` ({setting key: more η}) runs only those η and merges them into the stored results."""
    data = load_dataset("digits", seed=0)
    settings = STEP_SETTINGS[:1] if quick else STEP_SETTINGS
    if extend:
        stored = load().get("steps", {})
        for key, etas in extend.items():
            m, b, e = next(s for s in settings if f"{s[0]}/B={s[1]}/eps={s[2]:g}" == key)
            more = steps_one(data, m, b, e, quick, etas)
            old = stored[key]
            for name, by_eta in more["variants"].items():
                old["variants"][name].update(by_eta)
            old["etas"] = sorted(set(old["etas"]) | set(etas))
        return stored
    return {f"{m}/B={b}/eps={e:g}": steps_one(data, m, b, e, quick) for m, b, e in settings}


def steps_one(data, model: str, batch: int, eps: float, quick: bool,
              etas: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)) -> dict:
    seeds, epochs = SEEDS, 30.0
    variants = VARIANTS
    if quick:
        etas, seeds, epochs, variants = (1.0,), (0,), 2.0, dict(list(VARIANTS.items())[:2])
    out = {"model": model, "batch": batch, "epsilon": eps, "epochs": epochs, "etas": list(etas),
           "seeds": list(seeds), "variants": {}}
    for name, options in variants.items():
        by_eta = {}
        for eta in etas:
            runs = []
            for seed in seeds:
                cfg = TrainConfig(dataset="digits", model=model, epsilon=eps, batch_size=batch, epochs=epochs,
                                  learning_rate=eta, clip_bound=1.0, seed=seed, diagnostics=["denoise_cosine"],
                                  **options)
                runs.append(run(cfg, data, every_step=True))
            by_eta[str(eta)] = runs
            print(f"steps {model} B={batch} eps={eps:g} {name} eta={eta}: final {[round(r['curve'][-1], 3) for r in runs]}", flush=True)
        out["variants"][name] = by_eta
    return out


def window(quick: bool) -> dict:
    """Does the per-step cosine gain survive summing over steps? Along plain DP-SGD trajectories
    (digits, ε = 8, B = 1024, η = 1, E = 20; mlp and cnn), per 2-D layer and window of K consecutive
    steps: cos(Σ ĝ_t, Σ ḡ_t) and cos(Σ rmt(ĝ_t), Σ ḡ_t). Noise is independent across steps and
    averages out in the sum (which is what SGD applies); the denoiser's truncation does not."""
    from dptune.trainables.engine.batching import to_device
    from dptune.trainables.data.catalog import take

    data = load_dataset("digits", seed=0)
    seeds = (0,) if quick else SEEDS
    out = {}
    for model in ("mlp",) if quick else ("mlp", "cnn"):
        per_k: dict[int, dict[str, list[float]]] = {}
        for seed in seeds:
            cfg = TrainConfig(dataset="digits", model=model, epsilon=8.0, batch_size=1024, epochs=2.0 if quick else 20.0,
                              learning_rate=1.0, clip_bound=1.0, seed=seed)
            tr = Trainer(cfg, data)
            eng, names = tr.engine, tr.engine.denoised_names
            hist = []  # per step: {layer: (ĝ, rmt(ĝ), ḡ)}
            while not tr.done:
                x, y = take(tr.data.train, tr.sampler.sample())
                x, y = to_device(x, tr.device), y.to(tr.device)
                tr.optimizer.zero_grad(set_to_none=True)
                sums, _ = eng.clipped_sum(x, y)
                private = eng.normalise(eng.add_noise(sums))
                denoised, _ = eng.denoised(private, "rmt")
                clean = eng.normalise(sums)
                for name, p in eng.params.items():
                    p.grad = private[name].to(p.dtype)
                tr.optimizer.step()
                tr.step += 1
                hist.append({n: (private[n].double(), denoised[n].double(), clean[n].double()) for n in names})
            for k in (1, 2, 5, 10):
                acc = per_k.setdefault(k, {"plain": [], "rmt": []})
                for start in range(0, len(hist) - k + 1, k):
                    for n in names:
                        g, d, c = (sum(h[n][i] for h in hist[start:start + k]) for i in range(3))
                        acc["plain"].append(float((g * c).sum() / (g.norm() * c.norm())))
                        acc["rmt"].append(float((d * c).sum() / (d.norm() * c.norm())))
        out[model] = {str(k): {"plain": _mean(v["plain"]), "rmt": _mean(v["rmt"]),
                               "rmt_better": _mean([float(r > p) for p, r in zip(v["plain"], v["rmt"])]),
                               "windows": len(v["plain"])} for k, v in per_k.items()}
        print(f"window {model}: {out[model]}", flush=True)
    return out


def window_markdown(res: dict) -> str:
    lines = ["| model | K steps summed | mean cos(Σĝ, Σḡ) | mean cos(Σrmt(ĝ), Σḡ) | share of (layer, window) where rmt is closer |",
             "|---|---:|---:|---:|---:|"]
    for model, by_k in res.items():
        for k, r in by_k.items():
            lines.append(f"| {model} | {k} | {r['plain']:.3f} | {r['rmt']:.3f} | {100 * r['rmt_better']:.0f} % |")
    return "\n".join(lines)


#: textsteps variants: name -> (denoise, DPEngine options)
TEXT_VARIANTS = {"plain": (None, {}), "rmt": ("rmt", {}),
                 "rmt, LoRA factors only": ("rmt", {"denoise_scope": "lora"}),
                 "rmt, no norm correction": ("rmt", {"denoise_norm_correction": False})}


def text_steps(quick: bool, extend: bool = False) -> dict:
    """Where the text diagnostic improved (ε = 8, B = 256): plain vs rmt (and, with ``extend``, the
    LoRA-factors-only and no-norm-correction ablations, merged into the stored runs) with
    bench_denoise.py's text_run (DP-AdamW lr 5e-3, not tuned; C = 1; E = 2, T = 14; test accuracy
    after every step)."""
    from bench_denoise import text_run, text_setup

    data = text_setup(32, 16, seed=0)
    seeds = (0,) if quick else SEEDS
    names = list(TEXT_VARIANTS)[2:] if extend else list(TEXT_VARIANTS)[:2]
    runs = {name: [text_run(data, TEXT_VARIANTS[name][0], batch=256, epochs=1.0 if quick else 2.0, lr=5e-3,
                            clip=1.0, seed=s, epsilon=8.0, **TEXT_VARIANTS[name][1]) for s in seeds] for name in names}
    for name, rs in runs.items():
        print(f"textsteps {name}: {[[round(a, 3) for a in r['curve']] for r in rs]}", flush=True)
    if extend:
        stored = load()["textsteps"]
        stored["runs"].update(runs)
        return stored
    return {"batch": 256, "epsilon": 8.0, "seeds": list(seeds), "runs": runs}


def text_lr(quick: bool, extend: bool = False) -> dict:
    """MiniLM + LoRA, ε = 8, B = 256: plain and rmt at two more AdamW learning rates (2.5e-3, 1e-2),
    so that with textsteps' 5e-3 each has a tuned lr; ``extend``: 2e-2 too, merged into the stored ones."""
    from bench_denoise import text_run, text_setup

    data = text_setup(32, 16, seed=0)
    seeds = (0,) if quick else SEEDS
    out = load().get("textlr", {}) if extend else {}
    for lr in (2e-2,) if extend else (2.5e-3, 1e-2):
        out[str(lr)] = {name: [text_run(data, TEXT_VARIANTS[name][0], batch=256, epochs=1.0 if quick else 2.0, lr=lr,
                                        clip=1.0, seed=s, epsilon=8.0) for s in seeds] for name in ("plain", "rmt")}
        print(f"textlr {lr}: { {k: [round(r['curve'][-1], 3) for r in v] for k, v in out[str(lr)].items()} }",
              flush=True)
    return out


def text_lr_markdown(res: dict, base: dict | None) -> str:
    """Final accuracy per lr, and steps to 90 % of tuned plain's final accuracy at each variant's best lr."""
    by_lr = {**({"0.005": {k: base["runs"][k] for k in ("plain", "rmt")}} if base else {}), **res}
    lrs = sorted(by_lr, key=float)
    best = {name: max(lrs, key=lambda lr: _mean([r["curve"][-1] for r in by_lr[lr][name]])) for name in ("plain", "rmt")}
    target = 0.9 * _mean([r["curve"][-1] for r in by_lr[best["plain"]]["plain"]])
    lines = ["| variant | " + " | ".join(f"lr {float(lr):g}" for lr in lrs) + " | lr (tuned) | steps to target, per seed |",
             "|---|" + "---:|" * len(lrs) + "---:|---|"]
    for name in ("plain", "rmt"):
        reach = [first_reach(r["curve"], target) for r in by_lr[best[name]][name]]
        lines.append(f"| {name} | " + " | ".join(f"{_mean([r['curve'][-1] for r in by_lr[lr][name]]):.3f}" for lr in lrs)
                     + f" | {float(best[name]):g} | {', '.join('—' if x is None else str(x) for x in reach)} |")
    return f"Target: 90 % of the tuned plain run's mean final accuracy = {target:.3f}.\n\n" + "\n".join(lines)


def text_steps_markdown(res: dict) -> str:
    plain_final = _mean([r["curve"][-1] for r in res["runs"]["plain"]])
    target = 0.9 * plain_final
    lines = [f"Target: 90 % of plain's mean final accuracy ({plain_final:.3f}) = {target:.3f}.", "",
             "| variant | steps to target, per seed | final acc. (mean) | acc. after step 3, 7 (mean) | gate open |",
             "|---|---|---:|---|---:|"]
    for name, runs in res["runs"].items():
        reach = ", ".join("—" if x is None else str(x) for x in (first_reach(r["curve"], target) for r in runs))
        gate = _mean([r["gate_rate"] for r in runs if r["gate_rate"] is not None])
        lines.append(f"| {name} | {reach} | {_mean([r['curve'][-1] for r in runs]):.3f} | "
                     f"{_mean([r['curve'][2] for r in runs]):.3f}, {_mean([r['curve'][6] for r in runs]):.3f} | "
                     f"{_f(100 * gate, '.1f')} % |")
    return "\n".join(lines)


def text(quick: bool) -> dict:
    """The diagnostic on BBC News with pretrained all-MiniLM-L6-v2 + LoRA (r = 16, query/value of the
    last layer; layers 0-4 run once and cached: bench_denoise.py's frozen-prefix trick), DP-AdamW
    lr 5e-3, C = 1, plain steps (the denoising is counterfactual), no evaluation during training."""
    from bench_denoise import TopLayerClassifier, reset_lora, text_setup  # benchmarks/ is on sys.path as the script's folder
    from torch import nn

    from dptune.privacy import calibrate_noise
    from dptune.trainables import DPEngine, PoissonSampler

    data = text_setup(32, 16, seed=0)
    n = len(data["train"])
    settings = [(b, e) for b in (256, 1024) for e in (1.0, 8.0)]
    seeds, epochs = ((0,), 1.0) if quick else ((0, 1, 2), 2.0)
    if quick:
        settings = settings[:1]
    out = {}
    for batch, eps in settings:
        q, steps = batch / n, math.ceil(epochs * n / batch)
        sigma = calibrate_noise(eps, 1e-5, q, steps)
        runs = []
        for seed in seeds:
            t = time.perf_counter()
            layer = data["layer"]
            reset_lora(layer, seed)  # fresh LoRA factors per run
            torch.manual_seed(seed)
            model = TopLayerClassifier(layer, data["hidden"].shape[-1], len(data["classes"])).train()
            engine = DPEngine(model, nn.CrossEntropyLoss(reduction="none"), clip_bound=1.0, noise_multiplier=sigma,
                              expected_batch_size=batch, max_physical_batch_size=128,
                              generator=torch.Generator().manual_seed(seed + 1), diagnostics=["denoise_cosine"])
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3, weight_decay=0.0)
            sampler = PoissonSampler(n, q, seed=seed)
            rows = []
            for _ in range(steps):
                idx = data["train"][sampler.sample()]
                opt.zero_grad(set_to_none=True)
                stats = engine.private_gradient({"hidden": data["hidden"][idx], "mask": data["mask"][idx]},
                                                data["labels"][idx])
                opt.step()
                rows.append(stats["denoise_cosine"])
            layers: dict[str, list[dict]] = {}
            for step in rows:
                for row in step:
                    kind = "LoRA factors" if "lora_" in row["layer"] else "head"
                    layers.setdefault(kind, []).append(row)
            from bench_denoise import text_accuracy
            r = {"steps": steps, "sigma": sigma, "curve": [text_accuracy(model, data)],
                 "cosine": epoch_cosine_metrics(rows),
                 "per_layer": {k: epoch_cosine_metrics([v]) for k, v in layers.items()},
                 "pairs": sum(1 for x in rows for r in x if not math.isnan(r["cos_noisy"]))}
            runs.append(r)
            print(f"text B={batch} eps={eps:g} seed={seed}: {r['cosine']} {r['per_layer']} "
                  f"acc={r['curve'][-1]:.3f} ({time.perf_counter() - t:.0f} s)", flush=True)
        out[f"minilm-lora/B={batch}/eps={eps:g}"] = {"model": "MiniLM + LoRA", "batch": batch, "epsilon": eps,
                                                     "epochs": epochs, "seeds": list(seeds), "runs": runs}
    return out


# --- markdown -------------------------------------------------------------------------------------------

def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _pooled(runs: list[dict]) -> dict:
    """Pool the diagnostic over runs, weighting each run by its (gate-open) pairs."""
    pairs = [r["pairs"] for r in runs]
    gate = [r["cosine"]["nonprivate_cos_gate_rate"] * n for r, n in zip(runs, pairs)]
    open_pairs = sum(g for g in gate if not math.isnan(g))

    def weighted(key: str) -> float:
        w = [(r["cosine"][key], g) for r, g in zip(runs, gate) if g and not math.isnan(r["cosine"][key])]
        return sum(v * g for v, g in w) / sum(g for _, g in w) if w else math.nan

    return {"pairs": sum(pairs), "open": open_pairs, "gate_rate": open_pairs / sum(pairs),
            "improved": weighted("nonprivate_cos_improved"), "gain": weighted("nonprivate_cos_gain"),
            "rank": weighted("nonprivate_cos_rank"), "shrinkage": weighted("nonprivate_cos_shrinkage"),
            "cos_noisy": _mean([r["cosine"]["nonprivate_cos_noisy"] for r in runs]),
            "accuracy": _mean([r["curve"][-1] for r in runs])}


def _f(x: float, spec: str = ".3f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def cosine_markdown(res: dict) -> str:
    lines = ["| model | B | ε | σ | T | gate open (layer-steps) | cosine improved, of gate-open | mean gain "
             "cos(rmt(ĝ),ḡ) − cos(ĝ,ḡ) | mean cos(ĝ,ḡ) | kept rank | shrinkage | final acc. (plain) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, s in res.items():
        p = _pooled(s["runs"])
        r0 = s["runs"][0]
        lines.append(f"| {s['model']} | {s['batch']} | {s['epsilon']:g} | {r0['sigma']:.3f} | {r0['steps']} | "
                     f"{p['open']:.0f}/{p['pairs']} ({100 * p['gate_rate']:.1f} %) | {_f(100 * p['improved'], '.1f')} % | "
                     f"{_f(p['gain'], '+.4f')} | {_f(p['cos_noisy'])} | {_f(p['rank'], '.2f')} | "
                     f"{_f(p['shrinkage'])} | {_f(p['accuracy'])} |")
    return "\n".join(lines)


def text_markdown(res: dict) -> str:
    """Per setting and kind of 2-D layer (LoRA factors, head): means over seeds of each run's figures."""
    lines = ["| B | ε | layers | gate open | cosine improved, of gate-open | mean gain | mean cos(ĝ,ḡ) | kept rank | "
             "shrinkage |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for s in res.values():
        for kind in ("LoRA factors", "head"):
            per = [r["per_layer"][kind] for r in s["runs"] if kind in r["per_layer"]]

            def m(key: str) -> float:
                return _mean([p[f"nonprivate_cos_{key}"] for p in per])
            lines.append(f"| {s['batch']} | {s['epsilon']:g} | {kind} | {_f(100 * m('gate_rate'), '.1f')} % | "
                         f"{_f(100 * m('improved'), '.0f')} % | {_f(m('gain'), '+.3f')} | {_f(m('noisy'))} | "
                         f"{_f(m('rank'), '.1f')} | {_f(m('shrinkage'))} |")
    return "\n".join(lines)


def first_reach(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, a in enumerate(curve) if a >= target), None)


def steps_markdown(results: dict) -> str:
    return "\n\n".join(f"**{r['model']}, B = {r['batch']}, ε = {r['epsilon']:g}** ({r['epochs']:g} epochs, "
                        f"T = {len(r['variants']['plain'][str(r['etas'][0])][0]['curve'])} steps, seeds "
                        f"{', '.join(map(str, r['seeds']))})\n\n" + steps_one_markdown(r) for r in results.values())


def steps_one_markdown(res: dict) -> str:
    variants = res["variants"]
    tuned = {}
    for name, by_eta in variants.items():
        eta = max(by_eta, key=lambda e: _mean([r["curve"][-1] for r in by_eta[e]]))
        tuned[name] = (eta, by_eta[eta])
    plain_final = _mean([r["curve"][-1] for r in tuned["plain"][1]])
    target = 0.9 * plain_final
    lines = [f"Target: 90 % of the tuned plain run's mean final test accuracy ({plain_final:.3f}) = {target:.3f}.", "",
             "| variant | η (tuned) | steps to target, per seed | median | final acc. (mean) | acc. at T/4, T/2 | "
             "gate open | cosine improved | mean gain |",
             "|---|---:|---|---:|---:|---|---:|---:|---:|"]
    for name, (eta, runs) in tuned.items():
        reach = [first_reach(r["curve"], target) for r in runs]
        shown = ", ".join("—" if x is None else str(x) for x in reach)
        med = statistics.median([x if x is not None else math.inf for x in reach])
        T = len(runs[0]["curve"])
        q = [_mean([r["curve"][max(0, T // k - 1)] for r in runs]) for k in (4, 2)]
        p = _pooled(runs)
        lines.append(f"| {name} | {eta} | {shown} | {'—' if math.isinf(med) else f'{med:g}'} | "
                     f"{_f(p['accuracy'])} | {_f(q[0])}, {_f(q[1])} | {100 * p['gate_rate']:.1f} % | "
                     f"{_f(100 * p['improved'], '.1f')} % | {_f(p['gain'], '+.4f')} |")
    lines += ["", "Mean final accuracy for every η (rows: variant; the η grid is small, so tuned means best of these):", "",
              "| variant | " + " | ".join(f"η = {e}" for e in res["etas"]) + " |",
              "|---|" + "---:|" * len(res["etas"])]
    for name, by_eta in variants.items():
        lines.append(f"| {name} | " + " | ".join(_f(_mean([r["curve"][-1] for r in by_eta[str(e)]]))
                                                 for e in res["etas"]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("cosine", "steps", "text", "window", "textsteps", "textlr", "report"))
    parser.add_argument("--quick", action="store_true", help="a smoke run; results are not saved")
    parser.add_argument("--extend", action="store_true",
                        help="steps: run the η beyond the grid's edges (8 at B = 1024, 0.25 at B = 256); textsteps: the "
                             "LoRA-only and no-norm-correction ablations; textlr: lr 2e-2; merged into the stored results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = load()
    if args.part != "report":
        if args.part == "textlr" and args.extend:
            res = text_lr(args.quick, extend=True)
        elif args.part == "textsteps" and args.extend:
            res = text_steps(args.quick, extend=True)
        elif args.part == "steps" and args.extend:
            res = steps_to_target(args.quick, {"mlp/B=1024/eps=8": (8.0,), "cnn/B=1024/eps=8": (8.0,),
                                               "mlp/B=256/eps=1": (0.25,)})
        else:
            res = {"cosine": cosine, "text": text, "steps": steps_to_target, "window": window,
                   "textsteps": text_steps, "textlr": text_lr}[args.part](args.quick)
        if args.part == "textlr":
            print(text_lr_markdown(res, None if args.quick else results.get("textsteps")))
        else:
            print({"steps": steps_markdown, "window": window_markdown,
                   "textsteps": text_steps_markdown}.get(args.part, cosine_markdown)(res))
        if not args.quick:
            save(args.part, res)
    else:
        if "cosine" in results:
            print(cosine_markdown(results["cosine"]), "\n")
        if "text" in results:
            print(cosine_markdown(results["text"]), "\n")
            print(text_markdown(results["text"]), "\n")
        if "textsteps" in results:
            print(text_steps_markdown(results["textsteps"]), "\n")
        if "textlr" in results:
            print(text_lr_markdown(results["textlr"], results.get("textsteps")), "\n")
        if "window" in results:
            print(window_markdown(results["window"]), "\n")
        if "steps" in results:
            print(steps_markdown(results["steps"]))


if __name__ == "__main__":
    main()
