"""The emulated CUDA device's placement mode: a TorchFunctionMode over every torch call.

Tensors stay CPU tensors; what makes one a cuda tensor is its storage's mark (memory.py). For each
call the mode

1. rewrites a device argument naming cuda ("cuda", "cuda:0", torch.device("cuda"), an index) to the
   cpu, and `pin_memory=True` to a pinned mark;
2. refuses, with CUDA's error, an op that mixes device tensors with a host tensor of one or more
   dimensions (0-dim host tensors pass as scalars, as on CUDA; copies and indexing take host
   tensors as CUDA's do);
3. marks the outputs device memory when an input was device memory or the call named cuda (but
   those CUDA makes on the host: host_outputs.py);
4. answers `x.device`, `x.is_cuda`, `x.is_cpu`, `x.get_device()` as CUDA would, and marks the
   `.grad` of a device tensor;
5. tells the device's observers about each device op (`DeviceState.notify_op`, the interface the
   stream tracking builds on).

Transfers (`.to`, `.cuda`, `.cpu`, `copy_`, pinning, host reads) are transfers.py; autograd's
products are marked by backward.py.
"""

from __future__ import annotations

import functools
import re
import types

import torch
import torch.nn.attention.bias
from torch.overrides import TorchFunctionMode

from harness import torch_internals
from harness.torch_internals import DeviceContext, device_constructors
from harness.graphs.base import CaptureError
from harness.emulation import (array_interface, autocast, autocast_bodies, backward_streams,
                               blas_workspaces, compiled_rng, deterministic_alerts, device_branches,
                               device_indices, fft_plans, half_ffts, host_arguments,
                               host_outputs, inner_autocast, kernels, missing_kernels,
                               norm_statistics, reduced_kernels, sdpa_backends, transfers)
from harness.graphs.emulator.dispatch_keys import keep_modes_reachable
from harness.graphs.emulator.opinfo import scalar_type_name
from harness.graphs.emulator.device_asserts import eager_device_assert_error, is_index_out_of_bounds
from harness.emulation.capacity import requested_bytes
from harness.emulation.fft_plans import plan_key
from harness.emulation.capture_threads import capture_modes_for_this_thread, joined
from harness.emulation.sync_debug import call_flagging_syncs
from harness.emulation.device_draws import (EagerDraws, dispatch_modes_off, is_random, may_draw,
                                            recorded)
from harness.emulation.generators import DeviceGenerator
from harness.emulation.compiled_devices import to_device, to_host, to_traced_device
from harness.emulation.device_memory import (DEVICE, PINNED, SPARSE_LAYOUTS, is_device_memory,
                                             is_wrapper_subclass, memory_mark)
from harness.emulation.rules import (CPU, cuda_index, device_generator_on_host_error,
                                                 host_generator_error, mixed_devices_error,
                                                 names_cuda)

Tensor = torch.Tensor
_compiling = torch.compiler.is_compiling
_autocast_on = torch.is_autocast_enabled
_any_autocast_on = torch_internals.is_any_autocast_enabled
_deterministic_on = torch_internals.deterministic_algorithms
_AUTOCAST_OPS = autocast.AUTOCAST_OPS
_runs_its_body = autocast_bodies.runs_its_body
_casting_inner_ops = inner_autocast.casting_inner_ops
_DEVICE_BRANCHES = frozenset(device_branches.CALLS)
_WIDENED = reduced_kernels.WIDENED
_NODE_STREAMS = backward_streams.CHECKED  # whether autograd's nodes need their streams noted
_CONSTRUCTORS = device_constructors()
# The factories that take numbers (sizes, bounds, a fill value) where a 0-dim tensor may stand:
# its value is read on the host, and the result made where `device` says.
_FACTORIES_OF_NUMBERS = frozenset(f for f in _CONSTRUCTORS if f.__name__ not in (
    "tensor", "as_tensor", "asarray", "nested_tensor") and not f.__name__.startswith("sparse_"))
_TorchGenerator = torch_internals.Generator
_MethodWrapper = types.MethodWrapperType
_descriptor = torch_internals.TensorBase.__dict__.__getitem__

# Calls that take host tensors beside device tensors on CUDA too: copies, indexing (index tensors
# and assigned values may live on the host), and calls that read only another tensor's size.
_MIXING_ALLOWED = frozenset({
    Tensor.copy_, Tensor.__getitem__, Tensor.__setitem__, Tensor.index_put_, Tensor.index_put,
    torch.index_put, Tensor.set_, Tensor.expand_as, Tensor.view_as, Tensor.reshape_as,
    Tensor.resize_as_, Tensor.new_tensor, torch.tensor_split, Tensor.tensor_split,
    torch.nn.functional.ctc_loss, torch.as_tensor, torch.tensor, torch.asarray,
    # Packed sequences: device data, host batch sizes (CUDA wants them there).
    *host_outputs.CALLS,
    *(getattr(torch_internals.packed_rnn_calls, name)
      for name in ("lstm", "gru", "rnn_tanh", "rnn_relu")),
    # No computation: metadata questions and bookkeeping.
    torch_internals.has_compatible_shallow_copy_type, torch.is_same_size, Tensor.is_set_to,
    Tensor.__deepcopy__, Tensor.__setstate__, Tensor.__reduce_ex__,
})
_host_outputs_of = host_outputs.of_call
_FROM_HOST_DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray})
# Factories of sparse tensors from their parts (aten's own takes `layout=` too)
_SPARSE_FACTORIES = frozenset(f for f in (
    torch.sparse_coo_tensor, torch.sparse_csr_tensor, torch.sparse_csc_tensor,
    torch.sparse_bsr_tensor, torch.sparse_bsc_tensor, torch.sparse_compressed_tensor,
    getattr(torch, "_sparse_coo_tensor_unsafe", None),
    getattr(torch, "_sparse_compressed_tensor_unsafe", None)) if f is not None)
_CUDA = torch.device("cuda")
_SDPA = torch.nn.functional.scaled_dot_product_attention
_CausalBias = torch.nn.attention.bias.CausalBias


def _attention_mask(args: tuple, kwargs: dict):
    return args[3] if len(args) > 3 else kwargs.get("attn_mask")


def _bias_dispatches_itself(func, args: tuple, kwargs: dict) -> bool:
    """SDPA given torch's CausalBias: on CUDA the bias's `__torch_function__` takes the call
    before autocast sees it (kernels.causal_bias_attention)."""
    return func is _SDPA and isinstance(_attention_mask(args, kwargs), _CausalBias)


class Placement(TorchFunctionMode):
    def __init__(self, state) -> None:
        super().__init__()
        self.state = state
        self.memory = state.memory
        self._several_devices = state.properties.count > 1
        # A call dynamo leaves out of the graph (a graph break) and runs as eager code: made
        # at entry, as dynamo's own code is imported there (compiled_graphs.compile_patches).
        self._outside_the_graph = torch.compiler.disable(_call)
        self._getters = {
            _descriptor("device"): self._get_device,
            _descriptor("is_cuda"): self._get_is_cuda,
            _descriptor("is_cpu"): self._get_is_cpu,
            _descriptor("grad"): self._get_grad,
        }
        self._calls = {
            **transfers.handlers(self),
            Tensor.get_device: self._get_device_index,
            Tensor.type: self._type,
            # Parses a device argument without making a tensor (Module.to): the device stays.
            torch_internals.nn_parse_to: lambda func, args, kwargs: func(*args, **kwargs),
            **dict.fromkeys(norm_statistics.CALLS, self._norm_statistics),
            torch.nn.functional.layer_norm: self._layer_norm,
            torch.layer_norm: self._layer_norm, torch.native_layer_norm: self._layer_norm,
            torch.ops.aten.native_layer_norm.default: self._layer_norm,
            torch.ops.aten.native_layer_norm: self._layer_norm,
            Tensor.__repr__: self._repr,
            torch.device: _device_of_index,
            **{func: self._cuda_kernel for func in kernels.REPLACEMENTS},
            **dict.fromkeys(missing_kernels.CPU_ONLY, self._cpu_only),
            **dict.fromkeys(sdpa_backends.FUSED_OPS, self._fused_attention_op),
            **dict.fromkeys(host_arguments.CALLS, self._host_argument),
            **{func: self._blas_call for func in blas_workspaces.MATMUL_FUNCS},
            **dict.fromkeys(fft_plans.FFT_KINDS, self._fft_call),
            **dict.fromkeys(_FROM_HOST_DATA, array_interface.handler(self)),
            **compiled_rng.hop_handlers(self),
            **dict.fromkeys(device_branches.CALLS, self._device_branch),
        }

    # --- the hot path ------------------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # The hot path: one Python call per torch call, so the checks are inlined.
        if _compiling():
            # Dynamo traces this method: the graph gets the call with the device named as the
            # cpu its tensors live on, so inductor writes cpu code (compiled.py runs the graph on
            # the device and marks its outputs).
            return _traced_on_host(func, args, kwargs or {}, self._outside_the_graph)
        if type(func) is _MethodWrapper:  # a property: x.shape, x.device, x.grad = g, ...
            getter = self._getters.get(func.__self__)
            if getter is None or func.__name__ != "__get__":
                return func(*args)
            return getter(func, args[0])
        if self.state.capture is not None:
            # Another thread's call on a capturing stream is captured (capture_threads.py).
            modes = capture_modes_for_this_thread(self.state)
            if modes:
                with joined(modes):
                    return self.__torch_function__(func, types, args, kwargs)
        # asked once per call: the cheap question first (no device type to parse)
        autocasting = _any_autocast_on() and _autocast_on("cuda")
        if autocasting and func not in _AUTOCAST_OPS and _runs_its_body(func) \
                and (func not in self._calls or func in _DEVICE_BRANCHES) \
                and func not in _MIXING_ALLOWED and not self.state.autocast_bodies.pending() \
                and any(is_device_memory(t) for t in autocast.tensors(args, kwargs or {})):
            # CUDA casts each op inside a Python composite (autocast_bodies.py)
            if func in _DEVICE_BRANCHES and _deterministic_on():
                args = device_branches.seen_as_device(args)
            with self.state.autocast_bodies.next_check_passes(), self:
                return func(*args, **(kwargs or {}))
        if autocasting:
            if func not in _AUTOCAST_OPS:
                # CUDA casts the ops inside a composite too (inner_autocast.py)
                with _casting_inner_ops():
                    return self._placed(func, args, kwargs)
            if not _bias_dispatches_itself(func, args, kwargs or {}):
                args, kwargs = autocast.cast(func, args, kwargs or {}, is_device_memory,
                                             self._cast, self.state.autocast_cache)
        return self._placed(func, args, kwargs)

    def _placed(self, func, args, kwargs):
        """The hot path's tail: the call's handler, or the generic rule."""
        handler = self._calls.get(func)
        if handler is None:
            out = self._generic(func, args, {} if kwargs is None else kwargs)
        elif self._several_devices:
            out = self._on_its_device(handler, func, args, kwargs or {})
        else:
            out = handler(func, args, kwargs or {})
        if _NODE_STREAMS and out is not None and torch.is_grad_enabled():
            # autograd's nodes keep the stream current at their making (backward_streams.py)
            backward_streams.stamp(out, self.state.streams.current)
        return out

    def _generic(self, func, args, kwargs):
        """The rule for every call without a handler of its own (see the module docstring)."""
        if func in _CONSTRUCTORS and kwargs.get("device") is None:
            default = _default_device()
            if default is None and self.state.legacy_default_on_device:
                default = _CUDA
            if default is not None and default.type == "cuda":
                kwargs = {**kwargs, "device": default}
        device_in = False
        host = None
        # The marks of the positional tensors, in order: the call runner's signature reads each
        # tensor's mark too, and is handed them (call_patterns.signature).
        scanned = []
        try:
            # memory_mark, not is_device_memory: one Python call per tensor, not two
            for a in args:
                if isinstance(a, Tensor):
                    mark = memory_mark(a)
                    scanned.append(mark)
                    if mark is DEVICE:
                        device_in = True
                    elif host is None and a.dim():
                        host = a
                elif type(a) is list or type(a) is tuple:
                    for b in a:
                        if isinstance(b, Tensor):
                            if memory_mark(b) is DEVICE:
                                device_in = True
                            elif host is None and b.dim():
                                host = b
            for v in kwargs.values():
                if isinstance(v, Tensor):
                    if memory_mark(v) is DEVICE:
                        device_in = True
                    elif host is None and v.dim():
                        host = v
        except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
            device_in, host = _scan(args, kwargs)
            scanned = None
        scanned_args = args
        named_device = pinned = False
        index = 0  # the device of the call, with several emulated devices
        if kwargs:
            target = kwargs.get("device")
            if target is not None and names_cuda(target):
                index = self._check_index(target)
                kwargs = {**kwargs, "device": CPU}
                named_device = True
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
                pinned = True
        if device_in and not named_device and func in _FACTORIES_OF_NUMBERS \
                and kwargs.get("out") is None:
            # `torch.arange(n)` of a 0-dim device `n`: CUDA reads it on the host (`.item()`, a
            # sync; a capture refuses it at the read) and makes a host tensor unless `device` names
            # one. The device tensors read are no device call of their own: they are read here,
            # so the op below gets numbers (the stream tracking would take a call of device
            # tensors for a device op and make its result device memory).
            self.state.flag_host_sync()
            args, kwargs = _numbers_read(args), dict(zip(kwargs, _numbers_read(kwargs.values())))
            device_in = False
        if not (device_in or named_device):
            if kwargs and isinstance(kwargs.get("generator"), DeviceGenerator):
                raise device_generator_on_host_error()
            memory = self.memory
            if memory.call_on_device:
                # A host call made inside a device call's own run (the code a `backward()` runs:
                # a checkpointed region recomputed, a hook) is a host call: what it makes is
                # host memory, for the modes that read the flag too (a user's dispatch mode,
                # the stream tracking), as it was for its forward
                memory.call_on_device = False
                try:
                    out = func(*args, **kwargs)
                finally:
                    memory.call_on_device = True
            else:
                out = func(*args, **kwargs)
            if pinned:
                self._mark(out, PINNED)
            return out
        state = self.state
        capturing = state.capturing()  # asked once: nothing below starts or ends a capture
        if self._several_devices and device_in and not named_device:
            index = (device_indices.first_index(args, kwargs) if func in _MIXING_ALLOWED
                     else device_indices.common_index(args, kwargs) or 0)
        if host is not None and device_in and func not in _MIXING_ALLOWED:
            first = f"cuda:{index}" if _first_is_device(args, kwargs) else "cpu"
            raise mixed_devices_error(first, "cpu" if first != "cpu" else f"cuda:{index}")
        if kwargs and isinstance(kwargs.get("generator"), _TorchGenerator):
            if not isinstance(kwargs["generator"], DeviceGenerator):
                # A cpu generator cannot drive CUDA's random kernels; on a CPU build it would, silently.
                raise host_generator_error()
        if named_device or capturing:  # the checks below ask one or the other first
            if named_device and func in _FROM_HOST_DATA and capturing:
                transfers.refuse_host_data(state, func, args)
            if named_device and func in _FROM_HOST_DATA and not (
                    args and isinstance(args[0], Tensor) and is_device_memory(args[0])):
                state.flag_host_sync()  # host data copied to the device, blocking
            if func in transfers.INDEXING and device_in and capturing \
                    and is_device_memory(args[0]):
                transfers.refuse_host_indices(state, func, args)
            if func is Tensor.new_tensor and capturing and (
                    named_device or (device_in and kwargs.get("device") is None)):
                # A device tensor's new_tensor(data) copies host data to the device, as
                # torch.tensor.
                transfers.refuse_host_data(state, func, args[1:])
            if capturing and _any_sparse(args, kwargs):
                from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice

                raise UnsupportedOnEmulatedDevice(
                    f"{getattr(func, '__name__', func)} on a sparse tensor inside a CUDA graph "
                    f"capture: the emulated device holds sparse tensors eagerly, but its graphs "
                    f"record dense memory only; capture the dense form (`.to_dense()`), or run "
                    f"this on a GPU")
        if named_device and kwargs.get("layout") in SPARSE_LAYOUTS or func in _SPARSE_FACTORIES:
            # CUDA copies a sparse factory's host parts to the device; on the cpu the result
            # would share their memory, and marking it would make the caller's tensors device memory
            args = tuple(a.clone() if isinstance(a, Tensor) and not is_device_memory(a) else a
                         for a in args)
        if named_device:
            asked = requested_bytes(func, args, kwargs)
            if asked:
                state.check_capacity(asked, index)
        # PyTorch runs the call under a device guard for its tensors' device: its kernel goes to
        # that device's current stream (outside a capture made on another device's stream).
        guarded = self._several_devices and index != state.current_index
        if guarded:
            caller_index, state.current_index = state.current_index, index
        try:
            # What the call makes inside (a composite's own factories: SDPA's causal mask) is
            # device memory too; the recorder asks this flag for calls without device tensors.
            memory = self.memory
            flags = memory.call_flags  # memory.call_on_device, without its property's calls
            previous, flags.call_on_device = flags.call_on_device, True
            made_on_host = _host_outputs_of(func)
            if made_on_host is not None:
                previous_host, flags.host_outputs = flags.host_outputs, made_on_host
            keep_modes_reachable()  # stream tracking, if an inference_mode block dropped its keys
            runner = state.call_runner
            if state.kernel_log is not None:  # a profiler records CUDA activity
                runner = state.kernel_log.runner(runner)
                scanned = None  # its bracketing runner takes the call alone
            elif args is not scanned_args:  # a sparse factory's parts, copied above
                scanned = None
            # A call that may draw meets its random aten ops, which draw from the device's
            # generators (device_draws.py); a capture records them to draw at replay instead.
            draws = (EagerDraws(state.draws, index)
                     if may_draw(func, kwargs) and not capturing and not recorded()
                     else None)
            if draws is not None:
                draws.__enter__()
            try:
                # a kernel the CPU lacks for the reduced dtypes, whichever runner takes the call
                widen = func in _WIDENED and reduced_kernels.needs_widening(func, args, kwargs)
                if draws is not None and is_random(func) and dispatch_modes_off():
                    out = (reduced_kernels.widened(functools.partial(_drawn, draws, func), func)(
                        *args, **kwargs) if widen else draws.draw_call(func, args, kwargs))
                else:
                    if widen:
                        func = reduced_kernels.widened(func)
                    if _deterministic_on():  # CUDA's kernels without a deterministic form
                        out = deterministic_alerts.call_alerting(
                            self._call_flagging_syncs(runner), func, args, kwargs)
                    elif self.state.sync_debug_mode:
                        out = self._call_flagging_syncs(runner)(func, args, kwargs)
                    elif runner is None:
                        out = func(*args, **kwargs)
                    elif scanned is None:
                        out = runner(func, args, kwargs)
                    else:
                        out = runner(func, args, kwargs, scanned)
            except (IndexError, RuntimeError) as error:
                if "can't allocate memory" in str(error):
                    raise self.state.out_of_memory(error) from error
                if is_index_out_of_bounds(error) and not _host_checked_index(func, args, error):
                    raise eager_device_assert_error(
                        error, getattr(func, "__name__", str(func))) from error
                raise
            finally:
                flags.call_on_device = previous
                if made_on_host is not None:
                    flags.host_outputs = previous_host
                if draws is not None:
                    draws.__exit__(None, None, None)
            if isinstance(out, Tensor):
                if type(out) is not Tensor and is_wrapper_subclass(out):
                    memory.mark_device(out)  # a wrapper subclass: the tensors it holds
                else:
                    try:
                        storage = out.untyped_storage()
                        if memory_mark(storage) is not DEVICE:
                            memory.adopt(storage)
                    except CaptureError:  # the allocation refused (a new segment, unsafe_calls.py)
                        raise
                    except (RuntimeError, NotImplementedError):  # no storage of its own: vmap's
                        memory.mark_device(out)
            elif out is not None:
                self._mark(host_outputs.device_outputs(out, made_on_host), DEVICE)
            if index:
                device_indices.set_index(out, index)
            if self.state.observers:
                self.state.notify_op(func, args, kwargs, out)
            return out
        finally:
            if guarded:
                state.current_index = caller_index

    def _call_flagging_syncs(self, runner):
        """The device call's runner, its syncs flagged while the sync debug mode is on."""
        call, mode = runner or _call, self.state.sync_debug_mode
        if not mode:
            return call
        return lambda func, args, kwargs: call_flagging_syncs(mode, call, func, args, kwargs)

    def _on_its_device(self, handler, func, args, kwargs):
        """A handled call (a copy, a host read) under the device guard of its device tensors."""
        index = (device_indices.copy_index(args, kwargs) if func is Tensor.copy_
                 else device_indices.guard_index(args, kwargs))
        state = self.state
        if index is None or index == state.current_index:
            return handler(func, args, kwargs)
        if func is Tensor.to or func is Tensor.cuda:
            # ATen's _to_copy takes no guard of its input's device: a target without an index
            # ("cuda", `.cuda()`) is the caller's current device
            args, kwargs = _target_on_device(func, args, kwargs, state.current_index)
        with state.device_guard(index):
            return handler(func, args, kwargs)

    def _cast(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        """An autocast cast: a device op of its own, as CUDA's cast kernel is."""
        return self.__torch_function__(Tensor.to, (Tensor,), (t, dtype), {})

    def _device_branch(self, func, args, kwargs):
        """A torch function whose Python body branches on its input's device (device_branches.py):
        under the deterministic mode, where the branch differs, its body sees the device's answers."""
        if _deterministic_on() and args and isinstance(args[0], Tensor) \
                and is_device_memory(args[0]):
            args = device_branches.seen_as_device(args)
        return self._generic(func, args, kwargs)

    # --- marking -----------------------------------------------------------------------------

    def _mark(self, out, kind: str) -> None:
        mark = self.memory.mark_device if kind == DEVICE else self.memory.mark_pinned
        if isinstance(out, Tensor):
            mark(out)
        elif isinstance(out, (tuple, list)):
            for o in out:
                if isinstance(o, Tensor):
                    mark(o)

    def _check_index(self, target) -> int:
        state = self.state
        return cuda_index(target, state.current_index, state.properties.count)

    # --- getters -----------------------------------------------------------------------------

    def _get_device(self, func, t: Tensor):
        if not is_device_memory(t):
            return func(t)
        return self.state.device_object(device_indices.index_of(t) if self._several_devices else 0)

    def _get_is_cuda(self, func, t: Tensor) -> bool:
        return is_device_memory(t)

    def _get_is_cpu(self, func, t: Tensor) -> bool:
        return not is_device_memory(t) and func(t)

    def _get_grad(self, func, t: Tensor):
        grad = func(t)
        # The autograd engine made it without a torch call this mode could see.
        if grad is not None and is_device_memory(t):
            self.memory.mark_device(grad)
        return grad

    def _get_device_index(self, func, args, kwargs) -> int:
        if not is_device_memory(args[0]):
            return func(*args, **kwargs)
        return device_indices.index_of(args[0]) if self._several_devices else 0

    def _type(self, func, args, kwargs):
        """`x.type()` names CUDA's legacy type (`torch.cuda.FloatTensor`) for a device tensor;
        `x.type(T)` converts as on CUDA, to the device for a `torch.cuda.*` type, to the host for
        another (a CPU build cannot make a `torch.cuda.*` tensor at all)."""
        t = args[0]
        wanted = args[1] if len(args) > 1 else kwargs.get("dtype")
        if wanted is None:
            name = func(t)
            return name.replace("torch.", "torch.cuda.", 1) if is_device_memory(t) else name
        if isinstance(wanted, torch.dtype):
            return self._generic(func, args, kwargs)  # the dtype changes, the device stays
        name = wanted if isinstance(wanted, str) else f"{wanted.__module__}.{wanted.__name__}"
        module, _, type_name = name.rpartition(".")
        legacy = getattr({"torch.cuda": torch.cuda, "torch": torch}.get(module), type_name, None)
        if not isinstance(getattr(legacy, "dtype", None), torch.dtype):
            return func(*args, **kwargs)  # torch's own answer, errors included
        if module == "torch" and not is_device_memory(t):
            # By name: torch's C++ takes its own type objects, not legacy_types.py's classes.
            rest = {k: v for k, v in kwargs.items() if k != "dtype"}
            return func(t, name, *args[2:], **rest)
        to = {"device": "cuda" if module == "torch.cuda" else "cpu", "dtype": legacy.dtype,
              "non_blocking": bool(args[2] if len(args) > 2 else kwargs.get("non_blocking"))}
        return self.__torch_function__(Tensor.to, (Tensor,), (t,), to)

    # --- calls that need more than the generic rule ------------------------------------------

    def _layer_norm(self, func, args, kwargs):
        """CUDA's layer norm kernel takes weight and bias in the input's dtype; the cpu kernel
        also takes float32 parameters for reduced-precision input."""
        x = args[0] if args else kwargs["input"]
        if isinstance(x, Tensor) and is_device_memory(x):
            for i, name in ((2, "weight"), (3, "bias")):
                p = args[i] if len(args) > i else kwargs.get(name)
                if isinstance(p, Tensor) and p.dtype != x.dtype:
                    text = (f"expected scalar type {scalar_type_name(x.dtype)} but found "
                            f"{scalar_type_name(p.dtype)}")
                    if not self.state.capturing():
                        raise RuntimeError(text)
                    self.state.refuse(CaptureError(f"{text} (CUDA's layer norm kernel takes {name} "
                                                   f"in the input's dtype)",
                                                   op="aten.native_layer_norm.default"))
        if func in norm_statistics.CALLS:
            return self._norm_statistics(func, args, kwargs)
        return self._generic(func, args, kwargs)

    def _norm_statistics(self, func, args, kwargs):
        """A batch or layer norm: its statistics in CUDA's dtype for device input
        (norm_statistics.py)."""
        out = self._generic(func, args, kwargs)
        x = args[0] if args else kwargs.get("input")
        if isinstance(x, Tensor) and is_device_memory(x):
            return norm_statistics.in_float32(x, out, self._cast)
        return out

    def _cuda_kernel(self, func, args, kwargs):
        """A kernel CUDA has and the cpu lacks (kernels.py), for device tensors only: a host call
        keeps the cpu's answer, errors included."""
        if _bias_dispatches_itself(func, args, kwargs) and _first_is_device(args, kwargs):
            # torch's bias dispatches itself (its __torch_function__), past this mode
            with self:
                return kernels.causal_bias_attention(*args, **kwargs)
        if _first_is_device(args, kwargs) and _scan(args, kwargs)[0]:
            return self._generic(kernels.REPLACEMENTS[func], args, kwargs)
        return self._generic(func, args, kwargs)

    def _cpu_only(self, func, args, kwargs):
        """A call CUDA has no kernel for (missing_kernels.py): refused for device tensors, as the
        dispatcher refuses it on a GPU; a host call keeps the cpu's answer."""
        if _scan(args, kwargs)[0] and missing_kernels.refused(func, args, kwargs):
            raise missing_kernels.no_cuda_kernel(func, args, kwargs)
        return self._generic(func, args, kwargs)

    def _fused_attention_op(self, func, args, kwargs):
        """An op of CUDA's fused attention kernels (sdpa_backends.py): refused by name for device
        tensors; a host call keeps the cpu's answer."""
        if _scan(args, kwargs)[0]:
            raise sdpa_backends.fused_op_refused(func)
        return self._generic(func, args, kwargs)

    def _host_argument(self, func, args, kwargs):
        """A call whose tensor argument CUDA wants on the host (host_arguments.py): refused for a
        device tensor in CUDA's words, as CUDA checks it before reading it."""
        value = host_arguments.argument(func, args, kwargs)
        if isinstance(value, Tensor) and is_device_memory(value):
            index = device_indices.guard_index((value,), {}) or 0
            raise host_arguments.refusal(func, value, f"cuda:{index}")
        return self._generic(func, args, kwargs)

    def _blas_call(self, func, args, kwargs):
        """A call that reaches cuBLAS on CUDA: on the device, its stream's workspace is made
        first if this thread has none there (blas_workspaces.py). An empty operand makes no BLAS
        call, as CUDA's kernels return early for it."""
        run = self._cuda_kernel if func in kernels.REPLACEMENTS else self._generic
        out = run(func, args, kwargs)
        if isinstance(out, Tensor) and is_device_memory(out) and out.numel() and all(
                a.numel() for a in (*args, *kwargs.values()) if isinstance(a, Tensor)):
            self.state.blas_workspaces.note_call(self.state.streams.current(), _call_name(func))
        return out

    def _fft_call(self, func, args, kwargs):
        """An FFT, which on CUDA looks its cuFFT plan up in its device's cache, making and caching
        one it lacks (fft_plans.py). CUDA's half transforms run widened (half_ffts.py)."""
        if func in half_ffts.CALLS and half_ffts.needs_widening(func, args, kwargs) \
                and _scan(args, kwargs)[0]:
            out = self._generic(half_ffts.widened(func), args, kwargs)
        else:
            out = self._generic(func, args, kwargs)
        index = device_indices.guard_index(args, kwargs)
        key = plan_key(func, args, kwargs)
        if index is not None and key is not None:
            self.state.fft_plans.note_plan(index, key)
        return out

    def _repr(self, func, args, kwargs) -> str:
        if not is_device_memory(args[0]):
            return func(*args, **kwargs)
        with self:  # torch's printer asks `.device`, which this mode answers
            return torch_internals.tensor_str(args[0], **kwargs)


def _drawn(draws, func, *args, **kwargs):
    return draws.draw_call(func, args, kwargs)


def _call(func, args: tuple, kwargs: dict):
    return func(*args, **kwargs)


_HOST_INDEX_CHECK = re.compile(r"index (-?\d+) is out of bounds for dimension \d+ with size \d+")


def _host_checked_index(func, args: tuple, error: BaseException) -> bool:
    """Whether `error` is the host's check of a Python integer index (`x[10]`, `x[0, 10] = v`):
    ATen's applySlicing raises it before any kernel runs, on CUDA too, as an IndexError with the
    text the cpu kernel's check also uses. Index tensors and lists are checked on the device."""
    if func is not Tensor.__getitem__ and func is not Tensor.__setitem__ or len(args) < 2:
        return False
    found = _HOST_INDEX_CHECK.search(str(error))
    if found is None:
        return False
    value = int(found.group(1))
    parts = args[1] if type(args[1]) is tuple else (args[1],)
    return any(_integer(p) == value for p in parts)


def _integer(part) -> int | None:
    """An index part Python hands ATen as an integer (an int, a numpy integer), else None."""
    if isinstance(part, (Tensor, bool, list)) or not hasattr(type(part), "__index__"):
        return None
    return part.__index__()


def _device_of_index(func, args, kwargs):
    """`torch.device(0)`: a CUDA build reads a bare index as the accelerator's (cuda:0), a CPU
    build as none's (nn.DataParallel's backward names its devices so)."""
    if len(args) == 1 and not kwargs and isinstance(args[0], int) and not isinstance(args[0], bool):
        return func("cuda", args[0])
    return func(*args, **kwargs)


def _call_name(func) -> str:
    """A torch call as a user writes it: `torch.mm`, `Tensor.mm`, `F.linear`."""
    name = func.__name__
    if getattr(func, "__module__", None) is None:
        return f"Tensor.{name}"
    if func.__module__ == "torch._C._nn":
        return f"torch.nn.functional.{name}"
    if name.startswith("linalg_"):
        return f"torch.linalg.{name[len('linalg_'):]}"
    return f"torch.{name}"


def _indexless_cuda(device) -> bool:
    return (isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"
            and torch.device(device).index is None)


def _target_on_device(func, args: tuple, kwargs: dict, index: int) -> tuple[tuple, dict]:
    """`Tensor.to`'s or `Tensor.cuda`'s arguments with a cuda target lacking an index given
    `index`."""
    target = torch.device("cuda", index)
    if func is Tensor.cuda:
        if len(args) > 1:
            if args[1] is None or _indexless_cuda(args[1]):
                return (args[0], target, *args[2:]), kwargs
            return args, kwargs
        if kwargs.get("device") is None or _indexless_cuda(kwargs["device"]):
            return args, {**kwargs, "device": target}
        return args, kwargs
    if _indexless_cuda(kwargs.get("device")):
        return args, {**kwargs, "device": target}
    return (args[0], *(target if _indexless_cuda(a) else a for a in args[1:])), kwargs


def _traced_on_host(func, args: tuple, kwargs: dict, outside_the_graph):
    """The call as dynamo records it: on the cpu, a transfer or a factory naming cuda wrapped in
    compiled_devices' marker of where its result lives (what the graph's outputs are made of when
    it runs). A factory naming cuda and asked for a gradient is made by `outside_the_graph`:
    dynamo breaks the graph at such a factory and runs it eagerly, on CUDA a leaf; traced on the
    cpu, the break would fall inside this call (with nested graph breaks, PyTorch's test cases'
    setting), and the marker after it would be a graph of its own, returning a non-leaf."""
    if func is Tensor.cuda:
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        return to_device(_moved(args[0], to_device=True), non_blocking)
    if func is Tensor.cpu:
        return to_host(_moved(args[0], to_device=False))
    if isinstance(func, torch_internals.OpOverload) and any(_names_cuda(a) for a in args):
        return _user_op_traced_on_host(func, args, kwargs)
    target = kwargs.get("device")
    if func is Tensor.to:
        if len(args) > 1 and type(args[1]) is int:  # `x.to(0)`: an index names the accelerator
            args = (args[0], torch.device("cuda", args[1]), *args[2:])
        target = next((a for a in args[1:] if isinstance(a, (str, torch.device))), target)
        if target is None or (isinstance(target, (str, torch.device)) and
                              torch.device(target).type not in ("cuda", "cpu")):
            return func(*args, **kwargs)
        non_blocking = bool(kwargs.get("non_blocking", False) or
                            any(a is True for a in args[1:]))
        args = tuple(CPU if isinstance(a, (str, torch.device)) and names_cuda(a) else a
                     for a in args)
        kwargs = {**kwargs, "device": CPU} if "device" in kwargs else kwargs
        if names_cuda(target) or not _device_object(target):
            kwargs = _copy_if_moved(args[0], kwargs, to_device=names_cuda(target))
        out = func(*args, **kwargs)
        if names_cuda(target):
            return to_device(out, non_blocking)
        # a device object reading cpu: most often a traced tensor's `.device` (compiled_devices)
        return (to_traced_device if _device_object(target) else to_host)(out, non_blocking)
    if target is not None and names_cuda(target):
        if kwargs.get("requires_grad"):
            return outside_the_graph(func, args, kwargs)
        return to_device(func(*args, **{**kwargs, "device": CPU}))
    if _device_object(target):
        return to_traced_device(func(*args, **kwargs))
    return func(*args, **kwargs)


def _moved(t: Tensor, *, to_device: bool) -> Tensor:
    """`t` as a transfer to the device (`to_device`) or to the host hands it over: the tensor
    itself where it is there already, as on CUDA, else a copy. Traced on the cpu, the transfer
    is a no-op that returns the same tensor, so an in-place op on the result would write its
    source (transformers' StaticLayer moves its host `cumulative_length` to the device inside the
    compiled prefill and bumps it with `add_`). `t.is_cuda` is read in the trace, where it
    answers for the memory `t` lives in on CUDA (compiled_device_reads.py). A `non_blocking`
    transfer is a copy too, as CUDA's is: inside a stream context it is one of the nodes whose
    stream inductor no longer sees on the emulated device (compiled_stream_nodes.py)."""
    if t.is_cuda == to_device:
        return t
    return t.to(CPU, copy=True)


def _copy_if_moved(source: Tensor, kwargs: dict, *, to_device: bool) -> dict:
    """`Tensor.to`'s keywords asking for a copy where the call moves `source` between host and
    device memory (see `_moved`)."""
    if kwargs.get("copy") or source.is_cuda == to_device:
        return kwargs
    return {**kwargs, "copy": True}


def _numbers_read(values) -> tuple:
    """`values` with each 0-dim device tensor (also inside a list or tuple) read on the host:
    `.item()`, a sync, as CUDA's factories read a number given as a device tensor."""
    def read(v):
        if isinstance(v, Tensor) and v.dim() == 0 and memory_mark(v) is DEVICE:
            return v.item()
        if type(v) is list or type(v) is tuple:
            return type(v)(read(b) for b in v)
        return v
    return tuple(read(v) for v in values)


def _any_sparse(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(t, Tensor) and t.layout in SPARSE_LAYOUTS
               for a in (*args, *kwargs.values())
               for t in (a if type(a) in (list, tuple) else (a,)))


def _device_object(target) -> bool:
    """A `torch.device` (not the string "cpu") naming the cpu, as a traced tensor's `.device` is."""
    return isinstance(target, torch.device) and target.type == "cpu"


def _user_op_traced_on_host(func, args: tuple, kwargs: dict):
    """An op given a device naming cuda as an argument (a user's `create_mask(n, "cuda")`; torch's
    factories take it by keyword, handled below): traced with the cpu the device's tensors are,
    its tensor result wrapped in the marker of device memory, as a factory naming cuda is. Dynamo
    traces this, so the check reads only the arguments (an op's schema is opaque to it)."""
    args = tuple(CPU if _names_cuda(a) else a for a in args)
    out = func(*args, **kwargs)
    return to_device(out) if isinstance(out, Tensor) else out


def _names_cuda(a) -> bool:
    return isinstance(a, (str, torch.device)) and names_cuda(a)


def _default_device() -> torch.device | None:
    """The device of `torch.set_default_device` / `with torch.device(...)`: a DeviceContext, which
    torch keeps at the bottom of the mode stack, below this mode, so it would name the device only
    after this mode has placed the call."""
    if torch_internals.len_torch_function_stack() == 0:
        return None
    bottom = torch_internals.get_function_stack_at(0)
    return bottom.device if isinstance(bottom, DeviceContext) else None


def _scan(args: tuple, kwargs: dict) -> tuple[bool, Tensor | None]:
    """The hot path's scan, for tensors that may lack a storage: (any device tensor, the first
    host tensor of one or more dimensions)."""
    device_in, host = False, None
    for a in (*args, *kwargs.values()):
        for t in (a if type(a) in (list, tuple) else (a,)):
            if isinstance(t, Tensor):
                if is_device_memory(t):
                    device_in = True
                elif host is None and t.dim():
                    host = t
    return device_in, host


def _first_is_device(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            return is_device_memory(a)
        if type(a) in (list, tuple):
            for b in a:
                if isinstance(b, Tensor):
                    return is_device_memory(b)
    return True
