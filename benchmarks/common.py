"""Shared pieces of the DP-step benchmarks (bench_engine.py, bench_engine_memory.py): the cases
(a model and a fixed batch), one full optimizer step per method, and interleaved timing.

Every method trains its own copy of the same initial model on the same batch with SGD:
forward, backward, per-sample clipping and noise where private (C = 1, σ = 1), optimizer step.
Methods: non-private; dptune's DPEngine with each exact norm engine it registers ("exact", and
the vmap reference "vmap" where present); Opacus 1.6 GradSampleModule + DPOptimizer ("hooks") and
GradSampleModuleFastGradientClipping + DPOptimizerFastGradientClipping + DPLossFastGradientClipping
("ghost": ghost norms, then a second backward of the clipped loss), each on the model as
``ModuleValidator.fix`` makes it (its DP layers: DPLSTM for nn.LSTM, DPMultiheadAttention for
nn.MultiheadAttention; no change to the other cases).
"""
from __future__ import annotations

import copy
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from dptune.trainables import DPEngine
from dptune.trainables.engine.batching import Inputs, model_outputs
from dptune.trainables.models.catalog import create_model
from dptune.trainables.engine.per_sample import VmapNormEngine

DEFAULT_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: dptune exact engines benchmarked: the default (book-keeping hooks) and the vmap reference.
DPTUNE_ENGINES = ("exact", "vmap")


@dataclass
class Case:
    label: str
    model: nn.Module  # the initial model (on the device); each method gets its own copy
    inputs: Inputs
    targets: torch.Tensor


def image_case(label: str, name: str, shape: tuple[int, ...], classes: int, batch: int, **options: object) -> Case:
    g = torch.Generator().manual_seed(0)
    model = create_model(name, num_classes=classes, input_shape=shape, **options)
    return Case(label, model, torch.randn(batch, *shape, generator=g), torch.randint(0, classes, (batch,), generator=g))


def text_case(label: str, name: str, classes: int, batch: int, tokens: int, **options: object) -> Case:
    """Random token ids; every second example is padded after its first half (attention mask 0)."""
    g = torch.Generator().manual_seed(0)
    model = create_model(name, num_classes=classes, input_shape=(tokens,), **options)
    config = model.config
    ids = torch.randint(1000, config.vocab_size, (batch, tokens), generator=g)
    mask = torch.ones_like(ids)
    mask[1::2, max(tokens // 2, 1):] = 0
    ids[mask == 0] = config.pad_token_id
    targets = torch.randint(0, classes, (batch,), generator=g)
    return Case(label, model, {"input_ids": ids, "attention_mask": mask}, targets)


def roberta_base_random() -> str:
    """A local directory holding roberta-base's config (no weights): dptune's ``hf:<dir>`` family
    builds it with ``weights="random"`` and no download."""
    from transformers import RobertaConfig

    folder = tempfile.mkdtemp(prefix="roberta-base-config-")
    RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                  bos_token_id=0, eos_token_id=2).save_pretrained(folder)
    return folder


VIT_TINY, VIT_BASE = "vit_tiny_patch16_224.augreg_in21k", "vit_base_patch16_224.augreg_in21k"
MINILM = "all-MiniLM-L6-v2"
#: name -> (default batch size, builder(batch, tokens, attention) -> Case). Tokens apply to text cases.
CASES: dict[str, tuple[int, Callable[[int, int, str], Case]]] = {
    "cnn": (256, lambda b, t, a: image_case("cnn, 1×28×28", "cnn", (1, 28, 28), 10, b)),
    "wrn16_4": (64, lambda b, t, a: image_case("wrn16_4, 3×32×32", "wrn16_4", (3, 32, 32), 10, b)),
    "vit_tiny_film": (64, lambda b, t, a: image_case("ViT-Tiny + FiLM, 224²", VIT_TINY, (3, 224, 224), 100, b,
                                                     peft="film", weights="random", attention=a)),
    "minilm_lora": (64, lambda b, t, a: text_case(f"MiniLM-L6 + LoRA, {t} tokens (half padded)", MINILM, 5, b, t,
                                                  peft="lora", attention=a)),
    "lstm": (256, lambda b, t, a: image_case("LSTM over rows, 1×28×28, hidden 128", "lstm", (1, 28, 28), 10, b,
                                             hidden=128)),
    # timm's ConvNeXt: LayerNorm2d (and under full the blocks' layer scale) have no closed form: composite units
    "convnext_film": (32, lambda b, t, a: image_case("ConvNeXt-Atto + FiLM, 3×32×32", "timm:convnext_atto", (3, 32, 32), 10,
                                                     b, peft="film", weights="random")),
    "convnext_full": (32, lambda b, t, a: image_case("ConvNeXt-Atto full, 3×32×32", "timm:convnext_atto", (3, 32, 32), 10,
                                                     b, peft="full", weights="random")),
    "vit_tv": (64, lambda b, t, a: image_case("torchvision ViT, Tiny-sized (192 × 12 layers, 3 heads), 3×32×32, "
                                              "patch 4", "vit", (3, 32, 32), 10, b, patch_size=4, depth=12,
                                              embed_dim=192, num_heads=3)),
}
#: Larger cases for a GPU (--gpu-cases).
GPU_CASES: dict[str, tuple[int, Callable[[int, int, str], Case]]] = {
    "vit_base_film": (256, lambda b, t, a: image_case("ViT-Base + FiLM, 224²", VIT_BASE, (3, 224, 224), 100, b,
                                                      peft="film", weights="random", attention=a)),
    "roberta_lora": (64, lambda b, t, a: text_case(f"RoBERTa-base + LoRA, {t} tokens (half padded)",
                                                   f"hf:{roberta_base_random()}", 5, b, t, peft="lora",
                                                   weights="random", attention=a)),
}


def build_case(name: str, batch: int | None, tokens: int, attention: str, device: str) -> Case:
    default_batch, build = {**CASES, **GPU_CASES}[name]
    torch.manual_seed(0)
    case = build(batch or default_batch, tokens, attention)
    inputs = ({k: v.to(device) for k, v in case.inputs.items()} if isinstance(case.inputs, dict)
              else case.inputs.to(device))
    return Case(case.label, case.model.to(device), inputs, case.targets.to(device))


def method_names() -> list[str]:
    """The methods to run: non-private, dptune's exact engines (book-keeping hooks, the default,
    and the whole-model vmap reference), Opacus hooks and ghost."""
    return ["non-private", *[f"dptune {e}" for e in DPTUNE_ENGINES], "Opacus hooks", "Opacus ghost"]


def make_step(method: str, model: nn.Module, inputs: Inputs, targets: torch.Tensor,
              lr: float = 1e-3) -> Callable[[], None]:
    """One full optimizer step of ``method`` on ``model`` (which it trains: pass a copy) and the
    fixed batch; on CUDA the step waits for the device."""
    batch = len(targets)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    if method == "non-private":
        def step() -> None:
            opt.zero_grad()
            nn.functional.cross_entropy(model_outputs(model, inputs), targets).backward()
            opt.step()
    elif method.startswith("dptune "):
        variant = method.split()[1]  # exact (book-keeping), two-pass (its memory fallback, forced), vmap
        loss = nn.CrossEntropyLoss(reduction="none")
        engine = DPEngine(model, loss, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=batch,
                          norm_estimator=VmapNormEngine(model, loss) if variant == "vmap" else "exact")
        if variant == "two-pass":
            engine.norms.max_kept_bytes = 0

        def step() -> None:
            opt.zero_grad()
            engine.private_gradient(inputs, targets)
            opt.step()
    elif method == "Opacus hooks":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer
        from opacus.validators import ModuleValidator

        model = ModuleValidator.fix(model)  # nn.LSTM → DPLSTM, nn.MultiheadAttention → DPMultiheadAttention
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
        wrapped = GradSampleModule(model)
        dp_opt = DPOptimizer(opt, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=batch)

        def step() -> None:
            dp_opt.zero_grad()
            nn.functional.cross_entropy(model_outputs(wrapped, inputs), targets).backward()
            dp_opt.step()
    elif method == "Opacus ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
        from opacus.validators import ModuleValidator

        model = ModuleValidator.fix(model)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
        wrapped = GradSampleModuleFastGradientClipping(model, max_grad_norm=1.0, use_ghost_clipping=True)
        dp_opt = DPOptimizerFastGradientClipping(opt, noise_multiplier=1.0, max_grad_norm=1.0,
                                                 expected_batch_size=batch)
        criterion = DPLossFastGradientClipping(wrapped, dp_opt, nn.CrossEntropyLoss())

        def step() -> None:
            dp_opt.zero_grad()
            criterion(model_outputs(wrapped, inputs), targets).backward()  # two backward passes inside
            dp_opt.step()
    else:
        raise ValueError(f"unknown method {method!r}")
    if targets.is_cuda:
        def synced() -> None:
            step()
            torch.cuda.synchronize()

        return synced
    return step


def failure(exc: BaseException) -> str:
    """A table cell for a method that could not run: 'fails: <type>: <first line>'."""
    line = (str(exc).strip().splitlines() or [""])[0].replace("|", "/")
    return f"fails: {type(exc).__name__}: {line[:90]}"


def interleaved_medians(steps: dict[str, Callable[[], None]], repeats: int) -> dict[str, float | str]:
    """Median step time (s) of each method, timed round-robin so that load changes on a shared
    machine hit all alike; a method that raises in its warm-up step gets a failure cell instead."""
    results: dict[str, float | str] = {}
    for name, step in steps.items():
        try:
            step()  # warm-up
        except Exception as exc:  # noqa: BLE001 - one method's failure must not stop the others
            results[name] = failure(exc)
    running = {name: step for name, step in steps.items() if name not in results}
    times: dict[str, list[float]] = {name: [] for name in running}
    for _ in range(repeats):
        for name, step in running.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    results.update({name: statistics.median(t) for name, t in times.items()})
    return {name: results[name] for name in steps}


def method_steps(case: Case, methods: list[str]) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """Steps of the methods that can be built on ``case`` (each on its own copy of the model),
    and failure cells of those that cannot."""
    steps, failed = {}, {}
    for method in methods:
        try:
            steps[method] = make_step(method, copy.deepcopy(case.model), case.inputs, case.targets)
        except Exception as exc:  # noqa: BLE001
            failed[method] = failure(exc)
    return steps, failed


def rate(value: float | str) -> str:
    """examples/s (or a failure cell) for a table."""
    if isinstance(value, str):
        return value
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"
