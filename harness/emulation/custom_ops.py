"""Custom ops whose only kernel is a Python CUDA one, on the emulated device.

Runtimes register Python kernels of their own ops for CUDA alone: `torch.library.custom_op(...,
device_types="cuda")`, `Library.impl(name, fn, "CUDA")` (vLLM's direct_register_custom_op with the
platform's dispatch key). The emulated device's tensors are CPU tensors, so the dispatcher looked
for a CPU kernel and failed ("Could not run 'ns::op' with arguments from the 'CPU' backend") where
CUDA runs the op. While the emulation lasts each such op gets a CPU kernel of the harness's (in a
Library of its own, destroyed at exit) that calls the op's CUDA kernel. Ops registered while the
emulation lasts are routed as they register. The kernel runs below the dispatch modes, so stream
tracking and a capture see one call of the op (the graph contract's opaque custom op), and a
replay, which calls it on the recorder's own aliases of the captured memory, runs it again.
Different from CUDA: host tensors given to such an op run the CUDA kernel too, where CUDA finds no
kernel for them (at the kernel, a replay's memory and a host tensor look alike).

Left as they are: an op with a CPU kernel of its own runs it, as every aten op runs the CPU's
kernel here (the harness's own Triton ops keep their torch path so); C++ CUDA kernels, which would
read host memory as device pointers; torch's namespaces.
"""

from __future__ import annotations

from typing import Any

import torch

from harness import torch_internals
from harness.emulation.op_bodies import user_namespace, wrapped

_SERVING_CPU = ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd")


def _runs_on_cpu(qualname: str) -> bool:
    return any(torch_internals.dispatch_has_kernel_for_dispatch_key(qualname, key)
               for key in _SERVING_CPU)


class CudaOnlyOps:
    """The CPU kernels that send device calls of CUDA-only custom ops to their CUDA kernel."""

    def __init__(self) -> None:
        self._libraries: dict[str, Any] = {}
        self.routed: list[str] = []  # qualified names, in the order they were routed

    def route_registered(self) -> None:
        """Every op a Python CUDA kernel was registered for before now."""
        for key in sorted(torch_internals.library_impls):
            namespace, _, rest = key.partition("/")
            name, _, dispatch_key = rest.rpartition("/")
            if dispatch_key == "CUDA":
                self.route(namespace, name)

    def route(self, namespace: str, name: str) -> None:
        """Give `namespace::name` (an op name, with its overload if any) the routing CPU kernel,
        when it is a user's op with no kernel that serves the CPU."""
        qualname = f"{namespace}::{name}"
        if not user_namespace(namespace) or qualname in self.routed or _runs_on_cpu(qualname):
            return
        cuda_kernel = torch.library.get_kernel(qualname, "CUDA")

        library = self._libraries.get(namespace)
        if library is None:
            library = self._libraries[namespace] = torch.library.Library(namespace, "IMPL")
        library.impl(name, cuda_kernel.call_boxed, "CPU", with_keyset=True)
        self.routed.append(qualname)

    def close(self) -> None:
        for library in self._libraries.values():
            library._destroy()
        self._libraries.clear()


def patches(state) -> list[tuple[Any, str, Any]]:
    """`Library.impl`, routing the ops it registers for CUDA while the emulation lasts (the session
    routes those registered before, `CudaOnlyOps.route_registered`), and running the Python
    bodies it registers with the device in view (op_bodies.py)."""
    ops = state.cuda_only_ops
    register = torch.library.Library.impl

    def impl(self, op_name, fn, dispatch_key="", *args, **kwargs):
        namespace = op_name.rpartition("::")[0] if isinstance(op_name, str) else ""
        fn = wrapped(state, namespace or self.ns, dispatch_key, fn)
        result = register(self, op_name, fn, dispatch_key, *args, **kwargs)
        if dispatch_key == "CUDA" and isinstance(op_name, str):
            namespace, _, name = op_name.rpartition("::")
            ops.route(namespace or self.ns, name)
        return result

    impl.__wrapped__ = register
    return [(torch.library.Library, "impl", impl)]


__all__ = ["CudaOnlyOps", "patches"]
