# Not run (the nineteenth session's device time ran out): the backward's GPU tests that compare the
# sorted copies and the persistent grid against the same tiles in tl (call f found two comparing the
# table's Gluon configs with the gathered path), then notebook 08 under nbval-lax with the new table.
# First, in fresh processes, where the first call's seconds go (Mixtral-8x7B and DeepSeek-V3, T = 4096).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; mkdir -p $OUT/t
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/t/gpu.txt
for m in Mixtral-8x7B DeepSeek-V3; do
  timeout 70 python3 measurements/scripts/first_call_profile.py --model $m --tokens 4096 --out $OUT/t 2>&1 | tail -16
done
timeout 250 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -rA > $OUT/t/gpu-tests.log 2>&1; echo rc $?; tail -3 $OUT/t/gpu-tests.log
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 190 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/08_training.ipynb > $OUT/t/notebook-08-nbval.log 2>&1; echo rc $?; tail -3 $OUT/t/notebook-08-nbval.log
