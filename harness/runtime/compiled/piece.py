"""CompiledPiece: one static piece of a split graph, compiled by inductor for each input shape.

A piece is compiled the first time it meets a shape (vLLM's compile sizes: every captured batch size
gets kernels specialised to it), always outside a graph capture: inductor's compile runs host code
and, on a GPU, benchmarks kernels, none of which a capture may record. A compile asked for inside a
capture is refused (`CompileInCaptureError`): the shape should have been warmed up first.

Where the graph backend records at the dispatcher (the emulated backend), the compiled kernels are
invisible to it, so the piece is called through the opaque op `harness::compiled_piece`
(piece_op.py); a real CUDA graph records inductor's kernels directly and the piece is called as is.

Inductor's own CUDA graphs (cudagraph trees, `mode="reduce-overhead"`) are refused inside the
harness's graphs (`NestedCudagraphsError`): they would capture a graph of their own inside ours,
and replay tensors from a pool the outer graph does not know of.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef

from harness import torch_internals
from harness.torch_internals import tree_flatten, tree_unflatten
from harness.graphs.base import CaptureError, GraphBackend
from harness.graphs.recording import records_dispatched_ops_only
from harness.runtime.compiled import piece_op

CUDAGRAPHS_OPTION = "triton.cudagraphs"


class CompileInCaptureError(CaptureError):
    """A compile (dynamo's or inductor's) was asked for while a graph was being captured."""


class NestedCudagraphsError(ValueError):
    """Inductor's cudagraph trees were asked for inside the harness's own graphs."""


@dataclass
class CompileCounts:
    """Compiles so far, shared by the pieces of one compiled function and its dynamo backend."""

    graphs: int = 0  # dynamo graphs (each one split into pieces)
    pieces: int = 0  # inductor compiles, one per piece and input shape


PDL_OPTION = "triton.enable_pdl"


def inductor_has_pdl() -> bool:
    """Whether this torch's inductor can launch its own Triton kernels with PDL
    (`torch._inductor.config.triton.enable_pdl`; torch 2.13 and 2.14 have it)."""
    return hasattr(torch_internals.lazy_module("inductor_config").triton, "enable_pdl")


def inductor_options(*, pdl: bool = False) -> dict[str, Any]:
    """The inductor config patches every piece is compiled with, applied per compile
    (`config_patches`), never to the global config. The reference asks for none but PDL: with
    `pdl`, inductor's Triton kernels are launched with it too where this inductor has the option
    (each waits on the kernel before it, as the project's do). A runtime that asks for cudagraph
    trees here (`mode="reduce-overhead"`) is refused."""
    return {PDL_OPTION: True} if pdl and inductor_has_pdl() else {}


def place_outputs(outputs: list[Any]) -> list[Any]:
    """Where a piece's outputs live once it returns: in the tensors its compiled code allocated,
    which nothing else writes until they are dropped."""
    return outputs


def shape_key(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a compiled piece is specialised to: each tensor's shape, stride and dtype, each int.
    The stride of a dimension of size 1 is never used, and is left out."""
    return tuple((tuple(a.shape), _strides(a), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _strides(t: torch.Tensor) -> tuple[int | None, ...]:
    return tuple(None if size == 1 else stride for size, stride in zip(t.shape, t.stride()))


def unaliased(outputs: list[Any], inputs: list[Any]) -> list[Any]:
    """`outputs` contiguous, with a copy in place of each tensor that shares memory with an input
    or an earlier output: an op's fresh returns must be its own memory (q, k and v, views of one
    projection, come back as three tensors). Contiguous, because the recording sizes them from the
    fake (the uncompiled code) and the next piece's kernels are specialised to its input strides:
    real and fake outputs must agree on them."""
    # Storages by identity, not address: the fake run's tensors have none.
    seen = {StorageWeakRef(t.untyped_storage()) for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    result = []
    for out in outputs:
        if isinstance(out, torch.Tensor) and out.numel():
            if StorageWeakRef(out.untyped_storage()) in seen:
                out = out.clone(memory_format=torch.contiguous_format)
            else:
                out = out.contiguous()
            seen.add(StorageWeakRef(out.untyped_storage()))
        result.append(out)
    return result


class CompiledPiece:
    """`piece(*args)`: the static FX submodule `module`, compiled by inductor for the shapes of
    `args` on first use. `backend` is the graph backend that may capture it (None: no graphs);
    `pdl`: compiled with `inductor_options(pdl=True)`."""

    def __init__(self, module: fx.GraphModule, *, name: str, backend: GraphBackend | None,
                 counts: CompileCounts, pdl: bool = False) -> None:
        self.module = module
        self.pdl = pdl
        self.name = name
        self.backend = backend
        self.counts = counts
        self.opaque = records_dispatched_ops_only(backend)
        self._compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._tensor_mask: tuple[bool, ...] = ()
        output = next(n for n in reversed(module.graph.nodes) if n.op == "output")
        self._output_spec = tree_flatten(output.args[0])[1]  # how the flat outputs nest
        self._id = piece_op.register(self) if self.opaque else None

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph

    @property
    def compiled_shapes(self) -> tuple[tuple[Any, ...], ...]:
        return tuple(self._compiled)

    def __call__(self, *args: Any) -> Any:
        key = shape_key(args)
        if key not in self._compiled:
            self._compiled[key] = self._compile(key, args)
        if self.opaque:
            tensors, scalars = self._split(args)
            outputs = list(torch.ops.harness.compiled_piece(self._id, tensors, scalars))
        else:
            outputs = self._flat(self._compiled[key](*args))
        return tree_unflatten(place_outputs(outputs), self._output_spec)

    @staticmethod
    def _flat(result: Any) -> list[Any]:
        return tree_flatten(result)[0]

    # --- the opaque op's side (piece_op.OpaquePiece) -------------------------------------------

    def run_compiled(self, args: list[Any]) -> list[torch.Tensor]:
        compiled = self._compiled.get(shape_key(tuple(args)))
        if compiled is None:
            raise RuntimeError(f"compiled piece {self.name}: no compile for shapes {shape_key(tuple(args))}")
        outputs = self._flat(compiled(*args))
        if not all(isinstance(t, torch.Tensor) for t in outputs):
            raise TypeError(f"compiled piece {self.name} returns {[type(t).__name__ for t in outputs]}; "
                            f"through harness::compiled_piece a piece may return tensors only")
        return unaliased(outputs, args)

    def run_fake(self, args: list[Any]) -> list[torch.Tensor]:
        with torch.no_grad():
            return unaliased(self._flat(self.module(*args)), args)

    def _split(self, args: tuple[Any, ...]) -> tuple[list[torch.Tensor], list[int]]:
        return ([a for a in args if isinstance(a, torch.Tensor)],
                [a for a in args if not isinstance(a, torch.Tensor)])

    def join(self, tensors: list[torch.Tensor], scalars: list[int]) -> list[Any]:
        tensor_iter, scalar_iter = iter(tensors), iter(scalars)
        return [next(tensor_iter) if tensor else next(scalar_iter) for tensor in self._tensor_mask]

    # --- compiling ------------------------------------------------------------------------------

    def _compile(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Callable[..., Any]:
        if self.backend is not None and self.backend.is_capturing():
            raise CompileInCaptureError(
                f"compiled piece {self.name}: inductor was asked to compile it for new input shapes "
                f"{_describe(key)} inside a graph capture (already compiled for "
                f"{len(self._compiled)} other shapes); a capture may only record work. Run every "
                f"captured shape once before capturing it", op=self.name)
        options = inductor_options(pdl=self.pdl)
        if self.backend is not None and (options.get(CUDAGRAPHS_OPTION)
                                         or torch_internals.lazy_module("inductor_config").triton.cudagraphs):
            raise NestedCudagraphsError(
                f"compiled piece {self.name}: inductor's cudagraph trees ({CUDAGRAPHS_OPTION}, "
                f"mode='reduce-overhead') inside the harness's {self.backend.name} graphs; they would "
                f"capture graphs of their own inside ours, from a pool ours does not see. Compile the "
                f"pieces with the default mode and let the harness capture them")
        if self.opaque:
            self._tensor_mask = tuple(isinstance(a, torch.Tensor) for a in args)
            bad = [type(a).__name__ for a in args if not isinstance(a, (torch.Tensor, int))]
            if bad:
                raise TypeError(f"compiled piece {self.name}: inputs of types {bad} cannot pass "
                                f"through harness::compiled_piece (tensors and ints only)")
        compile_fx = torch_internals.lazy_module("inductor_compile_fx").compile_fx

        with torch.no_grad():
            compiled = compile_fx(self.module, list(args), config_patches=options)
        self.counts.pieces += 1
        return compiled


def _describe(key: tuple[Any, ...]) -> str:
    return ", ".join(f"{list(k[0])} {str(k[2]).removeprefix('torch.')}" if isinstance(k, tuple) else repr(k)
                     for k in key)


def inductor_piece_compiler(backend: GraphBackend | None) -> Callable[[fx.GraphModule, str], CompiledPiece]:
    """`compile_piece` for the piecewise compile backend: each static piece a CompiledPiece, all
    counted together."""
    counts = CompileCounts()

    def compile_piece(module: fx.GraphModule, name: str) -> CompiledPiece:
        return CompiledPiece(module, name=name, backend=backend, counts=counts)

    return compile_piece
