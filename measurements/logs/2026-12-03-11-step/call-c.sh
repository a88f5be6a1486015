set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/c; mkdir -p $D/ds $D/bw
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "=== DeepSeek-V3 T=16384 dW tile sweep, then shipped $(date -u +%T)"
timeout 90 python3 measurements/scripts/h200_backward.py --no-times --no-grads --tile-case DeepSeek-V3:16384 --tile-gemms dw2,dw13 --max-minutes 1.3 --out $D/ds > $D/ds/sweep.log 2>&1; echo rc $?; sed -n '/^3\./,$p' $D/ds/sweep.log | cut -c1-200
python3 - <<'PY'
import json, os
new = json.load(open(os.environ["OUT"] + "/c/ds/tuned_configs_training.json"))
path = "moe_tutorial/data/tuned_configs_training_h200.json"
table = json.load(open(path))
for gpu, entries in new.items():
    table.setdefault(gpu, {}).update(entries)
    print("shipped:", *entries)
table["NVIDIA H200"] = dict(sorted(table["NVIDIA H200"].items()))
open(path, "w").write(json.dumps(table, indent=1) + "\n")
PY
cp moe_tutorial/data/tuned_configs_training_h200.json $D/
echo "=== backward all models, all T, grads, ours against ours-gathered $(date -u +%T)"
timeout 330 python3 measurements/scripts/h200_backward.py --models Qwen3-30B-A3B,DeepSeek-V3,Mixtral-8x7B --tokens 4096,16384,32768 --no-tiles --max-minutes 5.2 --out $D/bw > $D/bw/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/bw/backward.log | cut -c1-235
echo "=== notebook 08 under nbval-lax $(date -u +%T)"
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 120 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/08_training.ipynb > $D/notebook-08-nbval.log 2>&1; echo rc $?; tail -2 $D/notebook-08-nbval.log
echo "=== done $(date -u +%T)"

