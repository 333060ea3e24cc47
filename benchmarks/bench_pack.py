"""Packed trials: configuration-steps per second of K configurations trained as one pack, against
the same K configurations trained apart.

For each case (a model and a fixed batch of B examples; common.py's cases) and pack size K, one full
DP optimizer step (forward, backward, per-sample norms, clipping, noise, SGD step) of K
configurations that differ in C, σ and η:

- separate: K models, each with its own DPEngine and optimizer, stepped one after the other in one
  process (K trials in one worker, no per-trial overhead counted);
- fractional (``--processes``): K processes started together, each training its own model, as Ray
  Tune's fractional GPUs (``gpu: 1/K``) run K trials on one device; timed from a shared barrier to the
  last process's end;
- pack: one packed model (dptune.trainables.engine.packing) with DPEngine(members=K) and
  PackedOptimizer, every member on the same batch.

The figure is configuration-steps per second: K / (time of one step of all K). "non-private" is one
plain step of one model, for scale. Methods run interleaved round after round; each figure is the
median over rounds.

``--cell``: whole trainings instead of steps — the nine (C, η) configurations of one cell of the
default sweep (digits, cnn, B, ε, E; one seed) trained apart by ``Trainer`` and together by
``PackTrainer``, in the same process (data loaded once, no Ray): configurations × epochs per second,
and each configuration's final test accuracy both ways.

Language models (``--cases qwen2_full smollm2_lora``; per-example completion NLL on a fixed batch of
B = 8 sequences of 64 tokens, as bench_lm_step builds it): a random Qwen2 (hidden 256, 4 layers;
RMSNorm, untied embeddings) fine-tuned in full, and SmolLM2-135M + LoRA (its frozen base shared by the
K·B rows).

ConvNeXt cases (``--cases convnext_film convnext_full``): timm's ConvNeXt-Atto, random weights, whose
``LayerNorm2d`` (and, in full, each block with its layer scale) has no packed form of its own algebra: a
pack takes each such module whole (``PackedUnit``: its forward vmapped over the members, its
per-example gradients replayed per member, as a lone trial's composite rule replays it).

Run: python benchmarks/bench_pack.py [--cases cnn wrn16_4 vit_tiny_film] [--members 1 4 16]
                                     [--device cuda] [--processes] [--rounds 5] [--steps 5] [--max-rows N]
     python benchmarks/bench_pack.py --cell [--batch 32] [--epochs 1] [--epsilon 8]
"""
from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import statistics
import time
import warnings

import torch
from torch import nn

from common import CASES, DEFAULT_DEVICE, Case, build_case
from dptune.trainables import DPEngine
from dptune.trainables.engine.batching import model_outputs
from dptune.trainables.engine.packing import pack_models
from dptune.trainables.engine.optimizers import PackedOptimizer

warnings.filterwarnings("ignore")
LOSS = nn.CrossEntropyLoss(reduction="none")


#: Causal LM cases: (label, create_model options) of a generation model on bench_lm_step's batch.
LM_CASES = {
    "qwen2_full": ("random Qwen2 (hidden 256, 4 layers, RMSNorm, untied) full fine-tune",
                   dict(name="hf:qwen2", weights="random", peft="full", vocab_size=4096, hidden_size=256,
                        intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        tie_word_embeddings=False, max_position_embeddings=128)),
    "smollm2_lora": ("SmolLM2-135M + LoRA", dict(name="smollm2-135m", peft="lora")),
}


def lm_case(name: str, device: str, batch: int = 8, tokens: int = 64) -> tuple[Case, object]:
    """A causal LM case and its loss (the per-example completion NLL)."""
    from bench_lm_step import batch as lm_batch
    from dptune.trainables.models.catalog import create_model
    from dptune.trainables.tasks import completion_nll

    label, options = LM_CASES[name]
    torch.manual_seed(0)
    options = dict(options)
    model = create_model(options.pop("name"), num_classes=0, input_shape=(tokens,), task="generation",
                         **options).to(device)
    x, y = lm_batch(model, batch, tokens)
    return Case(f"{label}, T={tokens}", model, x, y), completion_nll


def settings(k: int) -> tuple[float, float, float]:
    """(C, σ, η) of configuration k: different for every member."""
    return 0.5 * (1 + k % 4), 0.8 + 0.1 * (k % 3), 1e-3 * (1 + k % 5)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def separate_step(model: nn.Module, inputs, targets, k: int, loss=LOSS):
    clip, sigma, lr = settings(k)
    engine = DPEngine(model, loss, clip_bound=clip, noise_multiplier=sigma, expected_batch_size=len(targets))
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        engine.private_gradient(inputs, targets)
        opt.step()
    return step


def pack_step(model: nn.Module, inputs, targets, members: int, loss=LOSS, max_rows: int | None = None):
    packed = pack_models([model] * members)
    clips, sigmas, lrs = zip(*(settings(k) for k in range(members)))
    engine = DPEngine(packed, loss, members=members, clip_bound=clips, noise_multiplier=sigmas,
                      expected_batch_size=len(targets), max_physical_batch_size=max_rows)
    opt = PackedOptimizer(torch.optim.SGD([p for p in packed.parameters() if p.requires_grad], lr=1.0), lrs,
                          engine.active)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        engine.private_gradient(inputs, targets)
        opt.step()
    return step


def nonprivate_step(model: nn.Module, inputs, targets, loss=LOSS):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss(model_outputs(model, inputs), targets).mean().backward()
        opt.step()
    return step


def timed(step, steps: int, device: str) -> float:
    """Seconds per call of ``step`` over ``steps`` calls (after the first round's warm-up)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - start) / steps


def _worker(case: str, device: str, k: int, steps: int, barrier, results) -> None:
    torch.set_num_threads(1)
    c = build_case(case, None, 0, "eager", device)
    step = separate_step(c.model, c.inputs, c.targets, k)
    step()   # warm-up: kernels, the engine's first-batch check
    sync(device)
    barrier.wait()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    results.put(time.perf_counter() - start)


def fractional(case: str, device: str, members: int, steps: int) -> float:
    """Seconds per step of all K when K processes train one configuration each, concurrently."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(members + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(case, device, k, steps, barrier, results)) for k in range(members)]
    for p in procs:
        p.start()
    barrier.wait()
    start = time.perf_counter()
    for _ in procs:
        results.get()
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    return elapsed / steps


def cell(batch: int, epochs: float, epsilon: float, device: str, rounds: int) -> None:
    """The default sweep's cell trained apart and as one pack (see the module docstring)."""
    from dptune.schema import TrainConfig
    from dptune.trainables.pack_training import PackTrainer
    from dptune.trainables.training import Trainer

    eta = [2.0 * (batch / 128) ** 0.5 * m for m in (0.125, 0.5, 2)]
    cfgs = [TrainConfig(dataset="digits", model="cnn", batch_size=batch, epochs=epochs, epsilon=epsilon, seed=0,
                        clip_bound=c, learning_rate=lr, device=device) for c in (0.3, 1, 3) for lr in eta]
    Trainer(cfgs[0]).fit()   # load the data once, for both
    times: dict[str, list[float]] = {"apart": [], "pack": []}
    for _ in range(rounds):
        start = time.perf_counter()
        apart = [Trainer(cfg).fit()[-1]["test_accuracy"] for cfg in cfgs]
        times["apart"].append(time.perf_counter() - start)
        start = time.perf_counter()
        packed = [h[-1]["test_accuracy"] for h in PackTrainer(cfgs).fit()]
        times["pack"].append(time.perf_counter() - start)
    rate = {m: len(cfgs) * epochs / statistics.median(t) for m, t in times.items()}
    best = max(range(len(cfgs)), key=lambda k: apart[k])
    print(f"| B={batch}, E={epochs:g}, ε={epsilon:g} | {len(cfgs)} | {rate['apart']:.2f} | {rate['pack']:.2f} | "
          f"{rate['pack'] / rate['apart']:.2f} | {max(abs(a - b) for a, b in zip(apart, packed)):.4f} | "
          f"C={cfgs[best].clip_bound:g}, η={cfgs[best].learning_rate:.3g}: {apart[best]:.3f} / {packed[best]:.3f} |",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=[*CASES, *LM_CASES])
    parser.add_argument("--members", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--device", default=DEFAULT_DEVICE)
    parser.add_argument("--processes", action="store_true", help="also time K concurrent processes (fractional GPUs)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps timed per round and method")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-rows", type=int, help="rows of one packed pass (micro-batches, exact: the same sums; "
                                                     "as a PackTrainer splits a pack that would not fit) [all K·B]")
    parser.add_argument("--cell", action="store_true", help="whole trainings of a default-sweep cell instead")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 128, 512], help="--cell: batch sizes")
    parser.add_argument("--epochs", type=float, nargs="+", default=[1, 16], help="--cell: epochs")
    parser.add_argument("--epsilon", type=float, default=8.0, help="--cell: ε")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.cell:
        print(f"device {args.device}, {args.threads} thread(s), median of {args.rounds} rounds\n")
        print("| cell | configurations | apart (config·epochs/s) | pack | pack / apart | largest accuracy difference "
              "| best configuration: accuracy apart / packed |")
        print("|---|---|---|---|---|---|---|")
        for epochs in args.epochs:
            for batch in args.batch:
                cell(batch, epochs, args.epsilon, args.device, args.rounds)
        return
    print(f"device {args.device}, torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds × "
          f"{args.steps} steps; configuration-steps per second (median over rounds)\n")
    print("| case | K | non-private (1 model) | separate | fractional | pack | pack / separate | pack / fractional |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.cases:
        case, loss = lm_case(name, args.device) if name in LM_CASES else (build_case(name, None, 0, "eager",
                                                                                      args.device), LOSS)
        for members in args.members:
            models = [copy.deepcopy(case.model) for _ in range(members)]
            steps = {"non-private": nonprivate_step(copy.deepcopy(case.model), case.inputs, case.targets, loss),
                     "pack": pack_step(case.model, case.inputs, case.targets, members, loss, args.max_rows)}
            separate = [separate_step(m, case.inputs, case.targets, k, loss) for k, m in enumerate(models)]
            steps["separate"] = lambda: [s() for s in separate]
            for step in steps.values():
                step()   # warm-up
            times: dict[str, list[float]] = {m: [] for m in steps}
            for _ in range(args.rounds):
                for method, step in steps.items():
                    times[method].append(timed(step, args.steps, args.device))
            rate = {m: (1 if m == "non-private" else members) / statistics.median(t) for m, t in times.items()}
            frac = members / fractional(name, args.device, members, args.steps * args.rounds) \
                if args.processes and name not in LM_CASES else float("nan")
            print(f"| {case.label}, B={len(case.targets)} | {members} | {rate['non-private']:.3g} | "
                  f"{rate['separate']:.3g} | {frac:.3g} | {rate['pack']:.3g} | {rate['pack'] / rate['separate']:.2f} | "
                  f"{rate['pack'] / frac:.2f} |", flush=True)
            del models, steps, separate
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
