# Pending (never ran: no H200 came): call b on an H200, where the docs' first-call numbers come from
# (compiled one by one there): the first calls side by side and one by one into first_call.csv, then
# notebook 08 under nbval-lax, all in call b's tarball. On any other GPU it stops at the gate. Carry .whl.
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: call c not run"; exit 0; }
bash measurements/logs/2026-12-06-21-precompile/call-b.sh
