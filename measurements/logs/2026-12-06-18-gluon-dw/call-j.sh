# The dW tile sweep again, with the sweep's buffers cut to fit an 80 GB card (call g's sweeps ran out
# of memory on an H100): DeepSeek-V3 at T = 4096, 16384 and 32768, the Gluon candidates first; the
# winners into the user's table (or the H200's on an H200), then the step against the composition.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/j; mkdir -p $D/bw
pack() { tar czf $OUT/call-j.tar.gz -C $OUT j; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
rm -f ~/.cache/moe_tutorial/tuned_configs.json
for T in 16384 32768 4096; do
  mkdir -p $D/ds$T
  echo "=== DeepSeek-V3 T=$T dW tile sweep $(date -u +%T)"
  timeout 110 python3 measurements/scripts/h200_backward.py --no-times --no-grads --tile-case DeepSeek-V3:$T --tile-gemms dw2,dw13 --max-minutes 1.6 --out $D/ds$T > $D/ds$T/sweep.log 2>&1; echo rc $?; sed -n '/^3\./,$p' $D/ds$T/sweep.log | cut -c1-200; pack
done
python3 - <<'PY'
import json, os
import moe_tutorial  # noqa: F401
from moe_tutorial.kernels.configs import gpu_name, user_table_path
path = "moe_tutorial/data/tuned_configs_training_h200.json" if gpu_name() == "NVIDIA H200" else str(user_table_path())
print("merging into", path)
table = json.load(open(path)) if os.path.exists(path) else {}
for T in ("16384", "32768", "4096"):
    f = os.path.join(os.environ["OUT"], "j", "ds" + T, "tuned_configs_training.json")
    if not os.path.exists(f):
        continue
    for gpu, entries in json.load(open(f)).items():
        for key, by_m in entries.items():
            table.setdefault(gpu, {}).setdefault(key, {}).update(by_m)
            print("merged:", key, by_m)
table[gpu_name()] = dict(sorted(table.get(gpu_name(), {}).items()))
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
open(path, "w").write(json.dumps(table, indent=1) + "\n")
open(os.path.join(os.environ["OUT"], "j", "merged-table.json"), "w").write(json.dumps(table, indent=1) + "\n")
PY
echo "=== DeepSeek-V3 step, all T, the merged table $(date -u +%T)"
timeout 170 python3 measurements/scripts/h200_backward.py --models DeepSeek-V3 --tokens 4096,16384,32768 --no-tiles --no-grads --max-minutes 2.6 --out $D/bw > $D/bw/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/bw/backward.log | cut -c1-200; pack
echo "=== done $(date -u +%T)"
