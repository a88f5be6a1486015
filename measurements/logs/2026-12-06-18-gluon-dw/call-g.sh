# Part 8's dW GEMMs in Gluon (kernels/gluon_grad_kernel.py, written in the eighteenth session): its GPU
# tests, the dW tile sweep on DeepSeek-V3 (the step under 1.25x at T = 16384 and 32768) with the Gluon
# candidates beside the tl ones, the winners merged into the H200 training table, and DeepSeek-V3's
# step timed again at every T against the torch._grouped_mm composition.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/g; mkdir -p $D/ds16 $D/ds4 $D/bw
pack() { tar czf $OUT/call-g.tar.gz -C $OUT g; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== GPU tests $(date -u +%T)"
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -k gluon -rA > $D/gpu-tests.log 2>&1; echo rc $?; grep -E "passed|failed|Error|assert" $D/gpu-tests.log | tail -6; pack
for c in 16384:ds16:1.8:130 4096:ds4:0.9:70; do
  IFS=: read T dir mins lim <<< "$c"
  echo "=== DeepSeek-V3 T=$T dW tile sweep $(date -u +%T)"
  timeout $lim python3 measurements/scripts/h200_backward.py --no-times --no-grads --tile-case DeepSeek-V3:$T --tile-gemms dw2,dw13 --max-minutes $mins --out $D/$dir > $D/$dir/sweep.log 2>&1; echo rc $?; sed -n '/^3\./,$p' $D/$dir/sweep.log | cut -c1-200; pack
done
python3 - <<'PY'
import json, os
import moe_tutorial  # noqa: F401
from moe_tutorial.kernels.configs import gpu_name, user_table_path
# The shipped table is the H200's; on another GPU the winners go to the user's table, which the
# package reads first, so that the step below runs them all the same.
path = "moe_tutorial/data/tuned_configs_training_h200.json" if gpu_name() == "NVIDIA H200" else str(user_table_path())
print("merging into", path)
table = json.load(open(path)) if os.path.exists(path) else {}
for d in ("ds16", "ds4"):
    f = os.path.join(os.environ["OUT"], "g", d, "tuned_configs_training.json")
    if not os.path.exists(f):
        continue
    for gpu, entries in json.load(open(f)).items():
        for key, by_m in entries.items():
            table.setdefault(gpu, {}).setdefault(key, {}).update(by_m)
            print("merged:", key, by_m)
table[gpu_name()] = dict(sorted(table.get(gpu_name(), {}).items()))
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
open(path, "w").write(json.dumps(table, indent=1) + "\n")
open(os.path.join(os.environ["OUT"], "g", "merged-table.json"), "w").write(json.dumps(table, indent=1) + "\n")
PY
echo "=== DeepSeek-V3 step, all T, the merged table $(date -u +%T)"
timeout 230 python3 measurements/scripts/h200_backward.py --models DeepSeek-V3 --tokens 4096,16384,32768 --no-tiles --no-grads --max-minutes 3.4 --out $D/bw > $D/bw/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/bw/backward.log | cut -c1-200; pack
echo "=== done $(date -u +%T)"
