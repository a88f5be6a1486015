# Twenty-ninth session, call r (run inline on the warm machine): the forms of call k again, and the
# smaller M, a second process each (Kimi-K2, DeepSeek-V3, Qwen3-30B-A3B).
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/r; mkdir -p $D; S=measurements/scripts/half_skip_layer.py
for c in "Kimi-K2 1024 4096 8192" "DeepSeek-V3 1024 4096" "Qwen3-30B-A3B 1024 2048"; do set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -); OUT=$D/$n timeout 160 python3 $S --models $m --M $@ 2>&1 | grep -v Warning | tee $D/$n.log; tar -czf $OUT/call-r.tgz -C /tmp r; done
