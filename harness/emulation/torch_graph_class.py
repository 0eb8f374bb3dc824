"""`torch.cuda.CUDAGraph` as this torch build defines it, over the emulated graph.

torch's CUDAGraph is two halves: a Python class (torch/cuda/graphs.py) and the C++ `_CUDAGraph` it
derives from. The Python half differs per build: torch 2.14 added capture-end, instantiate and
replay hooks, destroy callbacks, `retain_object`, `pools()`, the instantiate-on-first-replay rule
and the `capture_end_pre`/`capture_end_post` split; torch 2.13's only converts pool handles. Code
and tests of a build use its Python half, so the emulated device keeps it unchanged and replaces
only the C++ half: `rebased(torch_class, base)` is the build's class, method for method, with
`base` (the emulated `_CUDAGraph`, cuda_graph.py) where `torch._C._CUDAGraph` was. Its zero-argument
`super()` calls reach `base` because each method's `__class__` cell is rebound to the new class.
Inside the emulation `torch._C._CUDAGraph` names `base` too (cuda_api.py), so code that patches the
C++ half (PyTorch's test_graph_replay_hooks makes its `replay` raise) reaches every graph.
"""

from __future__ import annotations

import types

# Made by the class statement itself; copying them would refer to the old class's slots.
_NOT_COPIED = frozenset({"__dict__", "__weakref__"})


def rebased(torch_class: type, base: type) -> type:
    """`torch_class`'s own attributes on a new class deriving from `base` alone."""
    cell = types.CellType()
    namespace = {name: _rebound(value, torch_class, cell)
                 for name, value in vars(torch_class).items()
                 if name not in _NOT_COPIED}
    cls = type(torch_class.__name__, (base,), namespace)
    cell.cell_contents = cls
    return cls


def _rebound(value, old: type, cell: types.CellType):
    if isinstance(value, staticmethod):
        return staticmethod(_rebound(value.__func__, old, cell))
    if isinstance(value, classmethod):
        return classmethod(_rebound(value.__func__, old, cell))
    if isinstance(value, property):
        return property(*(None if f is None else _rebound(f, old, cell)
                          for f in (value.fget, value.fset, value.fdel)), value.__doc__)
    if not isinstance(value, types.FunctionType) or value.__closure__ is None:
        return value
    closure = tuple(cell if name == "__class__" and _holds(c, old) else c
                    for name, c in zip(value.__code__.co_freevars, value.__closure__))
    function = types.FunctionType(value.__code__, value.__globals__, value.__name__,
                                  value.__defaults__, closure)
    function.__kwdefaults__ = value.__kwdefaults__
    function.__qualname__ = value.__qualname__
    function.__doc__ = value.__doc__
    function.__dict__.update(value.__dict__)
    return function


def _holds(cell: types.CellType, old: type) -> bool:
    try:
        return cell.cell_contents is old
    except ValueError:  # an empty cell
        return False
