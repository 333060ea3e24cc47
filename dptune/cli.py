"""The ``dptune`` command line: parses arguments and calls ordinary functions.

User mistakes (bad arguments, unknown names) become a one-line error and exit code 2;
``--traceback`` shows the full trace instead.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Callable, Sequence, TextIO

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _float_or_inf(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'inf'; got {text!r}") from None


def _add_train(sub: argparse._SubParsersAction) -> None:
    from .trainables.config import TrainConfig

    d = TrainConfig()
    p = sub.add_parser("train", help="one DP training run, without Ray",
                       description="Train one model with DP-SGD / DP-Adam and print accuracy, loss and ε spent "
                                   "after every epoch. σ is calibrated so that ε spent after all T = ⌈E·N/B⌉ "
                                   "steps does not exceed --epsilon.")
    p.add_argument("--dataset", default=d.dataset, help="registered dataset (digits, mnist5k, …) [%(default)s]")
    p.add_argument("--model", default=d.model, help="registered model (mlp, cnn, wrn16_4, …) [%(default)s]")
    p.add_argument("--epsilon", type=_float_or_inf, default=d.epsilon,
                   help="privacy budget ε; 'inf' trains the non-private baseline [%(default)s]")
    p.add_argument("--delta", type=float, default=d.delta, help="δ [%(default)s]")
    p.add_argument("-C", "--clip-bound", type=float, default=d.clip_bound, help="clipping bound C [%(default)s]")
    p.add_argument("-B", "--batch-size", type=int, default=d.batch_size,
                   help="expected (Poisson) batch size B [%(default)s]")
    p.add_argument("--lr", "--learning-rate", dest="learning_rate", type=float, default=d.learning_rate,
                   help="learning rate η [%(default)s]")
    p.add_argument("--epochs", type=float, default=d.epochs, help="epochs E [%(default)s]")
    p.add_argument("--optimizer", default=d.optimizer, choices=["sgd", "adam", "adamw"], help="[%(default)s]")
    p.add_argument("--momentum", type=float, default=d.momentum, help="SGD momentum [%(default)s]")
    p.add_argument("--clip-fn", default=d.clip_fn, choices=["flat", "auto_s"], help="[%(default)s]")
    p.add_argument("--max-physical-batch-size", type=int, default=None,
                   help="split logical batches into micro-batches of this size (memory only; same result)")
    p.add_argument("--seed", type=int, default=d.seed, help="[%(default)s]")
    p.add_argument("--device", default=d.device, help="auto, cpu, cuda or cuda:N [%(default)s]")
    p.add_argument("--json", metavar="FILE", help="also write the per-epoch metrics to FILE as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace, out: TextIO) -> int:
    from tqdm.auto import tqdm

    from .trainables.config import TrainConfig
    from .trainables.training import Trainer

    cfg = TrainConfig(dataset=args.dataset, model=args.model, epsilon=args.epsilon, delta=args.delta,
                      clip_bound=args.clip_bound, batch_size=args.batch_size, learning_rate=args.learning_rate,
                      epochs=args.epochs, optimizer=args.optimizer, momentum=args.momentum, clip_fn=args.clip_fn,
                      max_physical_batch_size=args.max_physical_batch_size, seed=args.seed,
                      device=args.device).validate()
    trainer = Trainer(cfg)
    plan = trainer.plan
    print(f"{cfg.dataset}: {trainer.n_train} train / {len(trainer.data.test)} test, "
          f"{trainer.data.num_classes} classes; model {cfg.model}: {trainer.trainable:,} of "
          f"{trainer.total_params:,} parameters trainable ({trainer.trainable / trainer.total_params:.1%}); "
          f"device {trainer.device}", file=out)
    privacy = (f"ε={cfg.epsilon:g}, δ={cfg.delta:g}, σ={plan.noise_multiplier:.4f}, C={cfg.clip_bound:g}"
               if cfg.private else "non-private baseline (no clipping, no noise)")
    print(f"{privacy}; B={cfg.batch_size} (q={plan.sample_rate:.4g}), T={plan.steps} steps, "
          f"η={cfg.learning_rate:g}, {cfg.optimizer}", file=out)
    history = []
    with tqdm(total=plan.steps, disable=args.quiet, unit="step", desc="training", file=sys.stderr) as bar:
        while not trainer.done:
            m = trainer.run_epoch(bar)
            history.append(m)
            line = (f"epoch {m['epoch']:>3}/{trainer.num_epochs}  step {m['step']:>5}  acc {m['accuracy']:.4f}  "
                    f"loss {m['loss']:.4f}  ε {m['epsilon_spent']:.3f}")
            if cfg.private:
                line += f"  clipped {m['clipped_fraction']:.2f}"
            tqdm.write(line, file=out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg.to_dict(), "noise_multiplier": plan.noise_multiplier, "steps": plan.steps,
                       "sample_rate": plan.sample_rate, "history": history}, f, indent=1,
                      default=lambda v: None if isinstance(v, float) and not math.isfinite(v) else str(v))
    return EXIT_OK


COMMANDS: Sequence[Callable[[argparse._SubParsersAction], None]] = (_add_train,)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dptune",
        description="Hyperparameter search for differentially private training (DP-SGD / DP-Adam).")
    parser.add_argument("--traceback", action="store_true", help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args, out)
    except (ValueError, FileNotFoundError) as exc:
        if args.traceback:
            raise
        print(f"dptune {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dptune: interrupted", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
