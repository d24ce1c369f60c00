"""torch's private surface that vlbench needs, imported only inside the functions that use it: this module's importers
include the start-up of every stage (vlbench.lazy_imports), and a stage that runs no model must not load torch.

- `torch._dynamo.utils.is_compile_supported`: torchvision's package import imports `torch._dynamo.utils` for this one
  function (`torchvision.ops.roi_align`), which pulls in torch.compile's tracer; vlbench.lazy_imports puts a stand-in
  module named DYNAMO_UTILS in its place while torchvision loads, whose function is `is_compile_supported` below.
- `torch.utils._python_dispatch.TorchDispatchMode` and `torch.utils._pytree.tree_leaves`: the tensors every operation
  returns, which `vlbench plan`'s meta-device pass measures (`output_bytes`). torch has no public dispatch mode (its
  public `torch.utils.flop_counter.FlopCounterMode` is built on this one).

tests/test_adapters.py checks these names and their results against the installed torch."""

from __future__ import annotations

DYNAMO_UTILS = "torch._dynamo.utils"


def is_compile_supported(device_type: str) -> bool:
    """torch._dynamo.utils.is_compile_supported, importing torch._dynamo at the first call."""
    from torch._dynamo.utils import is_compile_supported as supported

    return supported(device_type)


def output_bytes():
    """A context manager recording, for every operation torch dispatches inside it, the bytes of the tensors it
    returns: `.largest` (the largest one tensor) and `.total` (all of them) after the block."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class OutputBytes(TorchDispatchMode):
        largest, total = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sizes = [t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.largest, self.total = max([self.largest, *sizes]), self.total + sum(sizes)
            return out

    return OutputBytes()
