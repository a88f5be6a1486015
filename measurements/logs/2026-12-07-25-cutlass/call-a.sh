# Call a, in one call for want of device time (Qwen3-30B-A3B and DeepSeek-V3, M = 4096 and 16384, cold-l2,
# every case timed in one order and then the reverse, the faster kept):
# (the outputs are packed after each step: a call cut short still brings back what it had)
# 1. anchor/: CUTLASS's FP8 grouped GEMM (torch._scaled_grouped_mm, rowwise) and torch._grouped_mm (bf16)
#    beside Part 7's first GEMM (whole, and the Gluon GEMM without its gather: fp8-gemm) and Part 4's bf16
#    one (measurements/scripts/fp8_grouped_anchor.py);
# 2. layer-shipped/: the FP8 and bf16 layers as shipped (bench);
# 3. coalesced: the Gluon epilogues moving their tile into 8 (bf16) or 16 (e4m3) consecutive columns a
#    thread before storing (coalesced_store.py beside this file): fp8-gemm, then the layers (bench);
# 4. no-store: fp8-gemm with store_rows' gl.store behind a test that never holds at run time
#    (`if first_row < 0`: every MMA and the epilogue's arithmetic stay, the C rows are never written).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/a; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee $D/gpu.txt
S=measurements/scripts/fp8_grouped_anchor.py; L=measurements/logs/2026-12-07-25-cutlass
A="--models Qwen3-30B-A3B DeepSeek-V3 --M 4096 16384"
B="bench --gemm layer --impls fp8,sorted --models Qwen3-30B-A3B,DeepSeek-V3 -M 4096,16384 --no-progress"
OUT=$D/anchor timeout 150 python3 $S $A 2>&1 | grep -v Warning | tee $D/anchor.log
tar -czf $OUT/call-a.tgz -C /tmp a
timeout 110 python3 -m moe_tutorial $B --out $D/layer-shipped 2>&1 | grep -v Warning | tail -12 | tee $D/layer-shipped.log
tar -czf $OUT/call-a.tgz -C /tmp a
mkdir -p /tmp/orig && cp moe_tutorial/kernels/gluon_kernel.py moe_tutorial/kernels/gluon_fp8_kernel.py /tmp/orig/
python3 $L/coalesced_store.py && diff -ru /tmp/orig moe_tutorial/kernels > $D/coalesced.diff
OUT=$D/coalesced timeout 100 python3 $S --impls fp8-gemm $A 2>&1 | grep -v Warning | tee $D/coalesced.log
timeout 110 python3 -m moe_tutorial $B --out $D/layer-coalesced 2>&1 | grep -v Warning | tail -12 | tee $D/layer-coalesced.log
tar -czf $OUT/call-a.tgz -C /tmp a
cp /tmp/orig/*.py moe_tutorial/kernels/
python3 - <<'PY'
from pathlib import Path
p = Path("moe_tutorial/kernels/gluon_kernel.py"); s = p.read_text()
old = "        gl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))\n"
assert s.count(old) == 1
p.write_text(s.replace(old, "        if first_row < 0:\n    " + old))
PY
diff -ru /tmp/orig moe_tutorial/kernels > $D/no-store.diff
OUT=$D/no-store timeout 100 python3 $S --impls fp8-gemm $A 2>&1 | grep -v Warning | tee $D/no-store.log
cp /tmp/orig/*.py moe_tutorial/kernels/
tar -czf $OUT/call-a.tgz -C /tmp a
