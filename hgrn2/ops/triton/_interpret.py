"""Make Triton's CPU interpreter (TRITON_INTERPRET=1) do bf16 arithmetic as the GPU does, and run our kernels on
the GPU machines' Triton too.

Two defects of the interpreter (Triton 3.9) would make the CPU tests of the bf16 paths meaningless:
- its `tl.dot` hands bf16 tiles (stored as uint16 bit patterns) to `np.matmul` as integers: garbage. Widening
  the operands to fp32 first is exact, and fp32 products of bf16 values summed in fp32 are what the GPU's bf16
  tensor cores compute;
- its fp32 → bf16 cast truncates (rounds toward zero, a bias the GPU's round-to-nearest-even does not have);
  torch's cast rounds to nearest even.
So the CPU tests exercise the kernels' real bf16 rounding. And Triton 3.6's interpreter (the GPU machines') takes
a scalar as a loop bound by `int()` of its one-element array, which NumPy ≥ 2.4 refuses ("only 0-dimensional
arrays can be converted to Python scalars"); Triton 3.9 squeezes it first, as done here. Applied only under the
interpreter, once.
"""

from __future__ import annotations

import os

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # the kernels run as numpy on the CPU (read at import)


def patch_interpreter() -> None:
    if not INTERPRET:
        return
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_hgrn2_patched", False):
        return
    dot, cast = builder.create_dot, builder.cast_impl

    def widen(x):
        if x.dtype.scalar == tl.bfloat16:
            wide = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
            return interpreter.TensorHandle(wide, tl.float32)
        return x

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            x = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits.reshape(src.data.shape), tl.bfloat16)
        return cast(self, src, dst_type)

    builder.create_dot, builder.cast_impl = create_dot, cast_impl
    builder.create_fp_trunc = lambda self, src, dst_type: self.cast_impl(src, dst_type)

    patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))  # undone first (LIFO)

    interpreter._patch_lang_tensor = patch_lang_tensor
    builder._hgrn2_patched = True
