# The next GPU call: the Part 8 GPU tests on the final code of the twelfth session. Its last call
# (logs/2026-12-04-12-host/call-h.sh) ran 32 of the 34 GPU tests of test_align.py and
# test_backward_kernel.py before a 110 s timeout; the two after them (gradients near 1e-5, a bad
# id refused after the forward) ran on the clamping alignment only (call-f.sh, 9 passed).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_align.py tests/test_backward_kernel.py -rA 2>&1 | tail -40
