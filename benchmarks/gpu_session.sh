#!/usr/bin/env bash
# Every measurement the docs take from a GPU, as one run within a time budget.
#
#     bash benchmarks/gpu_session.sh OUT [BUDGET_SECONDS]    # from the repository root; BUDGET defaults to 580
#
# It uses the machine's own torch and Lightning (src/ on PYTHONPATH) and writes under OUT the log of each part, the
# benchmark JSON and Markdown, and the profiles. Each part gets its share of the budget as a time limit (the shares
# below add up to 580 s); a failing or timed-out part does not stop the next.
#
#  1. after_the_wrap.py: a compiled model under DDP, stock Lightning (steps compiled before the wrap) against compiled
#     again after the wrap: what runs in the graph, graphs and breaks, the steady step; on one GPU, and on two where
#     the machine has them (then in place of regions_hf, to stay within the limit). Then bench.py: one device, whole
#     against regional.
#  2. docs/repros/regions_gpu_probe.py --profile: whole against regional in a plain loop, profiled, and both again
#     under CUDA graphs (mode="reduce-overhead"): is the regional gap host overhead or GPU work?
#  3. The seed script on CUDA (NCCL, compiled autograd), both ways.
#  4. The regional memory-leak test, reading CUDA allocated memory.
#  5. regions_hf.py: a 32-layer transformers Llama, whole against regional (its blocks compiled one by one), if the
#     machine has transformers.
#  6. compiled_autograd.py on one GPU: use_compile=True with and without compiled_autograd.
set -u
OUT=${1:-/tmp/gpu-session}
BUDGET=${2:-580}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" LIGHTNING_COMPILE_PATCH_ALLOW_UNTESTED=1 PYTHONUNBUFFERED=1

part() {  # part NAME SHARE COMMAND...: runs COMMAND within SHARE/580 of the budget, its output into OUT/NAME.log
    local name=$1 limit=$(($2 * BUDGET / 580))
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/parts.txt"
}

python -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__, torch.cuda.get_device_name())" | tee "$OUT/versions.txt"
NOTE="Run by benchmarks/gpu_session.sh on the machine's own torch and Lightning."
part after_the_wrap_1gpu 125 python benchmarks/after_the_wrap.py --accelerator cuda --devices 1 --steps 40 \
    --out "$OUT/after_the_wrap_1gpu"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" -ge 2 ]; then
    part after_the_wrap_2gpu 90 python benchmarks/after_the_wrap.py --accelerator cuda --devices 2 --steps 40 \
        --out "$OUT/after_the_wrap_2gpu"
fi
part bench_regional 120 python benchmarks/bench.py --mode cuda --strategies auto --paths whole,regional --steps 25 \
    --out "$OUT/bench_regional" --note "$NOTE"
part probe 90 python docs/repros/regions_gpu_probe.py --steps 12 --profile "$OUT/profile" \
    --variants "whole,regions+rest+step,whole/reduce-overhead,regions+rest+step/reduce-overhead"
part seed_compiled 30 python examples/seed_ddp_compiled_autograd.py --model compiled --accelerator cuda
part seed_plain 30 python examples/seed_ddp_compiled_autograd.py --model plain --accelerator cuda
if python -c "import pytest" 2>/dev/null; then
    part leak_test 40 python -m pytest -q -p no:cacheprovider -o addopts="" tests/test_regions.py -k cuda_allocated
else
    echo "leak_test: skipped, no pytest on this machine" | tee -a "$OUT/parts.txt"
fi
if [ "$GPUS" -lt 2 ] && python -c "import transformers" 2>/dev/null; then
    part regions_hf 90 python benchmarks/regions_hf.py --layers 32 --steps 10 --accelerator cuda --out "$OUT/regions_hf"
else
    echo "regions_hf: skipped, no transformers on this machine" | tee -a "$OUT/parts.txt"
fi
part compiled_autograd 55 python benchmarks/compiled_autograd.py --accelerator cuda --world-sizes 1 --strategy auto \
    --steps 20 --repeats 1 --out "$OUT/compiled_autograd"
cat "$OUT/parts.txt"
