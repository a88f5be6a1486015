# Twenty-ninth session, call k: where the 128-row rescaled pair beats the dispatched 64-row tiles
# (call s: Kimi-K2 at M = 4096, 1.73x against 1.51x), by rows an expert; then notebook 07 under nbval.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/k; mkdir -p $D
pack() { tar -czf $OUT/call-k.tgz -C /tmp k; }
S=measurements/scripts/half_skip_layer.py
for c in "Kimi-K2 2048 4096 8192" "DeepSeek-V3 2048 8192"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 150 python3 $S --models $m --M $@ 2>&1 | grep -v Warning | tee $D/$n.log
  pack
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
PYTHONPATH=$PWD:/tmp/site python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
PYTHONPATH=$PWD:/tmp/site timeout 200 python3 -m pytest -q -p no:cacheprovider --nbval-lax notebooks/07_fp8_experts.ipynb \
  > $D/notebook-07-nbval.log 2>&1
echo "nbval rc $?"; tail -2 $D/notebook-07-nbval.log; pack
