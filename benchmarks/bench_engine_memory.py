"""Peak memory and throughput of one DP step on long sequences (issue 16): MiniLM-L6 + LoRA at
512 tokens (half of the examples padded), dptune exact vs Opacus ghost vs Opacus hooks vs
non-private.

Each method runs in its own subprocess: it builds the model, then takes one warm-up and
--repeats timed full optimizer steps on a fixed batch. Peak memory is what the steps add on top of
the built model (after one plain forward/backward on one example, which initialises torch's
lazily loaded kernels): on CPU the peak RSS (resource.getrusage ru_maxrss, its high-water mark reset after
the build where Linux allows it) minus the RSS after the build; on CUDA
torch.cuda.max_memory_allocated minus the memory allocated after the build. examples/s = B / median
step (the methods run one after another here, not interleaved: compare with bench_engine.py's
interleaved figures for speed).

Run: python benchmarks/bench_engine_memory.py [--case minilm_lora] [--tokens 512] [--batch 16]
         [--repeats 3] [--methods ...] [--device cpu|cuda] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

#: "dptune two-pass" is the book-keeping engine forced into its memory fallback (two backward passes).
METHODS = ["non-private", "dptune exact", "dptune two-pass", "Opacus ghost", "Opacus hooks"]


def rss_mib() -> float:
    """Resident set size now (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark (which ru_maxrss reports) to the current RSS, so
    that building the model does not count; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(args: argparse.Namespace) -> dict:
    """One method: {"peak_mib", "ex_per_s"} or {"error"}; run in a fresh process."""
    import resource
    import statistics
    import time

    import torch
    from torch import nn

    from common import build_case, failure, make_step
    from dptune.trainables.engine.batching import model_outputs

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    try:
        case = build_case(args.case, args.batch, args.tokens, args.attention, args.device)
        # One plain forward/backward on one example first: torch's lazily initialised kernels and
        # buffers (~60 MiB on CPU) would otherwise count against whichever method runs.
        one = {k: v[:1] for k, v in case.inputs.items()} if isinstance(case.inputs, dict) else case.inputs[:1]
        nn.functional.cross_entropy(model_outputs(case.model, one), case.targets[:1]).backward()
        case.model.zero_grad(set_to_none=True)
        step = make_step(args.worker, case.model, case.inputs, case.targets)
        if cuda:
            base = torch.cuda.memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        else:
            base, reset = rss_mib(), reset_peak_rss()
        times = []
        for _ in range(args.repeats + 1):  # the first is the warm-up
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"error": failure(exc)}
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # ru_maxrss is in KiB on Linux
    result = {"peak_mib": peak - base, "ex_per_s": len(case.targets) / statistics.median(times[1:])}
    if not cuda and not reset:
        result["note"] = "peak RSS not reset after the build"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="minilm_lora", help="a case of bench_engine.py")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--attention", choices=["eager", "sdpa"], default="eager")
    parser.add_argument("--device", default=None, help="[cuda if available, else cpu]")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--worker", metavar="METHOD", help=argparse.SUPPRESS)  # internal: run one method
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.worker:
        print(json.dumps(worker(args)))
        return
    what = "peak CUDA memory allocated" if args.device.startswith("cuda") else "peak RSS"
    print(f"{args.case}, {args.tokens} tokens, B = {args.batch}, device {args.device}, {args.threads} thread(s), "
          f"{args.repeats} timed steps per method, each method in its own process")
    print(f"| method | {what} above the built model (MiB) | ex/s |")
    print("|---|---|---|")
    for method in args.methods:
        options = [f"--{k}={v}" for k, v in vars(args).items() if k not in ("methods", "worker")]
        proc = subprocess.run([sys.executable, __file__, *options, "--worker", method], capture_output=True, text=True)
        lines = proc.stdout.strip().splitlines()
        r = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
            "error": f"fails: exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:90]}"}
        if "error" in r:
            print(f"| {method} | {r['error']} | – |", flush=True)
        else:
            note = f" ({r['note']})" if "note" in r else ""
            print(f"| {method} | {r['peak_mib']:.0f}{note} | {r['ex_per_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
