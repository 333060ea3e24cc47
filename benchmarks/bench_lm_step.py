"""The DP step on a language model: SmolLM2-135M (the embedded GGUF, Llama architecture) on a fixed
batch of B prompt/completion sequences of T tokens (the first quarter of each a masked prompt, every
second sequence padded after three quarters), with LoRA (r = 32 on q and v) or full fine-tuning.

One full optimizer step per method, timed interleaved round after round (median): non-private
(the mean of the per-example completion NLLs), dptune exact (book-keeping), dptune Hutchinson
(k = 32 probes), Opacus 1.6 hooks (GradSampleModule + DPOptimizer) and ghost
(GradSampleModuleFastGradientClipping); a method that cannot run gets a "fails: …" cell. Peak
memory of a step (``peak_memory``): the CUDA allocator's on a GPU, the resident memory above the
step's start on CPU.

Run: python benchmarks/bench_lm_step.py [--tokens 256] [--batch 4] [--repeats 3] [--peft lora full]
         [--methods non-private "dptune exact"]
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from common import failure, interleaved_medians
from dptune.trainables import DPEngine
from dptune.trainables.data.generation import IGNORE
from dptune.trainables.engine.batching import model_outputs
from dptune.trainables.models.catalog import create_model, parameter_summary
from dptune.trainables.tasks import completion_nll

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
METHODS = ("non-private", "dptune exact", "dptune hutchinson k=32", "Opacus hooks", "Opacus ghost")


def batch(model: nn.Module, size: int, tokens: int) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab, (size, tokens), generator=g)
    mask = torch.ones_like(ids)
    mask[1::2, 3 * tokens // 4:] = 0
    labels = ids.masked_fill(mask == 0, IGNORE)
    labels[:, : tokens // 4] = IGNORE
    return {"input_ids": ids.to(DEVICE), "attention_mask": mask.to(DEVICE)}, labels.to(DEVICE)


def make_step(method: str, model: nn.Module, x: dict, y: torch.Tensor) -> Callable[[], None]:
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    size = len(y)
    if method == "non-private":
        def step() -> None:
            opt.zero_grad()
            completion_nll(model_outputs(model, x), y).mean().backward()
            opt.step()
    elif method.startswith("dptune"):
        estimator = "hutchinson" if "hutchinson" in method else "exact"
        engine = DPEngine(model, completion_nll, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=size,
                          norm_estimator=estimator, sketch_k=32 if estimator == "hutchinson" else None)

        def step() -> None:
            opt.zero_grad()
            engine.private_gradient(x, y)
            opt.step()
    elif method == "Opacus hooks":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        wrapped = GradSampleModule(model)
        dp_opt = DPOptimizer(opt, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=size)

        def step() -> None:
            dp_opt.zero_grad()
            completion_nll(model_outputs(wrapped, x), y).mean().backward()
            dp_opt.step()
    elif method == "Opacus ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        wrapped = GradSampleModuleFastGradientClipping(model, max_grad_norm=1.0, use_ghost_clipping=True)
        dp_opt = DPOptimizerFastGradientClipping(opt, noise_multiplier=1.0, max_grad_norm=1.0,
                                                 expected_batch_size=size)

        class SequenceNLL(nn.Module):   # Opacus' wrapper sets reduction "none" and expects one loss per example
            reduction = "mean"

            def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
                losses = completion_nll(logits, labels)
                return losses if self.reduction == "none" else losses.mean()

        criterion = DPLossFastGradientClipping(wrapped, dp_opt, SequenceNLL())

        def step() -> None:
            dp_opt.zero_grad()
            criterion(model_outputs(wrapped, x), y).backward()
            dp_opt.step()
    else:
        raise ValueError(method)
    if DEVICE == "cuda":
        def synced() -> None:
            step()
            torch.cuda.synchronize()

        synced.model = model
        return synced
    step.model = model
    return step


def release_gradients(model: nn.Module) -> None:
    """Drop what the last step left on the parameters (gradients; Opacus' per-sample gradients), so
    the next step's peak counts them for every method alike."""
    for p in model.parameters():
        for name in ("grad", "grad_sample", "summed_grad"):
            if getattr(p, name, None) is not None:
                setattr(p, name, None)


def peak_memory(step: Callable[[], None]) -> str:
    """GiB one step needs above the model and optimizer state, its gradients included: after a warm
    step and with the gradients released, the peak during one more step above what was held before
    it — on a GPU the allocator's, on CPU the resident memory's (Linux: VmHWM, reset through
    /proc/self/clear_refs after glibc returned its free memory). Called after the timed steps."""
    release_gradients(step.model)
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        return f"{(torch.cuda.max_memory_allocated() - before) / 2**30:.2f}"
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    step()
    return f"{(_status_kib('VmHWM') - before) / 2**20:.2f}"


def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peft", nargs="+", default=["lora", "full"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, metavar="METHOD",
                        help=f"the methods to time (default all: {', '.join(METHODS)})")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {DEVICE}, {torch.get_num_threads()} thread(s), B = {args.batch}, "
          f"median of {args.repeats} interleaved rounds")
    print("| model | T | method | tokens/s | / non-private | peak GiB |")
    print("|---|---|---|---|---|---|")
    for peft in args.peft:
        torch.manual_seed(0)
        base = create_model("smollm2-135m", num_classes=0, input_shape=(0,), task="generation", peft=peft,
                            lora_rank=32, lora_alpha=32).to(DEVICE)
        trainable, total = parameter_summary(base)
        for tokens in args.tokens:
            x, y = batch(base, args.batch, tokens)
            steps, failed = {}, {}
            for method in args.methods:
                try:
                    steps[method] = make_step(method, copy.deepcopy(base), x, y)
                except Exception as exc:  # noqa: BLE001 - one method's failure must not stop the others
                    failed[method] = failure(exc)
            medians = {**interleaved_medians(steps, args.repeats), **failed}
            plain = medians.get("non-private")
            for method in args.methods:
                value = medians[method]
                if isinstance(value, str):
                    print(f"| SmolLM2-135M + {peft} ({trainable:,} of {total:,}) | {tokens} | {method} | {value} | | |")
                    continue
                rate = args.batch * tokens / value
                ratio = f"{plain / value:.2f}" if isinstance(plain, float) else "—"
                print(f"| SmolLM2-135M + {peft} ({trainable:,} of {total:,}) | {tokens} | {method} | {rate:.0f} | "
                      f"{ratio} | {peak_memory(steps[method]) if method in steps else '—'} |", flush=True)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s)")
