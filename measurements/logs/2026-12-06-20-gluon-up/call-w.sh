# The twentieth session's last call: the backward's GPU tests that ran an H100 out of memory in call t
# (two runs' full DeepSeek-V3 gradients; the tests now keep the used experts' only), Part 7's decode
# GPU tests, then notebook 07 under nbval-lax (changed since it last ran on a GPU).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=$OUT/w; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -rA \
  -k "DeepSeek-V3 or Mixtral or gives_the_same_bits_twice" > $D/gpu-tests-backward.log 2>&1; echo rc $?; tail -2 $D/gpu-tests-backward.log
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8_decode.py -rA > $D/gpu-tests-decode.log 2>&1; echo rc $?; tail -2 $D/gpu-tests-decode.log
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 280 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1; echo rc $?; tail -3 $D/notebook-07-nbval.log
