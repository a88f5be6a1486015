# Call b (whichever GPU comes). On an H100: notebook 07 top to bottom under nbval-lax (its stored kernel diff
# changed with the one-scale kernel; it last ran on a GPU before that). On an H200: pending/call-c.sh (the
# first calls side by side and one by one, then notebook 08), then notebook 07, all in one tarball. Carry .whl.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/b; mkdir -p $D
pack() { tar -czf $OUT/call-b.tgz -C /tmp b; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$OUT bash measurements/logs/2026-12-06-21-precompile/call-b.sh
fi
timeout 240 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1; echo rc $?; tail -2 $D/notebook-07-nbval.log
pack
