# Call e (twenty-seventh session): the layer as now dispatched (128-row Gluon tiles copied out through
# TMA, 64-row ones stored by the warps): its GPU tests, then notebook 07 (its new TMA section) under
# nbval-lax. Carry .whl.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/e; mkdir -p $D
pack() { tar -czf $OUT/call-e.tgz -C /tmp e; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
P="python3 -m pytest -q -p no:cacheprovider"
timeout 200 $P -m gpu tests/test_fp8.py tests/test_fp8_decode.py tests/test_gluon_fp8.py -k "layer" \
  > $D/gpu-tests.log 2>&1; echo "gpu tests rc $?"; tail -2 $D/gpu-tests.log; pack
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
PYTHONPATH=$PWD:/tmp/site python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
PYTHONPATH=$PWD:/tmp/site timeout 150 $P --nbval-lax notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1
echo "nbval rc $?"; tail -2 $D/notebook-07-nbval.log; pack
