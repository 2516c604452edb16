"""Compile Triton kernels for sm_90 without a GPU: catches errors the interpreter lets through.

Run as a script in a process without TRITON_INTERPRET: `python tests/compile_sm90.py recurrent|hgrn1`.
Exits non-zero and prints the compiler error if any variant fails.
"""

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_variant(kernel, types: dict, consts: dict, num_warps: int = 4):
    """Arguments absent from `types` and `consts` are None pointers (constexpr None)."""
    names = kernel.arg_names
    consts = {**{n: None for n in names if n not in types and n not in consts}, **consts}
    signature = {n: "constexpr" if n in consts else types[n] for n in names}
    constexprs = {(names.index(n),): v for n, v in consts.items()}
    return triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps})


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
                          HAS_LB=full, HAS_H0=full, STORE_HT=full, IS_VARLEN=not full)
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


if __name__ == "__main__":
    variants = {"recurrent": recurrent_variants, "hgrn1": hgrn1_variants}[sys.argv[1]]
    failed = 0
    for name, kernel, types, consts in variants():
        try:
            compile_variant(kernel, types, consts)
            print("ok", name)
        except Exception as e:  # noqa: BLE001 - report every failing variant
            failed += 1
            print("FAILED", name, f"{type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)
