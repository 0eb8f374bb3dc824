"""Autograd's products on the emulated device. The autograd engine makes gradients in C++, where
no TorchFunctionMode sees them; while `backward()` or `autograd.grad()` runs, a light dispatch
mode marks each fresh result device memory when one of the op's inputs is."""

from __future__ import annotations

import contextlib
import threading

import torch

from harness import torch_internals
from harness.torch_internals import TorchDispatchMode, get_current_function_mode_stack, tree_flatten
from harness.emulation import backward_streams, device_indices
from harness.emulation.blas_workspaces import ATEN_MATMUL_NAMES
from harness.emulation.device_memory import is_device_memory
from harness.emulation.kernel_log import KERNELS
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass


class _MarkResults(TorchDispatchMode):
    # higher-order operators (activation checkpointing's random-op wrappers in AOTAutograd's
    # backward) come here too, and run on: the ops inside them are marked as they run
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile skips every frame while a dispatch mode that does not step aside is on:
        # compiled autograd's graph of the backward, compiled while the engine runs, ran as
        # plain code (so its reduce-overhead graphs never reached CUDA graphs). The compiled
        # graph places its own outputs (compiled_graphs.py).
        return True

    def __init__(self, state) -> None:
        super().__init__()
        self.memory = state.memory
        self.state = state
        self.several = state.properties.count > 1
        self.paused = False  # while a hook's own device call places and marks its results

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types and defer_to_subclass(types):
            return NotImplemented  # the subclass's own dispatch first (tensor_subclasses.py)
        kwargs = kwargs or {}
        if self.paused or isinstance(func, torch_internals.HigherOrderOperator):
            return func(*args, **kwargs)
        inputs = tree_flatten((args, kwargs))[0]
        on_device = any(isinstance(t, torch.Tensor) and is_device_memory(t) for t in inputs)
        state = self.state
        # The op runs on its inputs' device, as the engine's device thread and the op's device
        # guard have it on CUDA: its results are allocated there, on that device's stream.
        index = device_indices.guard_index(args, kwargs) if on_device and self.several else None
        with state.device_guard(state.current_index if index is None else index):
            # an aten op: nothing for the placement mode to place
            with torch_internals.DisableTorchFunction():
                if on_device and state.kernel_log is not None and not state.capturing():
                    # a profiler records CUDA activity: the engine's ops are the device's kernels
                    with state.kernel_log.bracket(KERNELS):
                        out = func(*args, **kwargs)
                else:
                    out = func(*args, **kwargs)
            if on_device:
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        self.memory.mark_device(t)
                        if index:  # a fresh result, or a view of an input on that device
                            device_indices.set_index(t, index)
                if func.overloadpacket.__name__ in ATEN_MATMUL_NAMES and all(
                        t.numel() for t in inputs if isinstance(t, torch.Tensor)):
                    # the engine's device thread, with a cuBLAS handle of its own
                    state.blas_workspaces.note_backward_call(
                        state.streams.current(), f"aten.{func.overloadpacket.__name__} in backward")
        return out


_engine_marking = threading.local()  # the _MarkResults of the backward running on this thread


@contextlib.contextmanager
def engine_marking_paused():
    """The engine's marking of results (`_MarkResults`) off meanwhile, on this thread: a copy
    made inside the backward is placed and marked by the placement mode (a copy to the host is
    host memory, though its input is device memory; one to another device is that device's)."""
    marking = getattr(_engine_marking, "mode", None)
    if marking is None:
        yield
        return
    previous, marking.paused = marking.paused, True
    try:
        yield
    finally:
        marking.paused = previous


def gradient_back_to_its_device(out: torch.Tensor, index: int | None) -> None:
    """`out` is a copy of a tensor on device `index` (None: a host tensor) to another device: its
    gradient goes back there, as ToCopyBackward copies it on CUDA (`grad.to(self.options())`).
    The engine's copy is between cpu tensors (the device saved for it is the cpu), which the
    dispatch mode above would leave on the gradient's device: the node's hook copies it across
    (a real copy, as on CUDA). Until 2026-12-07 a host tensor's gradient stayed device memory."""
    if out.grad_fn is None:
        return

    def to_source_device(grad_inputs, grad_outputs):
        grad = grad_inputs[0]
        if not isinstance(grad, torch.Tensor) or not is_device_memory(grad) or (
                index is not None and device_indices.index_of(grad) == index):
            return None
        # the placement mode makes and marks the copy; the engine's marking stays out of it (it
        # would mark the copy on the gradient's device first)
        with engine_marking_paused():
            moved = grad.to(torch.device("cpu") if index is None else torch.device("cuda", index),
                            copy=True)
        return (moved, *grad_inputs[1:])

    out.grad_fn.register_hook(to_source_device)


def engine_with_placement(state, original):
    """A replacement for torch.autograd's `_engine_run_backward` (what `backward()` and
    `autograd.grad()` call once their torch-function check is done): it runs the engine with the
    placement mode back on the stack, so hooks and recomputed forwards (activation checkpointing)
    run on the emulated device as the caller's code does, and with gradients marked."""

    def run(*args, **kwargs):
        placement = state.placement
        with contextlib.ExitStack() as stack:
            if placement not in get_current_function_mode_stack():
                stack.enter_context(placement)
            marking = stack.enter_context(_MarkResults(state))
            outer, _engine_marking.mode = getattr(_engine_marking, "mode", None), marking
            stack.callback(setattr, _engine_marking, "mode", outer)
            # a forward recomputed by a hook runs in the engine's thread on CUDA
            stack.enter_context(state.blas_workspaces.backward_running())
            checks = None
            if backward_streams.CHECKED and state.capture is not None:
                # torch 2.14's checks of streams across the capture boundary
                checks = backward_streams.StaleStreamChecks(state)
                stack.callback(checks.remove_hooks)
                checks.before(args[0] if args else kwargs.get("t_outputs", ()))
            result = original(*args, **kwargs)
            if checks is not None:
                checks.after()
            return result

    return run


def implicit_grads_with_placement(state, original):
    """A replacement for torch.autograd's `_make_grads`: `backward()` and `autograd.grad()` make
    the gradients the caller left out (`ones_like` of each output) inside the placement mode's
    handling of the call, where it is off the stack, so they were host memory. With it back on
    they are device memory, as each output is: Python backwards (a custom autograd.Function's,
    AOTAutograd's for aot_eager) combine them with device tensors, a mixed-device error before."""

    def make_grads(*args, **kwargs):
        placement = state.placement
        if placement in get_current_function_mode_stack():
            return original(*args, **kwargs)
        with placement:
            return original(*args, **kwargs)

    return make_grads


def saved_tensor_hooks_with_placement(state, original):
    """A replacement for `torch._C._autograd._push_saved_tensors_default_hooks`: autograd calls
    pack hooks from inside an op (where the placement mode is off the stack) and unpack hooks from
    the engine; both run with it, so what they see (`x.device` in activation checkpointing's
    metadata check) is the same at the forward and at the recompute."""

    def with_placement(hook):
        def run(*args):
            placement = state.placement
            if placement in get_current_function_mode_stack():
                return hook(*args)
            with placement:
                return hook(*args)
        return run

    def pack_on_device(pack_hook):
        run = with_placement(pack_hook)

        def pack(tensor):
            # Called inside the op that saves `tensor` (often its own output, not yet marked):
            # inside a device op every tensor is device memory, but in one that makes outputs on
            # the host (a packed sequence's batch sizes, which it saves: host_outputs.py) the
            # placement mode marks the device ones, knowing which they are.
            memory = state.memory
            if memory.call_on_device and not memory.call_makes_host_outputs() \
                    and isinstance(tensor, torch.Tensor):
                memory.mark_device(tensor)
            return run(tensor)
        return pack

    def push(pack_hook, unpack_hook):
        return original(pack_on_device(pack_hook), with_placement(unpack_hook))

    return push


def remove_function_mode(mode) -> None:
    """Pop `mode` off the function-mode stack wherever it is, keeping the modes above it."""
    above = []
    while torch_internals.len_torch_function_stack() > 0:
        top = torch_internals.pop_torch_function_stack()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        torch_internals.push_on_torch_function_stack(m)


def put_back_function_mode(mode, index: int) -> None:
    """Push `mode` back at `index` of the function-mode stack, above it what is there now."""
    above = [torch_internals.pop_torch_function_stack()
             for _ in range(torch_internals.len_torch_function_stack() - index)]
    torch_internals.push_on_torch_function_stack(mode)
    for m in reversed(above):
        torch_internals.push_on_torch_function_stack(m)


# Where each output of a custom autograd.Function's forward lives, kept on its backward node
# (the `ctx`): per output, the device index of a device tensor, else None.
_OUTPUT_DEVICES = "_harness_output_devices"
# With several devices, the node's _ZerosDeviceGuard (see there)
_ZEROS_GUARD = "_harness_zeros_guard"
# Of AOTAutograd's CompiledFunction (`_copies_gradients_back`): per input of its forward,
# whether it is a host tensor
_HOST_INPUTS = "_harness_host_inputs"


class _ZerosDeviceGuard:
    """CUDA's PyNode makes each zero gradient it materializes under a device guard on that
    output's device, and calls the Function's backward with the guard still on the last one's
    device. A pre-hook of the node (run by the engine before the materialization) makes that
    device current here, and `restore` gives the caller's back once the backward has returned:
    the zeros are then made on that device's stream, and the backward runs there, as on CUDA."""

    def __init__(self, state, devices: tuple) -> None:
        self._state, self._devices = state, devices
        self._callers: list[int] = []  # the current device before each pre-hook, per thread run

    def before(self, grad_outputs) -> None:
        missing = [index for grad, index in zip(grad_outputs, self._devices)
                   if grad is None and index is not None]
        self._callers.append(self._state.current_index)
        if missing:
            self._state.current_index = missing[-1]

    def restore(self) -> None:
        if self._callers:
            self._state.current_index = self._callers.pop()


def function_outputs_recorded(state, original):
    """A replacement for `torch.autograd.Function.apply` (`original`, as the class holds it): the node
    the call makes remembers which of its outputs are device memory, for `materialized_grads_placed`."""
    several = state.properties.count > 1

    def recorded(cls, *args, **kwargs):
        # a Python classmethod up to torch 2.13, C++'s classmethod descriptor after: both bind
        out = original.__get__(None, cls)(*args, **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        node = next((t.grad_fn for t in outs if isinstance(t, torch.Tensor)
                     and isinstance(t.grad_fn, torch.autograd.function.BackwardCFunction)), None)
        if node is not None and _copies_gradients_back(cls):
            setattr(node, _HOST_INPUTS, tuple(isinstance(a, torch.Tensor) and not
                                              is_device_memory(a) for a in args))
        if node is not None:
            devices = tuple((device_indices.index_of(t) if several else 0)
                            if isinstance(t, torch.Tensor) and is_device_memory(t) else None
                            for t in outs)
            setattr(node, _OUTPUT_DEVICES, devices)
            if several and any(devices):
                guard = _ZerosDeviceGuard(state, devices)
                setattr(node, _ZEROS_GUARD, guard)
                node.register_prehook(guard.before)
        return out

    return classmethod(recorded)


def materialized_grads_placed(state, original, *, boxed: bool = False):
    """A replacement for `BackwardCFunction.apply` (`original`), what calls a custom Function's
    backward (`apply_boxed`, `boxed`, where torch has it: the gradients come as one list): the
    engine hands it zeros for an output the loss did not use (PyNode's materialization, made in
    C++ from the output's metadata, the cpu here, with no tensor argument for the marking mode
    above to follow), on the output's device on CUDA. Such a zero gradient of a device output is
    made device memory there (it was host memory: a backward combining it with device gradients
    met the mixed-device error)."""
    memory = state.memory
    several = state.properties.count > 1

    def apply(node, *args):
        devices = getattr(node, _OUTPUT_DEVICES, None)
        grads = args[0] if boxed and len(args) == 1 and isinstance(args[0], list) else args
        if devices is not None and len(devices) == len(grads):
            for grad, index in zip(grads, devices):
                if index is None or not isinstance(grad, torch.Tensor):
                    continue
                if not is_device_memory(grad):
                    memory.mark_device(grad)
                    if index:
                        device_indices.set_index(grad, index)
                elif several and device_indices.index_of(grad) != index:
                    # Made device memory already, on the device of the call the engine runs
                    # in: once stream tracking is on (a second stream seen, by any earlier
                    # code), its mode marks every fresh result of a device call, the zeros
                    # too, without their device. CUDA's engine hands a Function only gradients
                    # on its outputs' devices (validate_outputs copies or refuses any other).
                    device_indices.set_index(grad, index)
        guard = getattr(node, _ZEROS_GUARD, None)
        try:
            return _host_gradients_on_the_host(node, original(node, *args))
        finally:
            if guard is not None:
                guard.restore()

    return apply


def _copies_gradients_back(cls) -> bool:
    """Whether `cls` is AOTAutograd's CompiledFunction, whose backward graph copies the gradient
    of a host input that its forward copied to the device back to the host (the transfer's
    `device_put` to the cpu, which CUDA's `_to_copy` backward gives): the device's graphs of
    inductor and dynamo's cudagraphs backend keep their transfers views (compiled_graphs.py),
    so that gradient comes out device memory, and is copied here, as the graph copies it."""
    return (cls.__name__ == "CompiledFunction"
            and cls.__module__.startswith("torch._functorch._aot_autograd"))


def _host_gradients_on_the_host(node, grads):
    """`grads`, what a CompiledFunction's backward returns, with the gradient of each host input
    (`_HOST_INPUTS`) copied to the host where it came out device memory."""
    host = getattr(node, _HOST_INPUTS, None)
    if host is None or not isinstance(grads, tuple) or len(grads) != len(host):
        return grads
    return tuple(g.to("cpu") if on_host and isinstance(g, torch.Tensor) and is_device_memory(g)
                 else g for g, on_host in zip(grads, host))
