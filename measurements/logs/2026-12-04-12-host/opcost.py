"""Host cost of single torch ops on CUDA (no sync inside the loop): what the alignment's ops cost."""
import time

import torch

ids = torch.randint(0, 128, (32768,), device="cuda", dtype=torch.int32)
ids64 = ids.long()
ops = {
    "clamp(0, E-1) int32": lambda: ids.clamp(0, 127),
    "clamp(0, E-1) int64": lambda: ids64.clamp(0, 127),
    "clamp_max int32": lambda: ids.clamp_max(127),
    "remainder(E) int32": lambda: ids.remainder(128),
    "add int32": lambda: ids + 1,
    "floor_divide int32": lambda: ids // 8,
    "long()": lambda: ids.long(),
    "cumsum int64": lambda: torch.cumsum(ids64, 0),
    "argsort stable": lambda: torch.argsort(ids64, stable=True),
}
for name, fn in ops.items():
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    print(f"{name:24s} {host:7.1f} us host per call")
