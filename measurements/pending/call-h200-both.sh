# Pending (H200 only): call-h200-layer.sh (the FP8 layer form by form on the H200) and call-h200.sh (vLLM
# 0.34.0 beside ours) in one call, each packed as it ends. Carry .whl and .anchors.
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: not run"; exit 0; }
bash measurements/pending/call-h200.sh
bash measurements/pending/call-h200-layer.sh
