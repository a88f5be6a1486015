# Call a again with its data kept (call a's files past 8 did not come back): the first call written to
# first_call.csv, side by side and one by one, each model in a fresh process, the machine's first
# process first; then notebook 08 under nbval-lax (the layer now precompiles by default). Everything
# is packed into one tarball, written outside $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/b; mkdir -p $D
pack() { tar -czf $OUT/call-b.tgz -C /tmp b; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt; nproc | tee -a $D/gpu.txt
fc() { timeout 60 python3 measurements/scripts/first_call_profile.py --tokens 4096 --out $D "$@" 2>&1 | grep -E "first call|rror" | tee -a $D/first-call.txt; }
fc --model Mixtral-8x7B; fc --model Mixtral-8x7B --serial
fc --model DeepSeek-V3 --serial; fc --model DeepSeek-V3
fc --model Qwen3-30B-A3B; fc --model Qwen3-30B-A3B --serial
fc --model Mixtral-8x7B --warm-torch; fc --model Mixtral-8x7B --warm-torch --serial
pack
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 150 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/08_training.ipynb > $D/notebook-08-nbval.log 2>&1; echo rc $?; tail -2 $D/notebook-08-nbval.log
pack
