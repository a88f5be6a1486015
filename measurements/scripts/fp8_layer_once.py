"""Part 7's FP8 layer, called twice on one model and M: the target for a profiler on the GPU.

    ncu --set full -k regex:"gluon_fp8_moe_kernel" -c 2 -o REPORT \\
        python3 measurements/scripts/fp8_layer_once.py --model Qwen3-30B-A3B --M 16384

Random e4m3 experts with unit block scales (``h200_fp8_decode_profile.fp8_weights``), random routing;
prints the dispatcher's ``(gate/up, down)`` configurations, then runs the layer twice (the first call
compiles; a profiler with ``-c 2`` sees the first call's two GEMMs).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import moe_tutorial as mt  # noqa: I001  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, layer_configs
from moe_tutorial.shapes import get_shape

import torch


def decode_profile_script():
    """``h200_fp8_decode_profile.py`` beside this script, imported as a module (for its weights)."""
    path = Path(__file__).with_name("h200_fp8_decode_profile.py")
    spec = importlib.util.spec_from_file_location("h200_fp8_decode_profile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen3-30B-A3B")
    ap.add_argument("--M", type=int, default=16384)
    ap.add_argument("--calls", type=int, default=2)
    args = ap.parse_args(argv)
    if not runtime.ON_GPU:
        print("needs a CUDA GPU (Part 7's layer at real shapes)")
        return 2
    s = get_shape(args.model)
    w13, s13, w2, s2 = decode_profile_script().fp8_weights(s, runtime.DEVICE)
    g = torch.Generator(device=runtime.DEVICE).manual_seed(0)
    x = torch.randn(args.M, s.hidden, device=runtime.DEVICE, generator=g).bfloat16()
    tw, ids = mt.route(torch.randn(args.M, s.num_experts, device=runtime.DEVICE, generator=g), s.topk)
    print(layer_configs(args.M, s.num_experts, s.intermediate, s.hidden, s.topk))
    for _ in range(args.calls):
        fp8_moe_layer(x, w13, s13, w2, s2, tw, ids)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
