"""Compile Triton kernels for sm_90 without a GPU: catches errors the interpreter lets through.

Run as a script in a process without TRITON_INTERPRET:
`python tests/ops/triton/compile_sm90.py GROUP`, GROUP one of recurrent, hgrn1, small-heads, fused-chunk,
fused-chunk-default, fused-chunk-grid, chunk-parallel, chunk-parallel-default, glue. Triton
versions differ in what they reject (3.6, on the GPU machines, refuses a `return` inside a branch on a runtime
value; 3.9 takes it): to check against another version, `pip install --target /tmp/t36 --no-deps
triton==3.6.0` and put /tmp/t36 first on PYTHONPATH.
Exits non-zero and prints the compiler error if any variant fails. The fused-chunk, fused-chunk-grid,
chunk-parallel and glue groups also print registers and spills (bundled `ptxas -v` on the PTX) and compile times.
"""

import itertools
import os
import re
import subprocess
import sys
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hgrn2.ops.triton.config import ChunkParallelConfig

# the forward output kernel's default launch (K-block, warps), which the default group must compile
FWD_O_DEFAULT = (ChunkParallelConfig().block_k, ChunkParallelConfig().num_warps)


def compile_variant(kernel, types: dict, consts: dict, num_warps: int = 4, **options):
    """Arguments absent from `types` and `consts` are None pointers (constexpr None). Pointers and integers are
    marked 16-divisible, as Triton's launcher specialises them for aligned tensors and lengths that are multiples
    of 16 (without it the compiler cannot vectorise a load, and registers and spills come out far too high)."""
    names = kernel.arg_names
    consts = {**{n: None for n in names if n not in types and n not in consts}, **consts}
    signature = {n: "constexpr" if n in consts else types[n] for n in names}
    constexprs = {(names.index(n),): v for n, v in consts.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in signature.items() if t[0] in "*i"}
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps, **options})


def recurrent_variants():
    from hgrn2.ops.triton.recurrent import _hgrn2_recurrent_kernel as k
    for dt in ("bf16", "fp32"):
        for full in (True, False):
            types = dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", y=f"*{dt}", scale="fp32", T="i32")
            if full:
                types.update(lb="*fp32", h0="*fp32", ht="*fp32")
            else:
                types.update(cu_seqlens="*i32")
            consts = dict(H=16, K=128, V=128, BK=128, BV=32, O_ACT=1 if full else 2, I_ACT=0 if full else 1,
                          HAS_LB=full, HAS_H0=full, STORE_HT=full, IS_VARLEN=not full, PDL=full)
            yield f"recurrent {dt} full={full}", k, types, consts


def hgrn1_variants():
    from hgrn2.ops.triton import hgrn1 as m
    for cplx in (1, 2):
        xdt = "fp32" if cplx == 2 else "bf16"
        common = dict(D=512, BD=128, CPLX=cplx, HAS_LB=True)
        theta = {"theta": "*fp32"} if cplx == 2 else {}
        base = dict(x=f"*{xdt}", g="*bf16", lb="*fp32", T="i32", CHUNK="i32", NC="i32", **theta)
        yield (f"fwd pass 1 cplx={cplx}", m._fwd_kernel, {**base, "end": "*fp32", "dec": "*fp32"},
               dict(common, HAS_HIN=False, STORE_OUT=False, STORE_DEC=True, IS_VARLEN=False))
        yield (f"fwd pass 3 cplx={cplx}", m._fwd_kernel,
               {**base, "h_in": "*fp32", "out": f"*{xdt}", "end": "*fp32", "cu_seqlens": "*i64"},
               dict(common, HAS_HIN=True, STORE_OUT=True, STORE_DEC=False, IS_VARLEN=True))
        for rev in (False, True):
            yield (f"carry cplx={cplx} reverse={rev}", m._carry_kernel,
                   dict(end="*fp32", dec="*fp32", init="*fp32", carry="*fp32", final="*fp32", NC="i32"),
                   dict(D=512, BD=128, CPLX=cplx, HAS_INIT=True, REVERSE=rev))
        yield (f"bwd pass 1 cplx={cplx}", m._bwd_kernel,
               {**base, "dout": f"*{xdt}", "end": "*fp32", "dec": "*fp32"},
               dict(common, HAS_H0=False, HAS_DIN=False, LOCAL=True, IS_VARLEN=False))
        grads = dict(h0="*fp32", out=f"*{xdt}", d_in="*fp32", dout=f"*{xdt}", dx=f"*{xdt}", dg="*bf16",
                     dlb="*fp32", end="*fp32", cu_seqlens="*i64", **({"dth": "*fp32"} if cplx == 2 else {}))
        yield (f"bwd pass 3 cplx={cplx}", m._bwd_kernel, {**base, **grads},
               dict(common, HAS_H0=True, HAS_DIN=True, LOCAL=False, IS_VARLEN=True))



def small_heads_variants():
    from hgrn2.ops.triton import small_heads as m
    ints = dict(B="i32", T="i32", H="i32", NC="i32", CHUNK="i32", scale="fp32")
    base = dict(o="*bf16", g="*bf16", x="*bf16", lb="*fp32", **ints)
    for (V, K, BH), act in itertools.product([(4, 4, 16), (1, 8, 1), (3, 5, 2)], (0, 1, 2)):
        shape = dict(V=V, K=K, VP=m.next_pow2(V), KP=m.next_pow2(K), BH=BH, O_ACT=act, HAS_LB=True, REVERSE=0)
        warps = max(1, min(4, BH * shape["VP"] * shape["KP"] // 64))
        tag = f"V={V} K={K} BH={BH} act={act}"
        yield (f"fwd pass 1 {tag}", m._fwd_kernel, {**base, "end": "*fp32", "dec": "*fp32"},
               dict(shape, HAS_HIN=False, LOCAL=True, STORE_H=False), warps)
        yield (f"fwd pass 3 {tag}", m._fwd_kernel, {**base, "y": "*fp32", "hs": "*fp32", "h_in": "*fp32"},
               dict(shape, HAS_HIN=True, LOCAL=False, STORE_H=True), warps)
        yield (f"carry {tag}", m._carry_kernel, dict(end="*fp32", dec="*fp32", carry="*fp32", B="i32", H="i32",
               NC="i32"), dict(V=V, K=K, VP=shape["VP"], KP=shape["KP"], BH=BH, BACKWARD=True), warps)
        yield (f"bwd pass 1 {tag}", m._bwd_kernel, {**base, "dy": "*bf16", "end": "*fp32", "dec": "*fp32"},
               dict(shape, HAS_DIN=False, LOCAL=True), warps)
        grads = dict(hs="*fp32", dy="*bf16", do="*fp32", dg="*fp32", dx="*fp32", dlb="*fp32", d_in="*fp32")
        yield (f"bwd pass 3 {tag}", m._bwd_kernel, {**base, **grads}, dict(shape, HAS_DIN=True, LOCAL=False), warps)

def fused_chunk_variants():
    """The fused-chunk kernels (fused_chunk_fwd.py, fused_chunk_bwd.py): bf16 at K = V = 128 and 64 with the default
    block sizes, fp32 (ieee dots) and fp16 (fp32 operands, tf32), varlen and the optional inputs once; the reverse
    walk at bf16, K = V = 128."""
    import triton.language as tl

    from hgrn2.ops.triton import fused_chunk as c
    from hgrn2.ops.triton import fused_chunk_bwd as b
    from hgrn2.ops.triton import fused_chunk_fwd as f
    from hgrn2.ops.triton.config import FusedChunkConfig

    cfg = FusedChunkConfig()
    for dt, DT, prec, sprec, KV, BV, warps in (("bf16", tl.bfloat16, "tf32", "tf32x3", 128, 128, 8),
                                                ("bf16", tl.bfloat16, "tf32", "tf32x3", 128, 64, 8),  # V split
                                                ("bf16", tl.bfloat16, "tf32", "tf32x3", 64, 64, 4),
                                                ("fp32", tl.float32, "ieee", "ieee", 128, 64, 8),
                                                ("fp16", tl.float32, "tf32x3", "tf32x3", 128, 64, 8)):
        reverses = (False, True) if dt == "bf16" and KV == 128 else (False,)
        for full, rev in itertools.product((True, False), reverses):
            # the backward's steps by its form (fused_chunk.bwd_form): the fused sweep's, the split sweep's below
            common = dict(H=16, K=KV, V=KV, BT=c.bwd_form(1, DT, cfg)[1], BK=KV, BV=BV, HAS_LB=full, VARLEN=not full,
                          MAX_SPREAD=cfg.max_spread, DT=DT, PREC=prec, REVERSE=rev)
            opt = dict(lb="*fp32", h0="*fp32") if full else dict(cu_seqlens="*i32")
            sfx = f"{dt} K=V={KV} BV={BV} w={warps} full={full}" + (" reverse" if rev else "")
            yield (f"fwd {sfx}", f.fused_chunk_fwd_kernel,
                   dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", y=f"*{dt}", ht="*fp32", scale="fp32", T="i32", **opt),
                   dict(common, BT=cfg.block_t_fwd, O_ACT=1, I_ACT=0, HAS_H0=full, STORE_HT=True), warps)
            yield (f"bwd_dq {sfx}", b.fused_chunk_bwd_dq_kernel,
                   dict(g=f"*{dt}", i=f"*{dt}", dy=f"*{dt}", dys="*fp32", ht="*fp32", T="i32", NTOK="i32", **opt),
                   dict(common, I_ACT=1, HAS_H0=full, STORE_HT=full, SPREC=sprec), warps)
            pdt = dt if BV == KV else "fp32"
            grads = dict(dh0="*fp32", dht="*fp32") if full else {}
            yield (f"bwd {sfx}", b.fused_chunk_bwd_kernel,
                   dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", dy=f"*{dt}", dys="*fp32", ht="*fp32",
                        do=f"*{pdt}", dg=f"*{pdt}", di=f"*{dt}", scale="fp32", T="i32", NTOK="i32", **opt, **grads),
                   dict(common, O_ACT=2, I_ACT=1, HAS_DHT=full, STORE_DH0=full, SPREC=sprec), warps)
            split_bt = c.bwd_form(2, tl.bfloat16, cfg)[1]  # the split form's steps where V is split
            split = dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", dy=f"*{dt}", dys="*fp32", vds="*fp32", dvs="*fp32",
                         carry="*fp32", scale="fp32", T="i32", NTOK="i32", NBT="i32",
                         **{k: v for k, v in opt.items() if k != "h0"})
            yield (f"bwd_state {sfx}", b.fused_chunk_bwd_state_kernel,
                   dict(split, ht="*fp32", **grads),
                   dict(common, BT=split_bt, O_ACT=2, I_ACT=1, HAS_DHT=full, STORE_DH0=full, SPREC=sprec), warps)
            yield (f"bwd_diag {sfx}", b.fused_chunk_bwd_diag_kernel,
                   dict({k: v for k, v in split.items() if k not in ("NTOK", "NBT")}, do=f"*{dt}", dg=f"*{dt}",
                        di=f"*{dt}"),
                   dict(common, BT=split_bt, BV=KV, O_ACT=2, I_ACT=1), warps)


def chunk_parallel_variants():
    """Every chunk-parallel kernel, bf16 (K = V = 64, 128, 256; BT = 64) and fp32 (K = V = 128; BT = 32, ieee
    dots), typical flags: the sequential kernels and the parallel ones at the (BK, BV, warps) listed, the
    parallel ones in their three launches (the chunk tier, the halves tier, the fallback)."""
    for name, kernel, types, consts, *w in _chunk_parallel_variants():
        types = {**types, "bb": "*fp32", "fb": "*i32", "NC": "i32"}
        if "TIER" not in kernel.arg_names:
            yield (name, kernel, types, consts, *w)
            continue
        for tier, sfx in enumerate(("", " halves", " fallback")):
            yield (name + sfx, kernel, types, {**consts, "TIER": tier}, *w)


def _chunk_parallel_variants():
    import triton.language as tl

    from hgrn2.ops.triton import chunk_parallel_bwd as b
    from hgrn2.ops.triton import chunk_parallel_fwd as f
    # (BK, BV, warps): the defaults first, then the alternatives of benchmarks/gpu_chunk_parallel_check.py and the
    # blocks that ChunkParallelConfig.seq_split_below shrinks to for few (sequence, head) pairs
    seq_cfgs = {64: [(64, 64, 8), (64, 64, 4), (32, 32, 4)],
                128: [(64, 128, 8), (128, 128, 8), (64, 64, 4), (32, 128, 4), (32, 128, 8), (32, 64, 4), (32, 32, 4)],
                256: [(64, 128, 8)]}
    par_cfgs = {64: [(64, 64, 8), (32, 64, 8), (32, 64, 4)],
                128: [(32, 128, 4), (32, 128, 8), (64, 128, 8), (16, 128, 8), (64, 64, 8), (32, 64, 4), (64, 128, 4)],
                256: [(32, 128, 4), (64, 128, 8), (32, 128, 8)]}
    for dt, prec in (("bf16", "tf32"), ("fp32", os.environ.get("FP32_PREC", "ieee"))):
        DT = tl.bfloat16 if dt == "bf16" else tl.float32
        cfg = ChunkParallelConfig()
        walk = cfg.walk_max_spread if dt == "bf16" else cfg.chunk_max_spread
        for KV in ((64, 128, 256) if dt == "bf16" else (128,)):
            common = dict(H=16, K=KV, V=KV, BT=64 if dt == "bf16" else 32, DT=DT, PREC=prec)
            for BK, BV, warps in seq_cfgs[KV] if dt == "bf16" else [(32, 64, 4)]:
                sfx = f"{dt} K=V={KV} BK={BK} BV={BV} w={warps}"
                yield (f"fwd_h {sfx}", f.chunk_parallel_fwd_h_kernel,
                       dict(g=f"*{dt}", i=f"*{dt}", lb="*fp32", h0="*fp32", h=f"*{dt}", ht="*fp32", bb="*fp32", T="i32",
                            NT="i32"),
                       dict(common, BK=BK, BV=BV, NV=KV // BV, I_ACT=0, HAS_LB=True, HAS_H0=True, STORE_HT=True,
                            VARLEN=False, WALK_SPREAD=walk), warps)
                yield (f"bwd_dh {sfx}", b.chunk_parallel_bwd_dh_kernel,
                       dict(o=f"*{dt}", dy=f"*{dt}", dht="*fp32", dh=f"*{dt}", dh0="*fp32", scale="fp32", T="i32",
                            NT="i32"),
                       dict(common, BK=BK, BV=BV, NV=KV // BV, O_ACT=1, HAS_DHT=True, STORE_DH0=True, VARLEN=False),
                       warps)
            for BK, BV, warps in par_cfgs[KV] if dt == "bf16" else [(32, 32, 4)]:
                sfx = f"{dt} K=V={KV} BK={BK} BV={BV} w={warps}"
                yield (f"fwd_o {sfx}", f.chunk_parallel_fwd_o_kernel,
                       dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", lb="*fp32", h=f"*{dt}", y=f"*{dt}", scale="fp32",
                            T="i32", NT="i32"),
                       dict(common, BK=BK, BV=BV, O_ACT=1, I_ACT=0, HAS_LB=True, VARLEN=False, MAX_SPREAD=60.0,
                            STORE_A=False),
                       warps)
                pdt = dt if BV == KV else "fp32"
                yield (f"bwd {sfx}", b.chunk_parallel_bwd_kernel,
                       dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", lb="*fp32", h=f"*{dt}", dh=f"*{dt}",
                            dy=f"*{dt}", do=f"*{pdt}", dg=f"*{pdt}", di=f"*{dt}", dlb="*fp32", scale="fp32",
                            T="i32", NT="i32", NTOK="i32"),
                       dict(common, BK=BK, BV=BV, O_ACT=1, I_ACT=0, HAS_LB=True, VARLEN=False, MAX_SPREAD=60.0,
                            DV=True, DQK=True, LOAD_A=False), warps)
        # the split backward (bwd_split): dv alone (also from the forward's A: save_a), dq/dk/dg alone
        if dt == "bf16":
            common = dict(H=16, K=128, V=128, BT=64, DT=DT, PREC=prec)
            for BK in (64, 32):
                for flags in (dict(DV=True, DQK=False, LOAD_A=False), dict(DV=True, DQK=False, LOAD_A=True),
                              dict(DV=False, DQK=True, LOAD_A=False)):
                    part = "dqk" if flags["DQK"] else "dv from A" if flags["LOAD_A"] else "dv"
                    yield (f"bwd split {part} bf16 K=V=128 BK={BK} BV=128 w=8", b.chunk_parallel_bwd_kernel,
                           dict(o="*bf16", g="*bf16", i="*bf16", lb="*fp32", h="*bf16", a_in="*bf16", dh="*bf16",
                                dy="*bf16", do="*bf16", dg="*bf16", di="*bf16", dlb="*fp32", scale="fp32", T="i32",
                                NT="i32", NTOK="i32"),
                           dict(common, BK=BK, BV=128, O_ACT=1, I_ACT=0, HAS_LB=True, VARLEN=False,
                                MAX_SPREAD=60.0, **flags), 8)
        # the default backward (save_a): one fused launch that reads the forward's A, in both dot dtypes
        BT_A, BK_A, BV_A, w_A = (64, 32, 128, 8) if dt == "bf16" else (32, 32, 32, 4)
        yield (f"bwd fused from A {dt} K=V=128 BK={BK_A} BV={BV_A} w={w_A}", b.chunk_parallel_bwd_kernel,
               dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", lb="*fp32", h=f"*{dt}", a_in=f"*{dt}", dh=f"*{dt}",
                    dy=f"*{dt}", do="*fp32", dg="*fp32", di=f"*{dt}", dlb="*fp32", scale="fp32", T="i32", NT="i32",
                    NTOK="i32"),
               dict(H=16, K=128, V=128, BT=BT_A, DT=DT, PREC=prec, BK=BK_A, BV=BV_A, O_ACT=1, I_ACT=0, HAS_LB=True,
                    VARLEN=False, MAX_SPREAD=60.0, DV=True, DQK=True, LOAD_A=True), w_A)
        if dt == "fp32":
            yield ("fwd_o storing A fp32 K=V=128 BK=32 BV=32 w=4", f.chunk_parallel_fwd_o_kernel,
                   dict(o="*fp32", g="*fp32", i="*fp32", lb="*fp32", h="*fp32", y="*fp32", a_out="*fp32",
                        scale="fp32", T="i32", NT="i32"),
                   dict(H=16, K=128, V=128, BT=32, DT=DT, PREC=prec, BK=32, BV=32, O_ACT=1, I_ACT=0, HAS_LB=True,
                        VARLEN=False, MAX_SPREAD=60.0, STORE_A=True), 4)
        if dt == "bf16":  # the default launch (ChunkParallelConfig's block_k and num_warps) and BK 64 at 8 warps
            for BK, warps in dict.fromkeys([FWD_O_DEFAULT, (64, 8)]):
                yield (f"fwd_o storing A bf16 K=V=128 BK={BK} BV=128 w={warps}", f.chunk_parallel_fwd_o_kernel,
                       dict(o="*bf16", g="*bf16", i="*bf16", lb="*fp32", h="*bf16", y="*bf16", a_out="*bf16",
                            scale="fp32", T="i32", NT="i32"),
                       dict(common, BK=BK, BV=128, O_ACT=1, I_ACT=0, HAS_LB=True, VARLEN=False, MAX_SPREAD=60.0,
                            STORE_A=True), warps)
        # varlen and the other flags once per dtype
        common = dict(H=16, K=128, V=128, BT=64 if dt == "bf16" else 32, DT=DT, PREC=prec)
        for varlen in (False, True):
            yield (f"decay {dt} varlen={varlen}", f.chunk_parallel_decay_kernel,
                   dict(g=f"*{dt}", lb="*fp32", fz="*i32", T="i32", NT="i32", **({"chunks": "*i32"} if varlen else {})),
                   dict(H=16, K=128, BT=common["BT"], BK=ChunkParallelConfig().block_k_decay, HAS_LB=not varlen,
                        VARLEN=varlen, CHUNK_SPREAD=120.0, HALF_SPREAD=120.0, FLAG_SMALL=not varlen), 4)
        # dβ at small gates, both forms at the default blocks (K-blocks of 16; all of V in sub-blocks of 32) and the
        # pair form over all of K = 128 (block_k_pairs None), fp16 inputs (fp32 dot operands, bf16's SPREC) beside
        # fp32's
        small_cfg = ChunkParallelConfig()
        for sdt in (dt, "fp16") if dt == "fp32" else (dt,):
            hdt = "fp32" if sdt == "fp16" else sdt  # the stored states' dtype
            for form, bk in ((0, small_cfg.block_k_pairs), (0, 128), (1, small_cfg.block_k_small)):
                yield (f"bwd small gates {sdt} form {form} K=V=128 BK={bk} BVS=32 w=4",
                       b.chunk_parallel_bwd_small_kernel,
                       dict(o=f"*{sdt}", g=f"*{sdt}", i=f"*{sdt}", lb="*fp32", h=f"*{hdt}", dh=f"*{hdt}",
                            dy=f"*{sdt}", dlb="*fp32", fz="*i32", form="*i8", scale="fp32", T="i32", NT="i32",
                            NC="i32", RS="i32"),
                       dict(H=16, K=128, V=128, BT=common["BT"], BK=bk, BVS=32, O_ACT=1, I_ACT=0, VARLEN=False,
                            SPREC=prec if sdt == "fp32" else "tf32x3", FORM=form, NP=16, PAIRS_PER_CHANNEL=2), 4)
        yield (f"fwd_h varlen {dt}", f.chunk_parallel_fwd_h_kernel,
               dict(g=f"*{dt}", i=f"*{dt}", h=f"*{dt}", cu_seqlens="*i32", chunk_offsets="*i32", T="i32",
                    NT="i32"),
               dict(common, BK=64, BV=64, NV=2, I_ACT=1, HAS_LB=False, HAS_H0=False, STORE_HT=False, VARLEN=True,
                    WALK_SPREAD=walk),
               8 if dt == "bf16" else 4)
        yield (f"fwd_o varlen {dt}", f.chunk_parallel_fwd_o_kernel,
               dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", h=f"*{dt}", y=f"*{dt}", chunks="*i32", scale="fp32",
                    T="i32", NT="i32"),
               dict(common, BK=32, BV=64, O_ACT=2, I_ACT=1, HAS_LB=False, VARLEN=True, MAX_SPREAD=60.0,
                    STORE_A=False), 8 if dt == "bf16" else 4)
        yield (f"bwd_dh varlen {dt}", b.chunk_parallel_bwd_dh_kernel,
               dict(o=f"*{dt}", dy=f"*{dt}", dh=f"*{dt}", cu_seqlens="*i32", chunk_offsets="*i32", scale="fp32",
                    T="i32", NT="i32"),
               dict(common, BK=64, BV=64, NV=2, O_ACT=0, HAS_DHT=False, STORE_DH0=False, VARLEN=True),
               8 if dt == "bf16" else 4)
        yield (f"bwd varlen {dt}", b.chunk_parallel_bwd_kernel,
               dict(o=f"*{dt}", g=f"*{dt}", i=f"*{dt}", h=f"*{dt}", dh=f"*{dt}", dy=f"*{dt}", do="*fp32",
                    dg="*fp32", di=f"*{dt}", chunks="*i32", scale="fp32", T="i32", NT="i32", NTOK="i32"),
               dict(common, BK=32, BV=64, O_ACT=2, I_ACT=1, HAS_LB=False, VARLEN=True, MAX_SPREAD=60.0,
                    DV=True, DQK=True, LOAD_A=False), 8 if dt == "bf16" else 4)


def fused_chunk_grid_variants():
    """The launch settings benchmarks/gpu_fused_chunk_sweep.py times (tokens per step, V-block, warps), bf16,
    K = V = 128, β, no states: registers and spills of the three sequential kernels, to read beside the timings."""
    import triton.language as tl

    from hgrn2.ops.triton import fused_chunk_bwd as b
    from hgrn2.ops.triton import fused_chunk_fwd as f
    for BT, BV, warps in itertools.product((16, 32), (128, 64, 32), (4, 8, 16)):
        common = dict(H=16, K=128, V=128, BT=BT, BK=128, BV=BV, HAS_LB=True, VARLEN=False, MAX_SPREAD=60.0,
                      DT=tl.bfloat16, PREC="tf32", REVERSE=False)
        pdt = "bf16" if BV == 128 else "fp32"
        sfx = f"BT={BT} BV={BV} w={warps}"
        yield (f"fwd {sfx}", f.fused_chunk_fwd_kernel,
               dict(o="*bf16", g="*bf16", i="*bf16", y="*bf16", scale="fp32", T="i32", lb="*fp32"),
               dict(common, O_ACT=1, I_ACT=0, HAS_H0=False, STORE_HT=False), warps)
        yield (f"bwd_dq {sfx}", b.fused_chunk_bwd_dq_kernel,
               dict(g="*bf16", i="*bf16", dy="*bf16", dys="*fp32", T="i32", NTOK="i32", lb="*fp32"),
               dict(common, I_ACT=0, HAS_H0=False, STORE_HT=False, SPREC="tf32x3"), warps)
        yield (f"bwd {sfx}", b.fused_chunk_bwd_kernel,
               dict(o="*bf16", g="*bf16", i="*bf16", dy="*bf16", dys="*fp32", ht="*fp32", do=f"*{pdt}",
                    dg=f"*{pdt}", di="*bf16", scale="fp32", T="i32", NTOK="i32", dlb="*fp32", lb="*fp32"),
               dict(common, O_ACT=1, I_ACT=0, HAS_DHT=False, STORE_DH0=False, SPREC="tf32x3"), warps)


def fused_chunk_default_variants():
    """The fused-chunk kernels at their defaults for bf16, K = V = 128, V whole or split in two, forward and
    reverse walks (a quick check for the test suite)."""
    return (v for v in fused_chunk_variants() if v[0].endswith(("bf16 K=V=128 BV=128 w=8 full=True",
                                                          "bf16 K=V=128 BV=64 w=8 full=True",
                                                          "bf16 K=V=128 BV=128 w=8 full=True reverse",
                                                          "bf16 K=V=128 BV=64 w=8 full=True reverse")))


def chunk_parallel_default_variants():
    """The chunk-parallel kernels at their defaults for bf16, K = V = 128, the backward fused and split (a quick
    check for the test suite)."""
    keep = ("decay bf16 varlen=False", "fwd_h bf16 K=V=128 BK=64 BV=128 w=8", "bwd_dh bf16 K=V=128 BK=64 BV=128 w=8",
            "fwd_o bf16 K=V=128 BK=64 BV=128 w=8", "bwd bf16 K=V=128 BK=32 BV=128 w=8",
            "bwd split dv bf16 K=V=128 BK=32 BV=128 w=8", "bwd split dqk bf16 K=V=128 BK=32 BV=128 w=8",
            f"fwd_o storing A bf16 K=V=128 BK={FWD_O_DEFAULT[0]} BV=128 w={FWD_O_DEFAULT[1]}",
            f"fwd_o storing A bf16 K=V=128 BK={FWD_O_DEFAULT[0]} BV=128 w={FWD_O_DEFAULT[1]} halves",
            f"fwd_o storing A bf16 K=V=128 BK={FWD_O_DEFAULT[0]} BV=128 w={FWD_O_DEFAULT[1]} fallback",
            "bwd fused from A bf16 K=V=128 BK=32 BV=128 w=8", "bwd fused from A bf16 K=V=128 BK=32 BV=128 w=8 halves",
            "bwd fused from A bf16 K=V=128 BK=32 BV=128 w=8 fallback",
            "bwd small gates bf16 K=V=128 BK=16 BVS=32 w=4")
    return (v for v in chunk_parallel_variants() if v[0] in keep)


def glue_variants():
    """RMSNorm / LayerNorm, SwiGLU, cross-entropy and decoding's projection kernels (the model's glue) for bf16 / fp32
    inputs at their launch shapes."""
    from hgrn2.ops.triton import cross_entropy, gemv, norm, swiglu
    for dt in ("bf16", "fp32"):
        ptrs = ("x", "res", "r_out", "w0", "w1", "w2", "b0", "b1", "b2", "y0", "y1", "y2")
        types = {**{n: f"*{dt}" for n in ptrs}, "gamma": "*fp32", "eps": "fp32", "M": "i32", "N": "i32", "K": "i32",
                 "stride_xm": "i32", "stride_ym": "i32"}
        for c in gemv._configs():
            for swiglu_, prenorm in ((False, False), (True, True)):
                flags = dict(HAS_BIAS=False, SWIGLU=swiglu_, NORM=prenorm, RES=prenorm, BLOCK_M=1, EVEN=True,
                             PDL=prenorm, **c.kwargs)
                yield (f"gemv {dt} swiglu={swiglu_} norm={prenorm} {c.kwargs}", gemv._gemv_kernel, types, flags,
                       c.num_warps)
        yield (f"ce fwd {dt}", cross_entropy._ce_fwd_kernel,
               dict(logits=f"*{dt}", labels="*i64", lse="*fp32", target="*fp32", V="i32", stride="i32"),
               dict(BLOCK_V=cross_entropy.BLOCK_V), 8)
        yield (f"ce bwd {dt}", cross_entropy._ce_bwd_kernel,
               dict(logits=f"*{dt}", labels="*i64", lse="*fp32", coef="*fp32", V="i32", stride="i32"),
               dict(BLOCK_V=cross_entropy.BLOCK_V), 8)
        for kind, D in (("rms", 1024), ("rms", 5632), ("layer", 128), ("layer", 1024), ("add+rms", 1024)):
            rows, block, warps = norm._launch_shape(D)
            flags = dict(BLOCK_N=rows, BLOCK_D=block, CENTER=kind == "layer", HAS_W=True, HAS_B=kind == "layer",
                         HAS_RES=kind == "add+rms")
            yield (f"{kind} norm fwd {dt} D={D}", norm._norm_fwd_kernel,
                   dict(x=f"*{dt}", res="*bf16", r=f"*{dt}", w="*fp32", b="*fp32", y="*bf16", mean="*fp32",
                        rstd="*fp32", eps="fp32", N="i32", D="i32"), flags, warps)
            yield (f"{kind} norm bwd {dt} D={D}", norm._norm_bwd_kernel,
                   dict(dy="*bf16", x=f"*{dt}", w="*fp32", mean="*fp32", rstd="*fp32", dx=f"*{dt}", dr=f"*{dt}",
                        dres="*bf16", dw_part="*fp32", db_part="*fp32", N="i32", D="i32", TILES="i32"), flags, warps)
        yield (f"swiglu fwd {dt}", swiglu._swiglu_fwd_kernel, dict(g=f"*{dt}", u=f"*{dt}", p=f"*{dt}", n="i64"),
               dict(BLOCK=swiglu.BLOCK), 8)
        yield (f"swiglu bwd {dt}", swiglu._swiglu_bwd_kernel,
               dict(g=f"*{dt}", u=f"*{dt}", dp=f"*{dt}", dg=f"*{dt}", du=f"*{dt}", p=f"*{dt}", n="i64"),
               dict(BLOCK=swiglu.BLOCK), 8)


def ptxas_stats(compiled) -> str:
    """Registers and spill stores/loads (bytes) of a compiled kernel: the bundled ptxas (the one Triton uses
    for sm_90) run with -v on its PTX."""
    from triton.backends.nvidia import compiler as nv
    ptxas = nv.get_ptxas(90).path if hasattr(nv, "get_ptxas") else os.path.join(
        os.path.dirname(nv.__file__), "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as fh:
            fh.write(compiled.asm["ptx"])
        out = subprocess.run([ptxas, "-v", "-arch=sm_90a", p, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return (f"regs={regs.group(1) if regs else '?'} spill st/ld={spill.group(1) if spill else '?'}/"
            f"{spill.group(2) if spill else '?'} B")


if __name__ == "__main__":
    group = sys.argv[1]
    variants = {"recurrent": recurrent_variants, "hgrn1": hgrn1_variants, "fused-chunk": fused_chunk_variants,
                "fused-chunk-default": fused_chunk_default_variants, "fused-chunk-grid": fused_chunk_grid_variants,
                "chunk-parallel": chunk_parallel_variants, "chunk-parallel-default": chunk_parallel_default_variants,
                "glue": glue_variants, "small-heads": small_heads_variants}[group]
    failed = 0
    for name, kernel, types, consts, *w in variants():
        try:
            t = time.time()
            compiled = compile_variant(kernel, types, consts, *w)
            if not group.endswith("default") and group not in ("recurrent", "hgrn1", "small-heads"):
                print(f"ok {name}: {time.time() - t:.1f} s {ptxas_stats(compiled)}", flush=True)
                continue
            print("ok", name)
        except Exception as e:  # noqa: BLE001 - report every failing variant
            failed += 1
            print("FAILED", name, f"{type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)
