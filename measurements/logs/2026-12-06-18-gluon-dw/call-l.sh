# Run on the warm H200 after call k: the Gluon dW kernel's GPU tests there, and notebook 08 under nbval-lax.
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; mkdir -p $OUT/l
timeout 80 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -k gluon -rA > $OUT/l/gpu-tests.log 2>&1
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 150 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/08_training.ipynb > $OUT/l/notebook-08-nbval.log 2>&1
