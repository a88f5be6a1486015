# Call d (twenty-seventh session, on the warm GPU after calls t and b): the layer now copies its Gluon
# tiles out through TMA (layer_configs -> configs.copied_out). 1. the GPU tests of the FP8 layer as
# dispatched (real shapes, decode, the Gluon layer forms); 2. tma_store_layer.py where call t did not
# look: Kimi-K2 at M = 4096 and 16384, all three models at M = 1024 (the fused 64-row forms), and
# Qwen3-30B-A3B at M = 16384 again (the run-to-run spread); 3. Nsight Compute on the layer's two Gluon
# GEMMs (TMA forms) at Qwen3-30B-A3B, M = 16384. Outputs packed after each step. Carry .whl.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/d; mkdir -p $D
pack() { tar -czf $OUT/call-d.tgz -C /tmp d; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
P="python3 -m pytest -q -p no:cacheprovider"; S=measurements/scripts/tma_store_layer.py
timeout 200 $P -m gpu tests/test_fp8.py tests/test_fp8_decode.py tests/test_gluon_fp8.py -k "layer" \
  > $D/gpu-tests.log 2>&1; echo "gpu tests rc $?"; tail -2 $D/gpu-tests.log; pack
for spec in "Kimi-K2 4096 16384" "Qwen3-30B-A3B 1024 16384" "DeepSeek-V3 1024" "Kimi-K2 1024"; do
  set -- $spec; model=$1; shift
  OUT=$D/$model-$1 timeout 150 python3 $S --models $model --M "$@" 2>&1 | grep -v Warning | tee $D/layer-$model-$1.log
  pack
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
# (This call wrote these lines inline as $D/layer_once.py and ran that; the same lines are now
# measurements/scripts/fp8_layer_once.py, which this record calls instead.)
timeout 180 $NCU --clock-control none --set full -k regex:"gluon_fp8_moe_kernel" -c 2 -o $D/ncu-qwen3-M16384 \
  python3 measurements/scripts/fp8_layer_once.py --model Qwen3-30B-A3B --M 16384 > $D/ncu.log 2>&1; echo "ncu rc $?"; tail -3 $D/ncu.log
for r in $D/*.ncu-rep; do $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1
  $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; rm -f $r; done
python3 measurements/scripts/ncu_summary.py $D/ncu-qwen3-M16384-raw.csv > $D/ncu-summary.csv; cut -c1-250 $D/ncu-summary.csv
pack
