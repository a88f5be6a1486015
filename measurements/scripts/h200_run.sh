#!/usr/bin/env bash
# One batched GPU session on a lent H200 (see measurements/gpu-notes.md): run from the repository root as
#   OUT=<folder> bash measurements/scripts/h200_run.sh STAGE [STAGE ...]
# Stages: tests (GPU correctness tests), bench-part4 (Part 4, its production steps and
# torch._grouped_mm under the cold-l2 protocol), bench-rest (Parts 1-3 under cold-l2),
# bench-rotated (Part 4 and torch._grouped_mm under the rotated protocol); fp8-tests (Part 7's GPU
# tests), fp8-tune (Part 7's kernel tuned on $FP8_MODELS into $OUT/tuned_configs.json, which later
# stages read), fp8-bench (Part 4 against Part 7 on $FP8_MODELS and $FP8_MORE under cold-l2),
# bench-untuned (Part 4 and torch._grouped_mm on shapes the table was never tuned for: $UNTUNED and a
# topk = 1 shape); backward-tests (Part 8's GPU tests), backward (Part 8's script, measurements/scripts/h200_backward.py;
# pip install liger-kernel first for its second anchor).
# Each stage writes its log and CSVs under $OUT; a failing stage does not stop the next.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MODELS=${MODELS:-Mixtral-8x7B,Qwen3-30B-A3B,DeepSeek-V3}
FP8_MODELS=${FP8_MODELS:-DeepSeek-V3,Qwen3-30B-A3B,Kimi-K2}
FP8_MORE=${FP8_MORE:-Mixtral-8x7B,DeepSeek-V2-Lite}
FP8_TUNE_MIN=${FP8_TUNE_MIN:-1.2}
export MOE_TUTORIAL_CONFIG_DIR=$OUT
PART4=sorted,sorted+align,sorted-heuristic,grouped_mm,minimal,+grouped,+tuned,+tma,persistent,unfused,+router-epilogue,+silu-epilogue,+decode-align,+sorted-act
UNTUNED=${UNTUNED:-Qwen1.5-MoE-A2.7B,DeepSeek-V2-Lite,Kimi-K2}
python3 -c "import torch, triton; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
for stage in "$@"; do
  echo "=== $stage $(date -u +%H:%M:%S)"
  case $stage in
    tests)
      python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/test_sorted_kernel.py tests/test_minimal_sorted_kernel.py \
        tests/test_bench.py tests/test_align.py tests/test_topk_sum.py 2>&1 | tail -15 | tee "$OUT/tests.log" ;;
    bench-part4)
      python3 -m moe_tutorial bench --models $MODELS --impls $PART4 --protocol cold-l2 --no-progress \
        --max-seconds-per-case 1 --out "$OUT/part4" > "$OUT/bench-part4.log" 2>&1; tail -40 "$OUT/bench-part4.log" ;;
    bench-rest)
      python3 -m moe_tutorial bench --models $MODELS --impls loop,indexing,published,fused --protocol cold-l2 \
        --no-progress --max-seconds-per-case 1 --out "$OUT/rest" > "$OUT/bench-rest.log" 2>&1; tail -30 "$OUT/bench-rest.log" ;;
    bench-rotated)
      python3 -m moe_tutorial bench --models $MODELS --impls sorted,sorted+align,grouped_mm --protocol rotated \
        --no-progress --max-seconds-per-case 1 --out "$OUT/rotated" > "$OUT/bench-rotated.log" 2>&1; tail -30 "$OUT/bench-rotated.log" ;;
    fp8-tests)
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8.py 2>&1 | tee "$OUT/fp8-tests.log" | tail -15 ;;
    fp8-tune)
      # Start from the shipped table, so the M this run does not tune keep their entries.
      [ -f "$OUT/tuned_configs.json" ] || cp moe_tutorial/data/tuned_configs_h200.json "$OUT/tuned_configs.json"
      for m in ${FP8_MODELS//,/ }; do
        python3 -m moe_tutorial tune --model $m --dtype fp8 --max-minutes $FP8_TUNE_MIN -M ${FP8_TUNE_M:-1,8,64,256,1024,4096,16384} >> "$OUT/fp8-tune.log" 2>&1
      done; grep -v rejected "$OUT/fp8-tune.log" | tail -30 ;;
    fp8-bench)
      python3 -m moe_tutorial bench --models $FP8_MODELS,$FP8_MORE --impls ${FP8_IMPLS:-sorted,fp8,fp8-step0,fp8+swap,fp8+tma} --protocol cold-l2 --no-progress \
        --max-seconds-per-case 1 --out "$OUT/fp8" > "$OUT/fp8-bench.log" 2>&1; tail -40 "$OUT/fp8-bench.log" ;;
    bench-untuned)
      python3 -m moe_tutorial bench --models $UNTUNED --impls sorted,grouped_mm --protocol cold-l2 --no-progress \
        --max-seconds-per-case 1 --out "$OUT/untuned" > "$OUT/bench-untuned.log" 2>&1
      python3 -m moe_tutorial bench --E 32 --N 8192 --K 4096 --topk 1 --impls sorted,grouped_mm --protocol cold-l2 \
        --no-progress --max-seconds-per-case 1 --out "$OUT/untuned-topk1" >> "$OUT/bench-untuned.log" 2>&1
      grep -A12 "geometric mean" "$OUT/bench-untuned.log" | head -60 ;;
    backward-tests)
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py 2>&1 | tee "$OUT/backward-tests.log" | tail -15 ;;
    backward)
      # Part 8: gradients on real shapes, step times against the anchors, memory, tiles (about 8 minutes).
      python3 measurements/scripts/h200_backward.py --out "$OUT/backward" 2>&1 | tee "$OUT/backward.log" | tail -60 ;;
    *) echo "unknown stage $stage" ;;
  esac
  rm -f "$OUT"/*/*.png   # the CSVs hold the data; the tool brings back at most 8 files
done
echo "=== done $(date -u +%H:%M:%S)"
