# Twenty-eighth session, call p: first the GPU tests with the package's own edit (YIELD_RESCALED: the
# rescaled forms' reuse-alternate pattern applied after each compile, through Triton's post-compile
# hook), then the three yield patterns of kernels/yield_edit.py against the layer unedited (one
# process a case list; same bits checked). Any Hopper GPU.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/p; mkdir -p $D
pack() { tar -czf $OUT/call-p.tgz -C /tmp p; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
P="python3 -m pytest -q -p no:cacheprovider"
timeout 200 $P -m gpu tests/test_gluon_fp8.py tests/test_fp8.py -k "yield or tma or rescaled" > $D/gpu-tests.log 2>&1
echo "gpu tests rc $?"; tail -3 $D/gpu-tests.log; pack
S=measurements/scripts/yield_layer.py
for c in "Qwen3-30B-A3B 16384 4096" "DeepSeek-V3 16384"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 150 python3 $S --patterns --models $m --M $@ 2>&1 | grep -v Warning | tee $D/$n.log
  pack
done
