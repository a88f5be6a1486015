"""FP8 experts as checkpoints store them (DeepSeek-V3 style), stacked into what the kernels take.

A block-FP8 checkpoint keeps each expert of an MoE layer as three projections, each an e4m3
``weight`` and an fp32 ``weight_scale_inv`` with one factor per 128 x 128 block (the dequantised
weight is ``weight * weight_scale_inv``, block by block; "inv" because it undoes the division by
the scale that quantised it)::

    {prefix}experts.{e}.gate_proj.weight            [I, K]  float8_e4m3fn
    {prefix}experts.{e}.gate_proj.weight_scale_inv  [ceil(I/128), ceil(K/128)]  float32
    {prefix}experts.{e}.up_proj.weight              [I, K]
    {prefix}experts.{e}.down_proj.weight            [K, I]   (and their scales)

where ``prefix`` is one layer's, e.g. ``"model.layers.3.mlp."``. :func:`stack_experts` turns that
into ``w13 [E, 2I, K]`` (gate rows then up rows), ``w2 [E, K, I]`` and their stacked scales, the
inputs of :func:`moe_tutorial.kernels.fp8_layer.fp8_moe_layer`; :func:`load_experts` reads
them from ``.safetensors`` files without loading the rest of the model, and checks them against
the model's index (``model.safetensors.index.json``) where there is one, so that a missing shard is
named rather than read as fewer experts.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .checks import check_fp8_pair, fail
from .fp8_format import BLOCK

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

#: The file a sharded checkpoint lists its tensors in: ``{"weight_map": {name: shard file}}``.
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class Fp8Experts:
    """One layer's experts in block FP8, stacked: ``w13 [E, 2I, K]``, ``w13_scale [E, 2 *
    ceil(I/128), ceil(K/128)]`` (gate blocks then up blocks), ``w2 [E, K, I]``, ``w2_scale [E,
    ceil(K/128), ceil(I/128)]``."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]


def expert_key(prefix: str, expert: int, projection: str, scale: bool = False) -> str:
    """The checkpoint name of one expert's weight (or, with ``scale``, its ``weight_scale_inv``)."""
    return f"{prefix}experts.{expert}.{projection}.{'weight_scale_inv' if scale else 'weight'}"


def expert_count(keys, prefix: str) -> int:
    """How many experts ``keys`` hold under ``prefix`` (their ids must run 0, 1, ..., E-1)."""
    pattern = re.compile(re.escape(prefix) + r"experts\.(\d+)\.")
    ids = {int(m.group(1)) for k in keys if (m := pattern.match(k))}
    if not ids:
        fail(KeyError, "state_dict", f"keys '{prefix}experts.<e>.<projection>.weight'", "none under that prefix")
    if ids != set(range(len(ids))):
        missing = sorted(set(range(max(ids) + 1)) - ids)
        fail(KeyError, "state_dict", f"experts 0 to {max(ids)} under '{prefix}'", f"none for expert(s) {missing[:5]}")
    return len(ids)


def stack_experts(state_dict, prefix: str = "", *, num_experts: int | None = None) -> Fp8Experts:
    """Stack one layer's per-expert e4m3 projections and their block scales.

    Args:
        state_dict: a mapping from checkpoint names to tensors (a ``dict``, or what
            ``safetensors.torch.load_file`` returns).
        prefix: the layer's prefix, e.g. ``"model.layers.3.mlp."``.
        num_experts: how many experts the layer has, if known (the model config's
            ``n_routed_experts``): fewer found under ``prefix`` is a KeyError, not a smaller layer.

    Returns:
        :class:`Fp8Experts`. Every weight must come with its ``weight_scale_inv`` (a KeyError names the
        first that does not), be e4m3 with fp32 scales of one per 128 x 128 block, finite and none
        negative (ValueError/TypeError otherwise, naming the block), and the experts must agree in shape.
    """
    E = expert_count(state_dict.keys(), prefix)
    if num_experts is not None and E != num_experts:
        fail(KeyError, "state_dict", f"{num_experts} experts under '{prefix}' (num_experts)", f"experts 0 to {E - 1}")
    parts = {p: ([], []) for p in PROJECTIONS}
    for e in range(E):
        for proj in PROJECTIONS:
            wkey, skey = expert_key(prefix, e, proj), expert_key(prefix, e, proj, scale=True)
            if wkey not in state_dict:
                fail(KeyError, "state_dict", f"'{wkey}'", "no such key")
            if skey not in state_dict:
                fail(KeyError, "state_dict", f"'{skey}' beside '{wkey}' (FP8 weights need their block scales)",
                      "no such key")
            w, s = state_dict[wkey], state_dict[skey]
            check_fp8_pair(wkey, w, skey, s, rows=BLOCK)
            parts[proj][0].append(w)
            parts[proj][1].append(s)
    (gate, gate_s), (up, up_s), (down, down_s) = (parts[p] for p in PROJECTIONS)
    shapes = {(p, tuple(t.shape)) for p in PROJECTIONS for t in parts[p][0]}
    if len(shapes) != 3:
        fail(ValueError, "state_dict", "experts of one shape per projection", f"shapes {sorted(shapes)}")
    inter, hidden = gate[0].shape
    if tuple(up[0].shape) != (inter, hidden) or tuple(down[0].shape) != (hidden, inter):
        fail(ValueError, "state_dict", f"up_proj {(inter, hidden)} and down_proj {(hidden, inter)} beside "
              f"gate_proj {(inter, hidden)}", f"up_proj {tuple(up[0].shape)}, down_proj {tuple(down[0].shape)}")
    return Fp8Experts(
        w13=torch.cat([torch.stack(gate), torch.stack(up)], dim=1),
        w13_scale=torch.cat([torch.stack(gate_s), torch.stack(up_s)], dim=1),
        w2=torch.stack(down), w2_scale=torch.stack(down_s))


def expert_state_dict(experts: Fp8Experts, prefix: str = "") -> dict[str, torch.Tensor]:
    """The inverse of :func:`stack_experts`: per-expert checkpoint tensors (contiguous copies)."""
    inter = experts.w13.shape[1] // 2
    rows = experts.w13_scale.shape[1] // 2
    out = {}
    for e in range(experts.num_experts):
        for proj, w, s in (("gate_proj", experts.w13[e, :inter], experts.w13_scale[e, :rows]),
                           ("up_proj", experts.w13[e, inter:], experts.w13_scale[e, rows:]),
                           ("down_proj", experts.w2[e], experts.w2_scale[e])):
            out[expert_key(prefix, e, proj)] = w.contiguous()
            out[expert_key(prefix, e, proj, scale=True)] = s.contiguous()
    return out


def load_experts(paths, prefix: str = "", device: str | torch.device = "cpu", *,
                 num_experts: int | None = None) -> Fp8Experts:
    """Read one layer's FP8 experts from ``.safetensors`` files and stack them.

    ``paths``: one file, a list of files, or a folder of ``*.safetensors`` shards (a model is
    usually split). Only the tensors under ``prefix`` are read. Where the files' folder holds the
    model's index (:data:`INDEX_FILE`), every tensor of the layer it lists must be read: a shard that
    is missing, or not among ``paths``, is a FileNotFoundError naming it and the tensors it holds, and
    a shard without a tensor the index puts there a KeyError. A file that is empty, truncated or not
    a safetensors file is a ValueError naming it. ``num_experts``: as for :func:`stack_experts`.
    """
    from safetensors import safe_open

    if isinstance(paths, (str, Path)):
        p = Path(paths)
        paths = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    paths = [Path(p) for p in paths]
    if not paths:
        fail(FileNotFoundError, "paths", "at least one .safetensors file", "none")
    wanted = _indexed(paths, prefix + "experts.")
    if wanted:
        given = {p.resolve() for p in paths}
        absent = sorted({f for f in wanted.values() if f.resolve() not in given or not f.exists()})
        if absent:
            f = absent[0]
            names = sorted(k for k, v in wanted.items() if v == f)
            why = "no such file" if not f.exists() else "not among the files given"
            fail(FileNotFoundError, "paths", f"every shard {INDEX_FILE} lists for '{prefix}experts.'",
                 f"{f} missing ({why}; it holds {len(names)} of them, e.g. {names[0]})")
        paths = sorted({f for f in wanted.values()})          # the shards that hold the layer
    tensors = {}
    for path in paths:
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                for key in f.keys():
                    if key.startswith(prefix + "experts."):
                        tensors[key] = f.get_tensor(key)
        except OSError as e:
            fail(FileNotFoundError, "paths", "readable .safetensors files", f"{path} ({e.strerror or e})")
        except Exception as e:  # noqa: BLE001  (safetensors' own error names no file)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            fail(ValueError, "paths", ".safetensors files", f"{path}, which is empty, truncated or of another "
                 f"format ({first})")
        for key in (k for k, v in wanted.items() if v == path and k not in tensors):
            fail(KeyError, "paths", f"'{key}' in {path}, as {INDEX_FILE} says", "no such tensor in that file")
    return stack_experts(tensors, prefix, num_experts=num_experts)


def _indexed(paths: list[Path], start: str) -> dict[str, Path]:
    """``{tensor name: shard path}`` of the tensors named ``start...`` in the index beside the files, or {}."""
    folders = {p.parent for p in paths}
    index = next((f / INDEX_FILE for f in sorted(folders) if (f / INDEX_FILE).exists()), None)
    if index is None:
        return {}
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        fail(ValueError, "paths", f"{index} as JSON with a 'weight_map'", f"{type(e).__name__}: {e}")
    return {k: index.parent / v for k, v in weight_map.items() if k.startswith(start)}
