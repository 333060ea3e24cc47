"""What mixed precision costs or saves in a DP step (issue 47): ``precision`` fp32, bf16 and fp16
(autocast of the forward and backward; norms, clipping, sums and noise in float32) against the
non-private step in fp32 and in bf16, on one fixed batch, timed interleaved (median of ``--repeats``).

Cases: the cnn (digits-sized and 28×28 images), ViT (Tiny on a CPU, Base on a GPU) with FiLM, and
SmolLM2-135M with LoRA (the embedded GGUF, Llama architecture; T tokens, a quarter masked prompt).
On a CPU, autocast to bf16 pays where the CPU has bf16 matrix units (AVX512-BF16 / AMX) and costs
casts where it has not; on a GPU it is the tensor cores' format.

Run: python benchmarks/bench_precision.py [--cases cnn vit lm] [--repeats 5] [--device cpu]
"""
from __future__ import annotations

import argparse
import copy
import platform

import torch
from torch import nn

from common import Case, build_case, interleaved_medians
from dptune.trainables import DPEngine
from dptune.trainables.engine.batching import model_outputs
from dptune.trainables.engine.precision import Precision

PRECISIONS = ("fp32", "bf16", "fp16")


def lm_case(tokens: int, batch: int, device: str) -> tuple[Case, nn.Module]:
    from bench_lm_step import batch as lm_batch
    from dptune.trainables.models.catalog import create_model
    from dptune.trainables.tasks import completion_nll

    torch.manual_seed(0)
    model = create_model("smollm2-135m", num_classes=0, input_shape=(tokens,), task="generation", peft="lora",
                         lora_rank=32).to(device)
    x, y = lm_batch(model, batch, tokens)
    return Case(f"SmolLM2-135M + LoRA r=32, B={batch}, T={tokens}", model, x, y), completion_nll


def steps(case: Case, loss: nn.Module) -> dict:
    """One optimizer step per (method, precision) on its own copy of the model."""
    out = {}
    for name in ("non-private fp32", "non-private bf16", *(f"DP {p}" for p in PRECISIONS)):
        model = copy.deepcopy(case.model)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        precision = Precision(name.split()[-1])
        if name.startswith("non-private"):
            def step(model=model, opt=opt, precision=precision) -> None:
                opt.zero_grad()
                with precision.autocast(case.targets.device):
                    value = loss(model_outputs(model, case.inputs), case.targets).mean()
                value.backward()
                opt.step()
        else:
            engine = DPEngine(model, loss, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=len(case.targets),
                              precision=precision.name)

            def step(engine=engine, opt=opt) -> None:
                opt.zero_grad()
                engine.private_gradient(case.inputs, case.targets)
                opt.step()
        if case.targets.is_cuda:
            def synced(step=step) -> None:
                step()
                torch.cuda.synchronize()
            out[name] = synced
        else:
            out[name] = step
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["cnn", "vit", "lm"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1) if args.device == "cpu" else None
    flags = open("/proc/cpuinfo").read() if args.device == "cpu" else ""
    units = [f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16") if f in flags]
    print(f"device: {torch.cuda.get_device_name() if args.device == 'cuda' else platform.processor() or 'cpu'}; "
          f"torch {torch.__version__}; 1 thread on a CPU; bf16/fp16 units: {', '.join(units) or 'none'}\n")
    print("| case | " + " | ".join(("non-private fp32", "non-private bf16", *(f"DP {p}" for p in PRECISIONS)))
          + " | DP bf16 / DP fp32 |")
    print("|---" * 7 + "|")
    ce = nn.CrossEntropyLoss(reduction="none")
    for name in args.cases:
        if name == "lm":
            case, loss = lm_case(args.tokens, 4, args.device)
        elif name == "vit":
            case, loss = build_case("vit_tiny_film" if args.device == "cpu" else "vit_base_film",
                                    8 if args.device == "cpu" else 64, 0, "eager", args.device), ce
        else:
            case, loss = build_case("cnn", 64, 0, "eager", args.device), ce
        medians = interleaved_medians(steps(case, loss), args.repeats)
        cells = [f"{v * 1e3:.1f} ms" if isinstance(v, float) else v for v in medians.values()]
        ratio = medians["DP bf16"] / medians["DP fp32"] if all(isinstance(medians[k], float)
                                                               for k in ("DP bf16", "DP fp32")) else float("nan")
        print(f"| {case.label} | " + " | ".join(cells) + f" | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
