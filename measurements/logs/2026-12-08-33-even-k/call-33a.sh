# Thirty-third session, first call (any Hopper; carry .whl and .anchors): call v (the dispatch and notebook 07
# on a GPU, from call-vk.sh), then on an H200 the vLLM anchor (call-h200.sh), on an H100 call k (even-K).
# (When it ran, call-vk.sh and call-k.sh were in measurements/pending/; they are beside it now.)
set -u
sed -n '/^set -u/,/^unset PYTHONPATH/p' measurements/pending/call-vk.sh > /tmp/call-v.sh
bash /tmp/call-v.sh
unset PYTHONPATH
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash measurements/pending/call-h200.sh
else
  bash measurements/pending/call-k.sh
fi
