"""The experiment of call b: store_rows (moe_tutorial/kernels/gluon_kernel.py) with its C tile first moved
into a layout where each thread holds 8 consecutive columns of one row (gl.convert_layout, through shared
memory), so that a warp writes whole rows of 16-byte pieces instead of the MMA layout's 4-byte pairs.
Run from the repository root; it rewrites the file in place (a copy of the working tree on the GPU)."""
from pathlib import Path

p = Path("moe_tutorial/kernels/gluon_kernel.py")
s = p.read_text()
old = '''        offs_m = first_row + gl.arange(0, BLOCK_M, layout=rows_layout)
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=cols_layout)
        pair = gl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs
        if ROUTER_WEIGHTS:
            acc = acc * gl.load(router_w_ptr + pair, mask=row_ok, other=0.0)[:, None]
        if C_SORTED:
            c_row = offs_m.to(gl.int64)
        else:
            c_row = pair.to(gl.int64)
        ptrs = c_ptr + c_row[:, None] * stride_cm + offs_n[None, :]
        gl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))
'''
new = '''        if ROUTER_WEIGHTS:
            offs_w = first_row + gl.arange(0, BLOCK_M, layout=rows_layout)
            pair_w = gl.load(sorted_ids_ptr + offs_w)
            acc = acc * gl.load(router_w_ptr + pair_w, mask=pair_w < num_pairs, other=0.0)[:, None]
        out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [gl.num_warps(), 1], [1, 0])
        c = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), out_layout)
        offs_m = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
        pair = gl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs
        if C_SORTED:
            c_row = offs_m.to(gl.int64)
        else:
            c_row = pair.to(gl.int64)
        ptrs = c_ptr + c_row[:, None] * stride_cm + offs_n[None, :]
        gl.store(ptrs, c, mask=row_ok[:, None] & (offs_n[None, :] < N))
'''
assert s.count(old) == 1, "store_rows is not as this experiment was written against"
p.write_text(s.replace(old, new))

# The gated GEMM's quantising epilogue (moe_tutorial/kernels/gluon_fp8_kernel.py): the same for its e4m3
# tile, 16 consecutive columns a thread (one 16-byte piece), after the scales are taken in the MMA layout.
p = Path("moe_tutorial/kernels/gluon_fp8_kernel.py")
s = p.read_text()
old = '''        rows64 = offs_m.to(gl.int64)
        gl.store(c_ptr + rows64[:, None] * stride_cm + offs_n[None, :], q.to(c_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])
        gl.store(cs_ptr + pid_n * stride_csn + rows64, scale, mask=row_ok)
'''
new = '''        rows64 = offs_m.to(gl.int64)
        gl.store(cs_ptr + pid_n * stride_csn + rows64, scale, mask=row_ok)
        out_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [gl.num_warps(), 1], [1, 0])
        qc = gl.convert_layout(q.to(c_ptr.dtype.element_ty), out_layout)
        om = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
        on = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
        ok = (gl.load(sorted_ids_ptr + om) < num_pairs)[:, None] & (on < N)[None, :]
        gl.store(c_ptr + om.to(gl.int64)[:, None] * stride_cm + on[None, :], qc, mask=ok)
'''
assert s.count(old) == 1, "store_quantised is not as this experiment was written against"
p.write_text(s.replace(old, new))
