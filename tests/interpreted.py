"""tuning.moe_ops and tuning.fused_moe with their kernels in Triton's interpreter, on a machine
without a GPU.

TRITON_INTERPRET is read when a kernel is decorated, so it is set while the module (re)loads;
test modules that run kernels set it again while their tests run (Triton reads it at run time
too, e.g. importing its Gluon frontend). Triton's own library kernels (tl.cdiv, …) are
decorated when Triton is first imported, so this module is imported by the kernel tests before
anything else imports Triton, and loads the modules at once.
"""

import contextlib
import importlib
import os

import torch

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def kernel_modules():
    """tuning.moe_ops and tuning.fused_moe: compiled on a GPU, interpreted without one (reloaded
    if need be, moe_ops first so that fused_moe binds its interpreted kernels)."""
    if GPU:
        return importlib.import_module("tuning.moe_ops"), importlib.import_module(
            "tuning.fused_moe"
        )
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        ops = importlib.import_module("tuning.moe_ops")
        if not _interpreted(ops._activation_kernel):
            ops = importlib.reload(ops)
        module = importlib.import_module("tuning.fused_moe")
        if (
            not _interpreted(module._expert_gemm_kernel)
            or module.sort_and_pad is not ops.sort_and_pad
        ):
            module = importlib.reload(module)
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return ops, module


def _interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def random_layer(M, shape, seed=0):
    """A MoE layer's inputs for M tokens of `shape` (a KernelShape in fp32 or fp16), drawn from
    `seed` on DEVICE: [x, w1, w2, topk_weights, topk_ids] as the engines' kernels take them."""
    generator = torch.Generator().manual_seed(seed)
    t = TORCH_DTYPES[shape.dtype]
    x = torch.randn((M, shape.H), generator=generator).to(t)
    w1 = (torch.randn((shape.E, 2 * shape.N, shape.H), generator=generator) / shape.H**0.5).to(t)
    w2 = (torch.randn((shape.E, shape.H, shape.N), generator=generator) / shape.N**0.5).to(t)
    logits = torch.randn((M, shape.E), generator=generator)
    topk_weights, topk_ids = torch.topk(torch.softmax(logits, dim=-1), shape.top_k, dim=-1)
    values = [x, w1, w2, topk_weights, topk_ids.to(torch.int32)]
    return [v.to(DEVICE) for v in values]


@contextlib.contextmanager
def interpreting():
    """TRITON_INTERPRET set while the block runs (kernels decorated in it are interpreted),
    without a GPU; restored after."""
    saved = os.environ.get("TRITON_INTERPRET")
    if not GPU:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


ops, fm = kernel_modules()
