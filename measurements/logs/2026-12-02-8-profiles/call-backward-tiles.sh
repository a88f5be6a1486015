set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT; mkdir -p $D/tiles $D/qwen3
echo "=== backward GPU tests $(date -u +%T)"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py tests/test_training.py > $D/backward-tests.log 2>&1; tail -4 $D/backward-tests.log
echo "=== tile sweep, Qwen3 T=32768, dA' without spills $(date -u +%T)"
timeout 200 python3 measurements/scripts/h200_backward.py --models Qwen3-30B-A3B --tokens 32768 --no-grads --out $D/tiles > $D/tiles/tiles.log 2>&1; grep -A8 "^3\. tiles" $D/tiles/tiles.log; grep "T= 32768" $D/tiles/tiles.log
mkdir -p /tmp/cfg && cp $D/tiles/tuned_configs_training.json /tmp/cfg/tuned_configs.json && export MOE_TUTORIAL_CONFIG_DIR=/tmp/cfg
echo "=== Qwen3 timing with the swept tiles, grads $(date -u +%T)"
timeout 230 python3 measurements/scripts/h200_backward.py --models Qwen3-30B-A3B --tokens 4096,16384,32768 --no-tiles --max-minutes 4.5 --out $D/qwen3 > $D/qwen3/qwen3.log 2>&1; sed -n '/^1\./,$p' $D/qwen3/qwen3.log | cut -c1-250
rm -f $D/tiles/h200_backward.csv
echo "=== notebook 08 under nbval-lax $(date -u +%T)"
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 120 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/08_*.ipynb > $D/nb08.log 2>&1; tail -3 $D/nb08.log
echo "=== done $(date -u +%T)"
