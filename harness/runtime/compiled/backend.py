"""InductorPiecesBackend: a `torch.compile` backend that splits at the attention ops and compiles
each static piece with inductor, as vLLM's backend does; the attention ops run as they are between
the pieces. The whole compiled function is then what a decode graph captures (step.py).

Dynamo calls the backend once per graph it compiles. A call while a graph is being captured means
a guard failed between the warmup and the capture (something the compiled region reads changed)
and dynamo is compiling again inside the capture: refused with `CompileInCaptureError`.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import fx

from harness.graphs.base import GraphBackend
from harness.runtime.compiled.piece import CompileCounts, CompileInCaptureError, CompiledPiece
from harness.runtime.piecewise.policy import SplitPredicate
from harness.runtime.piecewise.split import mutated_inputs, split_graph_at_dynamic_ops, submodule_name


class InductorPiecesBackend:
    """`torch.compile(fn, backend=InductorPiecesBackend(graph_backend))`; `graph_backend` is the
    one that captures the compiled function (None: no graphs); `pdl`: the pieces are compiled
    with `inductor_options(pdl=True)`. `counts` counts dynamo graphs and inductor compiles;
    `pieces` lists every piece made."""

    def __init__(self, graph_backend: GraphBackend | None, *,
                 split_at: Callable[[fx.Node], bool] = SplitPredicate(), name: str = "compiled step",
                 pdl: bool = False) -> None:
        self.graph_backend = graph_backend
        self.pdl = pdl
        self.split_at = split_at
        self.name = name
        self.counts = CompileCounts()
        self.pieces: list[CompiledPiece] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if self.graph_backend is not None and self.graph_backend.is_capturing():
            raise CompileInCaptureError(
                f"{self.name}: dynamo compiled a new graph (number {self.counts.graphs + 1}) inside a "
                f"graph capture: a guard of the compiled region failed between its warmup and the "
                f"capture (a Python value, a global setting or an input's dtype or stride it reads "
                f"changed). Keep what the compiled region reads the same in warmup and capture",
                op=self.name)
        self.counts.graphs += 1
        split = split_graph_at_dynamic_ops(gm, self.split_at)
        for index in split.static:
            written = mutated_inputs(split.submodule(index))
            if written:
                raise ValueError(f"static piece {submodule_name(index)} writes its inputs {written} in "
                                 f"place; compiled pieces may not. Move the write into a dynamic op")
        for index in split.static:
            piece = CompiledPiece(split.submodule(index), name=f"{submodule_name(index)} of graph "
                                  f"{self.counts.graphs}", backend=self.graph_backend, counts=self.counts,
                                  pdl=self.pdl)
            split.split_module.__dict__[submodule_name(index)] = piece
            self.pieces.append(piece)
        return split.split_module
