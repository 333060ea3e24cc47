#!/bin/bash
# The GPU figures of BENCHMARKS.md in one run (a lent GPU machine: torch, timm, transformers and
# peft installed; opacus carried as a wheel in .whl/). Writes its tables to ${OUT:-gpu-results}/.
set -u
out=${OUT:-gpu-results}; mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
cd benchmarks
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, timm, transformers, peft, opacus; print('torch', torch.__version__, 'timm', timm.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'opacus', opacus.__version__)" | tee -a "$out/gpu.txt"
timeout 120 python3 check_cuda_engine.py 2>&1 | tee "$out/check.txt"
timeout 240 python3 bench_engine.py --device cuda --cases cnn wrn16_4 vit_tiny_film --gpu-cases --repeats 10 --markdown 2>&1 | tee "$out/engine.md"
timeout 120 python3 bench_engine.py --device cuda --cases cnn wrn16_4 --batch 1024 --repeats 10 --markdown 2>&1 | tee "$out/engine_b1024.md"
timeout 150 python3 bench_engine_memory.py --device cuda --case roberta_lora --tokens 512 --batch 32 2>&1 | tee "$out/memory.md"
timeout 300 python3 bench_precision.py --device cuda --cases vit lm --repeats 10 2>&1 | tee "$out/precision.md"
timeout 90 python3 check_cuda_pack.py 2>&1 | tee "$out/check_pack.txt"
timeout 420 python3 bench_pack.py --device cuda --cases cnn wrn16_4 vit_tiny_film --members 1 4 16 --processes --rounds 3 --steps 5 2>&1 | tee "$out/pack.md"
