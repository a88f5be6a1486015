# Call c's gate found an H100, not an H200 (call c not run); with 218 s of device time left on that
# warm machine, Mixtral-8x7B's first call side by side and one by one (its first processes after
# the gate's nvidia-smi), printed only.
export PYTHONPATH=$PWD; for v in "" --serial; do timeout 50 python3 measurements/scripts/first_call_profile.py --model Mixtral-8x7B --tokens 4096 --out /tmp/d $v 2>&1 | grep -E "first call|rror"; done
