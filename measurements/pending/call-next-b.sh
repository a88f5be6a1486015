# Next session, second call (H200 only; carry .whl): Kimi-K2's FP8 layer form by form (call-h200-layer.sh),
# then call c (the first calls side by side and one by one, notebook 08 under nbval-lax).
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: not run"; exit 0; }
MODELS=Kimi-K2 bash measurements/pending/call-h200-layer.sh
bash measurements/pending/call-c.sh
