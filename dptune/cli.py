"""The ``dptune`` command line: parses arguments and calls ordinary functions.

What the user can fix (:class:`dptune.errors.UserError`: a bad argument, spec, name, path or value)
is one line and exit code 2; anything else is a bug in dptune: one line saying so and exit code
1. ``--traceback`` shows the full trace of either.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import typing
from typing import TYPE_CHECKING, Callable, Sequence, TextIO


if TYPE_CHECKING:
    from .platform.store.layout import ExperimentPaths

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


from .errors import UserError
from .timeline import mark
from .schema import BATCH_SIZE, CLIP_BOUND, LEARNING_RATE


def _float_or_inf(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'inf'; got {text!r}") from None


#: Extra spellings of ``train`` flags; every TrainConfig field also has ``--field-name``.
TRAIN_ALIASES = {CLIP_BOUND: ("-C",), BATCH_SIZE: ("-B",), LEARNING_RATE: ("--lr",)}


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object (e.g. '{{\"hidden\": 64}}'); got {text!r}")
    return value


def _true_false(text: str) -> bool:
    value = {"true": True, "false": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false; got {text!r}")
    return value


def _train_flag(field: dataclasses.Field, annotation: object) -> tuple[tuple[str, ...], dict]:
    """The flags and ``add_argument`` keywords of one TrainConfig field: type from its annotation
    (``X | None`` as X), choices from its registry, help from its metadata, default from the field."""
    kinds = [a for a in (typing.get_args(annotation) or (annotation,)) if a is not type(None)]
    kind = kinds[0] if len(kinds) == 1 else str
    many = kind is list  # a list of names (``diagnostics``): the flag takes several
    parse = {float: _float_or_inf, int: int, str: str, dict: _json_object, bool: _true_false, list: str}[kind]
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    text = field.metadata.get("help", "").replace("%", "%%")
    if not text.endswith("]"):
        text += " [none]" if default is None else " [%(default)s]"
    kwargs = {"dest": field.name, "type": parse, "default": default, "help": text, **({"nargs": "*"} if many else {})}
    if field.metadata.get("choices") is not None:
        kwargs["choices"] = list(field.metadata["choices"])  # a registry's names (or a tuple's items)
    return (*TRAIN_ALIASES.get(field.name, ()), "--" + field.name.replace("_", "-")), kwargs


def _add_train(sub: argparse._SubParsersAction) -> None:
    from .schema import TrainConfig

    p = sub.add_parser("train", help="one DP training run, without Ray",
                       description="Train one model with DP-SGD / DP-Adam and print accuracy, loss and ε spent "
                                   "after every epoch. σ is calibrated so that ε spent after all T = ⌈E·N/B⌉ "
                                   "steps does not exceed --epsilon.")
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flags, kwargs = _train_flag(field, hints[field.name])
        p.add_argument(*flags, **kwargs)
    p.add_argument("--json", metavar="FILE", help="also write the per-epoch metrics to FILE as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--explain-engine", action="store_true",
                   help="after the first epoch, print per layer how the DP engine computes per-sample norms "
                        "and clipped sums: the rule, the exact form chosen from the shapes, the memory it keeps")
    p.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace, out: TextIO) -> int:
    from tqdm.auto import tqdm

    from .schema import TrainConfig
    from .privacy.randomness_modes import RANDOMNESS_LABELS
    from .trainables.training import Trainer

    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}).validate()
    trainer = Trainer(cfg)
    plan = trainer.plan
    data = trainer.data
    task = (f"{data.num_classes} classes" if data.task == "classification" else
            "prompt → completion, " + ", ".join(f"{n} {split} example(s) truncated to {data.input_shape[0]} tokens"
                                                for split, n in data.truncated.items()))
    print(f"{cfg.dataset}: {trainer.n_train} train / {len(data.test)} test, "
          f"{task}; model {cfg.model}: {trainer.trainable:,} of "
          f"{trainer.total_params:,} parameters trainable ({trainer.trainable / trainer.total_params:.1%}); "
          f"device {trainer.device}", file=out)
    privacy = (f"ε={cfg.epsilon:g}, δ={cfg.delta:g}, σ={plan.noise_multiplier:.4f}, C={cfg.clip_bound:g}"
               if cfg.private else "non-private baseline (no clipping, no noise)")
    print(f"{privacy}; B={cfg.batch_size} (q={plan.sample_rate:.4g}), T={plan.steps} steps, "
          f"η={cfg.learning_rate:g}, {cfg.optimizer}; randomness {RANDOMNESS_LABELS[cfg.randomness]}", file=out)
    with tqdm(total=plan.steps, disable=args.quiet, unit="step", desc="training", file=sys.stderr) as bar:
        def report(m: dict, history: list) -> None:
            line = f"epoch {m['epoch']:>3}/{trainer.num_epochs}  step {m['step']:>5}"
            for key, label in (("test_accuracy", "test acc"), ("test_loss", "loss"), ("validation_accuracy", "val acc"),
                               ("selection_score", "noisy score"), ("test_nll", "test nll"),
                               ("test_perplexity", "ppl"), ("validation_nll", "val nll"), ("test_rougeL", "ROUGE-L"),
                               ("test_bleu", "BLEU")):
                if key in m:
                    line += f"  {label} {m[key]:.4f}"
            line += f"  ε {m['epsilon_spent']:.3f}"
            if cfg.private:
                line += f"  clipped {m['clipped_fraction']:.2f}"
            tqdm.write(line, file=out)
            if args.explain_engine and len(history) == 1:
                tqdm.write(_engine_table(trainer), file=out)

        history = trainer.fit(report, progress=bar)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg.to_dict(), "noise_multiplier": plan.noise_multiplier, "steps": plan.steps,
                       "sample_rate": plan.sample_rate, "history": history}, f, indent=1,
                      default=lambda v: None if isinstance(v, float) and not math.isfinite(v) else str(v))
    return EXIT_OK


def _engine_table(trainer: object) -> str:
    """The DP engine's per-layer choices (``--explain-engine``), one line per layer."""
    engine = getattr(trainer, "engine", None)
    explain = getattr(getattr(engine, "norms", None), "explain", None)
    if explain is None:
        return "engine: none (non-private run)" if engine is None else f"engine: {type(engine.norms).__name__}"
    rows = explain()
    lines = [f"engine: {rows[0]['mode'] if rows else 'book-keeping'}; per layer (last micro-batch):"]
    width = max(len(r["module"]) for r in rows) if rows else 0
    for r in rows:
        names = r["parameters"].split(", ")
        params = names[0] if len(names) == 1 else f"{names[0]} +{len(names) - 1}" if len(r["parameters"]) > 14 \
            else r["parameters"]
        lines.append(f"  {r['module']:<{width}}  {params:<18} {r['rule']:<14} {r['form']:<46} "
                     f"{r['kept_bytes'] / 2**20:8.2f} MiB")
    return "\n".join(lines)


def _add_query(sub: argparse._SubParsersAction) -> None:
    from .platform.store.query import DEFAULT_STORE, FORMATS
    from .platform.store.query_limits import QueryLimits

    p = sub.add_parser("query", help="run SQL over a results store (DuckDB views trials, epochs, gradnorms)",
                       description="Run SQL over the results store. Views: trials (one row per trial: axes, "
                                   "hyperparameters, privacy figures, results, status, error), epochs (per-epoch "
                                   "curves) and gradnorms (per-class gradient-norm statistics; NOT differentially "
                                   "private).")
    p.add_argument("sql", help='e.g. "SELECT epsilon, max(accuracy) FROM trials GROUP BY epsilon"')
    p.add_argument("--store", default=DEFAULT_STORE, help="store or experiment folder, or s3://… [%(default)s]")
    p.add_argument("--format", default="table", choices=FORMATS, help="[%(default)s]")
    p.add_argument("--out", help="write the result to this file (needed for parquet)")
    limits = QueryLimits()
    p.add_argument("--memory", default=limits.memory, help="DuckDB memory limit, e.g. 512MB [%(default)s]")
    p.add_argument("--threads", type=int, default=limits.threads, help="DuckDB threads [%(default)s]")
    p.add_argument("--timeout", type=float, default=limits.timeout_s,
                   help="stop the query after this many seconds [%(default)s]")
    p.set_defaults(handler=lambda args, out: _run_query(args, out))


def _run_query(args: argparse.Namespace, out: TextIO) -> int:
    from .platform.store.query import run_query
    from .platform.store.query_limits import QueryLimits

    run_query(args.store, args.sql, fmt=args.format, out_file=args.out, out=out,
              limits=QueryLimits(args.memory, args.threads, args.timeout))
    return EXIT_OK


def _add_compact(sub: argparse._SubParsersAction) -> None:
    from .platform.store.query import DEFAULT_STORE

    p = sub.add_parser("compact", help="merge a results store's small files (faster queries)",
                       description="Merge the per-trial Parquet files of a results store into one file per "
                                   "table, keeping the newest version of every trial. Safe while a sweep runs.")
    p.add_argument("--store", default=DEFAULT_STORE, help="store or experiment folder [%(default)s]")
    p.set_defaults(handler=_run_compact)


def _run_compact(args: argparse.Namespace, out: TextIO) -> int:
    from .platform.store.query import open_store

    kept = open_store(args.store).compact()
    for table, rows in kept.items():
        print(f"{table}: " + ("nothing to merge" if rows < 0 else f"{rows} rows in one file"), file=out)
    return EXIT_OK


def _add_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="print what a sweep spec would run, without running it",
                       description="Validate SPEC, calibrate σ for every cell's batch-size candidates (in parallel, "
                                   "reusing the on-disk accountant cache), prune them by the minimum-step and σ√T "
                                   "plateau rules, and print a table per cell (B, q, T, σ, σ√T, kept/reason, η), "
                                   "the number of trials and the estimated compute. Nothing is launched.")
    p.add_argument("spec", metavar="SPEC", nargs="?",
                   help="sweep spec (YAML), e.g. examples/digits_small.yaml [the embedded default, as `dptune sweep` "
                        "runs it]")
    p.add_argument("--workers", type=int, default=None, help="calibration processes [all CPUs]")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace, out: TextIO) -> int:
    from .platform.sweep import spec_sections  # noqa: F401  (registers the platform's spec sections)
    from .platform.sweep.catalog import trainables_catalog
    from .platform.store.layout import DEFAULT_SPEC
    from .platform.sweep.pack_policy import PackPolicy
    from .search_spaces import format_plan, load_spec, plan_sweep

    catalog = trainables_catalog()  # torch-free: lazy registries, sizes from metadata
    spec = load_spec(args.spec or DEFAULT_SPEC, catalog)
    plan = plan_sweep(spec, catalog, workers=args.workers, progress=not args.quiet, strict=False)
    packing = PackPolicy.for_sweep(plan.space.search, spec["resources"])
    print(format_plan(plan, pack_line=packing.cell_line if packing else None), file=out)
    if plan.empty_cells:
        print(f"dptune plan: error: {len(plan.empty_cells)} cell(s) keep no batch size; the sweep would refuse "
              "this spec", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _add_schema(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of a sweep spec (for editors)",
                       description="Print the JSON Schema of a sweep spec: every section with its summary and the "
                                   "trial options typed from the trial schema (their names, types, defaults and "
                                   "help). Point an editor at it to complete and check a spec as it is typed, e.g. "
                                   "`dptune schema --out dptune-spec.json` and, as a spec's first line, "
                                   "`# yaml-language-server: $schema=dptune-spec.json` (VS Code's YAML extension).")
    p.add_argument("--out", metavar="FILE", help="write it to FILE [standard output]")
    p.set_defaults(handler=run_schema)


def run_schema(args: argparse.Namespace, out: TextIO) -> int:
    from .platform.sweep import spec_sections  # noqa: F401  (registers the platform's spec sections)
    from .search_spaces.spec_schema import spec_json_schema

    text = json.dumps(spec_json_schema(), indent=1, ensure_ascii=False)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"wrote {args.out}", file=out)
    else:
        print(text, file=out)
    return EXIT_OK


def _clip_and_batch(text: str) -> tuple[float, float]:
    try:
        clip, batch = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected C,B (e.g. 1,256); got {text!r}") from None
    return clip, batch


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas; got {text!r}") from None


def _add_analysis_arguments(p: argparse.ArgumentParser) -> None:
    from .platform.store.query import DEFAULT_STORE

    p.add_argument("--store", default=DEFAULT_STORE, help="store or experiment folder, or s3://… [%(default)s]")
    p.add_argument("--out", help="output folder [analysis/ beside the store]")
    p.add_argument("--across", default="epsilon",
                   help="axis of the panel grid: epsilon, dataset, backbone, epochs, or a training option that "
                        "varies in the store [%(default)s]")
    p.add_argument("--fixed", metavar="C,B", type=_clip_and_batch,
                   help="the one global (C, B) compared with each cell's optimum [the best on average]")


def _add_heatmap(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("heatmap", help="C × B heatmaps of the best accuracy over η, per cell (PNG and SVG)",
                       description="For every cell of the store, a C × B heatmap of the best mean test accuracy "
                                   "over η with the optimum starred and its η written; panels grouped across "
                                   "--across; and the cost of one fixed (C, B) against each cell's optimum. "
                                   "Writes PNG, SVG and CSV files.")
    _add_analysis_arguments(p)
    p.set_defaults(handler=_run_heatmap)


def _run_heatmap(args: argparse.Namespace, out: TextIO) -> int:
    from .analysis.report import write_heatmaps
    from .platform.store.layout import ExperimentPaths
    from .platform.store.results_store import ResultsStore

    paths = ExperimentPaths.find(args.store)
    for path in write_heatmaps(ResultsStore(paths.store), args.out or paths.figures, across=args.across,
                               fixed=args.fixed, out=out):
        print(f"wrote {path}", file=out)
    return EXIT_OK


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="one self-contained HTML report of a sweep",
                       description="Write report.html (figures embedded): the sweep summary, the optimal (C, B, η) "
                                   "per cell and the cost of a fixed setting, heatmaps, σ√T-versus-B noise curves, "
                                   "and per-class gradient norms and retention weights (NOT differentially "
                                   "private, and labelled so).")
    _add_analysis_arguments(p)
    p.add_argument("--noise-batch-sizes", type=_int_list, metavar="B1,B2,…",
                   help="batch sizes of the noise curves, besides those the sweep ran [those its plan listed; "
                        "else powers of two up to N]")
    p.add_argument("--min-steps", type=int, default=None,
                   help="minimum-step floor [the sweep's, from its saved plan; else search_spaces.MIN_STEPS]")
    p.add_argument("--plateau-tol", type=float, default=None,
                   help="σ√T plateau tolerance [the sweep's, from its saved plan; else search_spaces.PLATEAU_TOL]")
    p.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace, out: TextIO) -> int:
    from .analysis.report import write_report
    from .platform.store.layout import ExperimentPaths
    from .platform.store.results_store import ResultsStore

    paths = ExperimentPaths.find(args.store)
    path = write_report(ResultsStore(paths.store), args.out or paths.figures, across=args.across, fixed=args.fixed,
                        noise_batch_sizes=args.noise_batch_sizes, min_steps=args.min_steps,
                        plateau_tol=args.plateau_tol)
    print(f"wrote {path}", file=out)
    return EXIT_OK


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export what may be shared: a released model, its configuration and ε",
                       description="Write the release of a local experiment: per trial, model.safetensors (its final "
                                   "weights) and release.json (configuration, ε and δ and what they cover, the "
                                   "released scores). Without --trial, the model each private-selection cell "
                                   "released, with the cell's total ε; with --trial, that finished trial. Only "
                                   "trials run with secure randomness are exported. The experiment folder itself "
                                   "holds every trial and noisy score: keep it as private as the training data.")
    p.add_argument("experiment", metavar="EXPERIMENT", help="the experiment folder (or its store) of a finished sweep")
    p.add_argument("--out", required=True, help="folder to write the release to")
    p.add_argument("--trial", help="export this trial id instead of the private-selection releases")
    p.set_defaults(handler=_run_export)


def _run_export(args: argparse.Namespace, out: TextIO) -> int:
    from .platform.views.export import export_release

    export_release(args.experiment, args.out, trial_id=args.trial, out=out)
    return EXIT_OK


def _add_audit(sub: argparse._SubParsersAction) -> None:
    from .privacy.audit_bound import GRADIENT_CANARIES, INPUT_CANARIES

    p = sub.add_parser("audit", help="an empirical lower bound on a trial's ε from one training run with canaries",
                       description="Plant canaries, each included with probability 1/2 (white-box gradient canaries "
                                   "read through the engine's noisy gradient, and black-box input canaries: held-out "
                                   "examples with wrong labels), train once with the trial's exact settings (engine, "
                                   "estimator, clipping, sigma, B, T, workers), guess which canaries were included and "
                                   "turn the guesses into a lower bound on epsilon at 95% confidence (Steinke, Nasr & "
                                   "Jagielski, 'Privacy auditing with one (1) training run', NeurIPS 2023), printed "
                                   "beside the accountant's epsilon. A bound above it means the run is not DP as "
                                   "claimed; one below shows no violation (one run's bound is loose). Audit a finished "
                                   "trial (--store, --trial: kept beside the store for the report) or a spec's cell.")
    p.add_argument("spec", metavar="SPEC", nargs="?", help="a sweep spec whose cell to audit (or give --store and --trial)")
    p.add_argument("--cell", help="the cell's key, as `dptune plan` prints it [the first private cell]")
    p.add_argument("--config", type=int, default=0, help="index into the cell's (C, B, η) grid [%(default)s]")
    p.add_argument("--store", help="experiment folder (or its store) holding --trial")
    p.add_argument("--trial", help="trial id of a finished trial to audit")
    p.add_argument("--gradient-canaries", type=int, default=GRADIENT_CANARIES, help="[%(default)s]")
    p.add_argument("--input-canaries", type=int, default=INPUT_CANARIES, help="[%(default)s]")
    p.add_argument("--seed", type=int, default=0, help="seed of the canaries' inclusion [%(default)s]")
    p.add_argument("--workers", type=int, default=None,
                   help="local worker processes [the trial's resources.workers]")
    p.add_argument("--broken", help="audit a deliberately broken engine instead (noise_div10, clip_10x, "
                                    "realised_batch, reused_noise): the audit's own check")
    p.add_argument("--json", metavar="FILE", help="also write the result to FILE as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=_run_audit)


def _run_audit(args: argparse.Namespace, out: TextIO) -> int:
    from tqdm.auto import tqdm

    from .platform.views.audit_command import audit, cell_trial, pack_mates, stored_trial
    from .platform.store.layout import ExperimentPaths
    from .trainables.audit.run import describe, AuditResult

    if (args.spec is None) == (args.trial is None):
        raise UserError("audit: give either SPEC or --store and --trial")
    paths = ExperimentPaths.find(args.store or ".") if args.trial else None
    config, workers = stored_trial(paths, args.trial) if paths else cell_trial(args.spec, args.cell, args.config)
    workers = args.workers or workers
    mates = pack_mates(paths, args.trial) if paths else []
    print(f"auditing {config.get('cell', '')} C={config[CLIP_BOUND]:g} B={config[BATCH_SIZE]} "
          f"η={config[LEARNING_RATE]:.3g} on {workers} worker(s)"
          + (f", as a member of its pack of {len(mates) + 1}" if mates else ""), file=out)
    with tqdm(total=config.get("steps"), disable=args.quiet or workers > 1, unit="step", desc="audit run",
              file=sys.stderr) as bar:
        result = audit(config, workers=workers, progress=lambda step: bar.update(step - bar.n),
                       pack_with=mates,
                       gradient=args.gradient_canaries, inputs=args.input_canaries, seed=args.seed,
                       broken=args.broken)
    print(describe(AuditResult.from_dict(result)), file=out)
    if paths is not None and args.broken is None:
        print(f"kept {paths.save_audit(args.trial, {**result, 'cell': config.get('cell')})}", file=out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return EXIT_OK


def _add_optimal_clip(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimal-clip", help="C* (Theorem 5.2) from per-sample gradients at a checkpoint "
                                            "(non-private diagnostic)",
                       description="Compute the optimal clipping bound C* minimising "
                                   "MSE(C) = ‖Σḡ_i − Σg_i‖² + σ²C²d for one batch of per-sample gradients at a "
                                   "trial's checkpoint (or saved with --save-grads), and compare it with the trial's "
                                   "C. NOT differentially private: it reads the true gradients of private training "
                                   "examples.")
    p.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT",
                   help="state.pt, a checkpoint or trial folder, or an experiment folder with --trial")
    p.add_argument("--trial", help="trial id, when CHECKPOINT is an experiment folder")
    p.add_argument("--grads", metavar="FILE.npz", help="use per-sample gradients saved by --save-grads instead")
    p.add_argument("--examples", type=int, help="examples in the batch [the trial's expected batch size B]")
    p.add_argument("--sigma", type=float, help="noise multiplier σ [the trial's]")
    p.add_argument("--seed", type=int, default=0, help="seed of the examples drawn [%(default)s]")
    p.add_argument("--save-grads", metavar="FILE.npz", help="also save the per-sample gradients and labels")
    p.add_argument("--out", help="write optimal_clip.png/.svg (MSE(C) and retention) and optimal_clip.json here")
    p.set_defaults(handler=_run_optimal_clip)


def _run_optimal_clip(args: argparse.Namespace, out: TextIO) -> int:
    import numpy as np

    from .analysis.diagnostic import clip_diagnostic

    if bool(args.checkpoint) == bool(args.grads):
        raise UserError("give a CHECKPOINT or --grads FILE.npz (one of them)")
    if args.grads:
        saved = np.load(args.grads)
        grads, labels = saved["grads"], saved["labels"]
        sigma, clip, source = float(saved["noise_multiplier"]), float(saved[CLIP_BOUND]), args.grads
    else:
        from .platform.views.checkpoint_gradients import checkpoint_gradients

        ckpt = checkpoint_gradients(args.checkpoint, trial_id=args.trial, examples=args.examples, seed=args.seed)
        grads, labels, sigma, clip = ckpt.grads, ckpt.labels, ckpt.noise_multiplier, ckpt.clip_bound
        source = ckpt.source
        if args.save_grads:
            np.savez_compressed(args.save_grads, grads=grads, labels=labels, noise_multiplier=sigma, clip_bound=clip)
    clip_diagnostic(grads, labels, sigma if args.sigma is None else args.sigma, clip, source=source, out=out,
                    folder=args.out)
    return EXIT_OK


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a sweep on Ray Tune (no SPEC: the embedded default on local Ray)",
                       description="Validate and plan SPEC (see `dptune plan`), then run every trial on Ray Tune: "
                                   "embedded local Ray by default, or a cluster with --address. Each trial is "
                                   "checkpointed every epoch and retried after a node failure; finished and errored "
                                   "trials are written to the Parquet results store under "
                                   "<storage>/<experiment>/store. Without SPEC, runs the embedded default sweep "
                                   "(digits, small CNN, two ε, a pruned (C, B, η) grid) in a few minutes.")
    p.add_argument("spec", metavar="SPEC", nargs="?", help="sweep spec (YAML) [the embedded default]")
    p.add_argument("--address", help="Ray cluster to join, e.g. auto on a cluster's head node; the σ the plan "
                                      "lacks are then calibrated as Ray tasks across it [start local Ray]")
    p.add_argument("--storage", help="override the spec's storage: a path, NFS path or s3://bucket/prefix")
    p.add_argument("--quiet", action="store_true", help="no calibration progress bar")
    p.add_argument("--verbose", action="store_true",
                   help="Ray Tune's own progress tables and trial boxes, every failed attempt's traceback and what "
                        "the trials print (libraries' progress bars and warnings) [one line per ended trial, an "
                        "ERRORED one with its error's last line, a live line while trials run long; each trial's "
                        "output in output.log and its traceback in error.txt, both in its folder]")
    p.add_argument("--overwrite", action="store_true",
                   help="delete an earlier run of the same experiment (its Ray Tune state, store and figures) and "
                        "start again [refuse: continue it with `dptune resume`, or set a new experiment name]")
    p.set_defaults(handler=run_sweep_command)


def run_sweep_command(args: argparse.Namespace, out: TextIO) -> int:
    from .platform.sweep.driver import prepare, run_sweep

    plan, settings = prepare(args.spec, storage=args.storage, progress=not args.quiet, out=out, address=args.address,
                             start_local_ray=not args.address,
                             check=lambda s: _refuse_earlier_run(s.paths, overwrite=args.overwrite, out=out),
                             verbose=args.verbose)
    outcome = run_sweep(plan, settings, address=args.address, out=out)
    return _report_outcome(outcome, out)


def _refuse_earlier_run(paths: "ExperimentPaths", *, overwrite: bool, out: TextIO) -> None:
    """A store must never mix two runs of one configuration unknowingly: an experiment folder that
    exists and is not empty is refused (before anything is launched), or deleted with --overwrite."""
    import pyarrow.fs as pafs

    from .platform.store.layout import SETTINGS_FILE

    fs, root = paths.filesystem()
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        return
    if info.type != pafs.FileType.Directory:
        raise UserError(f"experiment folder {paths.root} exists and is not a folder")
    if not fs.get_file_info(pafs.FileSelector(root, recursive=False)):
        return  # an empty folder: nothing to mix with
    if not overwrite:
        raise UserError(f"experiment folder {paths.root} already holds a run: continue it with "
                         f"`dptune resume {paths.root}`, start it again with --overwrite (deletes that run), or give "
                         "the spec a new `experiment:` name (or --storage)")
    if fs.get_file_info(f"{root}/{SETTINGS_FILE}").type != pafs.FileType.File:
        raise UserError(f"--overwrite deletes only an earlier dptune run, and {paths.root} holds none (no "
                         f"{SETTINGS_FILE}): give the spec another `experiment:` name (or --storage)")
    print(f"dptune: --overwrite: deleting the earlier run in {paths.root}", file=out)
    fs.delete_dir(root)


def _report_outcome(outcome, out: TextIO) -> int:
    """Print what the sweep found and draw its heatmaps beside the store."""
    from .analysis.report import write_heatmaps
    from .platform.store.results_store import ResultsStore

    paths = outcome.paths
    if outcome.recurring is not None:
        raise UserError(f"the sweep stopped at a trial's error, which every trial would meet: {outcome.recurring}")
    errored = (f" (their messages and tracebacks: dptune status {paths.root})" if outcome.errored else "")
    print(f"\n{outcome.finished} trials finished, {outcome.errored} errored{errored}; results store: {paths.store}\n"
          f"best configuration per cell (diagnostic; selecting on the {outcome.metric.replace('_', ' ')} is not "
          "private):", file=out)
    if outcome.finished:   # each cell's optimum with its error bar, then what differs between cells
        write_heatmaps(ResultsStore(paths.store), paths.figures, out=out)
        print(f"heatmaps: {paths.figures}  (full report: dptune report --store {paths.root})", file=out)
    else:
        print("(no finished trials)", file=out)
    return EXIT_OK if outcome.errored == 0 and outcome.unrun == 0 else EXIT_FAILURE


def _add_resume(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("resume", help="continue an interrupted sweep",
                       description="Restore a sweep's Ray Tune experiment: unfinished trials resume from their last "
                                   "checkpoint, errored trials resume (or restart with --restart-errored), finished "
                                   "trials are kept, and the searcher (grid, random or Optuna) continues where it was.")
    p.add_argument("experiment", metavar="EXPERIMENT", help="the experiment folder <storage>/<experiment>")
    p.add_argument("--restart-errored", action="store_true", help="rerun errored trials from scratch")
    p.add_argument("--address", help="Ray cluster to join [start local Ray]")
    p.set_defaults(handler=run_resume_command)


def run_resume_command(args: argparse.Namespace, out: TextIO) -> int:
    from .platform.sweep.driver import resume_sweep

    outcome = resume_sweep(args.experiment, restart_errored=args.restart_errored, address=args.address, out=out)
    return _report_outcome(outcome, out)


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="where a sweep stands: per cell finished / running / pending, best, ETA",
                       description="Per cell of a sweep (running or ended, local or s3://): trials finished, running, "
                                   "pending, stopped early and errored, the best so far with its (C, B, η), and "
                                   "trial-epochs spent against the plan; an ETA from the rate so far. The plan's "
                                   "counts are upper bounds where a search can converge or a scheduler stop trials.")
    p.add_argument("experiment", metavar="EXPERIMENT", help="the experiment folder <storage>/<experiment>")
    p.add_argument("--watch", type=float, nargs="?", const=5.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 5) until nothing is running or pending; Ctrl-C stops")
    p.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace, out: TextIO) -> int:
    import time

    from .platform.views.status import read_status

    if args.watch is not None and args.watch <= 0:
        raise UserError(f"--watch: must be a number of seconds > 0; got {args.watch:g}")
    while True:
        status = read_status(args.experiment)
        if args.watch is not None and out.isatty():
            print("\x1b[2J\x1b[H", end="", file=out)   # clear the terminal between readings
        print(status.render(), file=out, flush=True)
        if args.watch is None or status.done:
            return EXIT_OK
        time.sleep(args.watch)


COMMANDS: Sequence[Callable[[argparse._SubParsersAction], None]] = (
    _add_train, _add_plan, _add_sweep, _add_resume, _add_status, _add_query, _add_compact, _add_heatmap, _add_report,
    _add_optimal_clip, _add_export, _add_audit, _add_schema)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dptune",
        description="Hyperparameter search for differentially private training (DP-SGD / DP-Adam).")
    parser.add_argument("--traceback", action="store_true", help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    for command in sub.choices.values():   # also after the command, as the error hint is read: `dptune plan x --traceback`
        command.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback on errors")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    mark("cli_start", command=args.command)
    try:
        return args.handler(args, out)
    except UserError as exc:
        if args.traceback:
            raise
        print(f"dptune {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dptune: interrupted", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:  # a bug, not the user's mistake: say so, and where to see it
        if args.traceback:
            raise
        reason = str(exc).splitlines()[0] if str(exc) else ""
        print(f"dptune {args.command}: internal error: {type(exc).__name__}{': ' + reason if reason else ''}\n"
              f"  this is a bug in dptune, not in your input; run it again with --traceback to see where",
              file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
