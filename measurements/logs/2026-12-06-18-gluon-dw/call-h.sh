# Run on the warm H100 after call g (whose sweeps ran out of memory): the DeepSeek-V3 T = 16384 dW2
# sweep alone. It ran out of memory again (the sweep still held the weights); the fix is in call j.
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; mkdir -p $OUT/h
timeout 150 python3 measurements/scripts/h200_backward.py --no-times --no-grads --tile-case DeepSeek-V3:16384 --tile-gemms dw2 --max-minutes 2.0 --out $OUT/h > $OUT/h/sweep.log 2>&1
