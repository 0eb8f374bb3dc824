"""The `torch.cuda` Python API on the emulated device: what `emulate_cuda()` puts in place of torch's
functions for its duration (`patches(state)`), each answering from the device's state.

Memory statistics come from the model of CUDA's caching allocator that the device's allocations and
frees drive (caching_allocator.py), one per device as CUDA keeps them: `memory_stats(i)` has the
native allocator's keys, `memory_allocated`/`memory_reserved` and their `max_*` read its
`allocated_bytes.all` and `reserved_bytes.all`, `empty_cache()` gives back every device's wholly
free segments, and `mem_get_info` counts the reserved bytes as used. Random state: each emulated
device has default generators of its own (default_generators.py): `torch.cuda.manual_seed`/`seed`
reseed the current device's, the `_all` forms every device's, `get_rng_state`/`set_rng_state`
read and write CUDA's 16-byte state, and the cpu's generator is apart (`torch.manual_seed` seeds
both, through `manual_seed_all`).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.accelerator
import torch.backends.cudnn
import torch.cuda.graphs
import torch.cuda.memory
import torch.cuda.nvtx
import torch.cuda.random
import torch.cuda.streams
import torch.serialization

from harness import torch_internals
from harness.emulation.accelerator_calls import (accelerator_of_the_build, device_module_class,
                                                 device_capability_refused, taking_a_device)
from harness.emulation.accelerator_calls import patches as accelerator_call_patches
from harness.emulation.accelerator_streams import (accelerator_current_stream,
                                                   accelerator_set_stream, dynamo_builds_event,
                                                   dynamo_builds_stream, dynamo_current_stream,
                                                   event_class, stream_class)
from harness.emulation.backward import (engine_with_placement, function_outputs_recorded,
                                        implicit_grads_with_placement, materialized_grads_placed,
                                        saved_tensor_hooks_with_placement)
from harness.emulation.autocast import clearing_cache_too
from harness.emulation.compiled_graphs import compile_patches, keep_dynamo_out
from harness.emulation.device_clock import SM_CLOCK_HZ
from harness.emulation.checkpoints import location_tag, restore_location
from harness.emulation.capture_frees import OPTION, parse_settings, unmodelled_settings
from harness.emulation.capture_syncs import refuse_host_sync
from harness.graphs.emulator.watch_refs import install_swaps_past_watches
from harness.emulation.storages import (share_cuda_refused, storage_device,
                                        storage_from_data_pointer, storage_is_shared, storage_new,
                                        storage_resize)
from harness.emulation.generators import generator_class
from harness.emulation.rules import (DeviceIndexError, cuda_index, device_index,
                                     generator_made_in_capture, names_cuda)
from harness.emulation.allocator_tools import UnsupportedOnEmulatedDevice
from harness.emulation.cuda_graph import (CUDAGraph as EmulatedGraphBase, dump_graph_dot,
                                         torch_cuda_graph_class)
from harness.emulation.cudart import EmulatedCudart
from harness.emulation.cuda_streams import (Event, ExternalStream, Stream, as_device_stream,
                                            as_plain_stream)
from harness.emulation.device_memory import is_device_memory
from harness.emulation import fft_plans, sdpa_backends
from harness.emulation.tools import (NvtxRanges, check_memory_fraction,
                                                 check_sync_debug_mode)
from harness.emulation.tunable_ops import PRIVATE_NAMES as TUNABLE_OP_NAMES
from harness.emulation.wrapper_subclasses import legacy_subclass_constructor, make_wrapper_subclass


@dataclass(frozen=True)
class CudaDeviceProperties:
    """What torch's `_CudaDeviceProperties` shows, for one emulated device."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    max_threads_per_multi_processor: int = 2048
    max_threads_per_block: int = 1024
    clock_rate: int = SM_CLOCK_HZ // 1000  # kHz, an H200 SXM's boost clock
    warp_size: int = 32
    regs_per_multiprocessor: int = 65536
    L2_cache_size: int = 52_428_800
    uuid: str = "00000000-0000-0000-0000-000000000000"
    gcnArchName: str = "NVIDIA"
    # sm_90's shared memory: 48 KB a block by default, 227 KB opted in, 228 KB an SM (what kernel
    # libraries size their tiles from); HBM3e at 3201 MHz over 6144 bits.
    shared_memory_per_block: int = 49_152
    shared_memory_per_block_optin: int = 232_448
    shared_memory_per_multiprocessor: int = 233_472
    memory_clock_rate: int = 3_201_000
    memory_bus_width: int = 6144
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
                f"L2_cache_size={self.L2_cache_size // (1024 * 1024)}MB)")


# --- the replacements: each a function of the device's state and torch's own arguments -------
# (Installed bound to the state, each its own function object: torch._dynamo's trace rules refuse
# one object known under two names with different rules.)


def index(state, device: Any = None) -> int:
    """The device index `device` names (the current one for None), checked against the count."""
    return device_index(device, state.current_index, state.properties.count)


def is_available(state) -> bool:
    return True


def device_count(state) -> int:
    return state.properties.count


def current_device(state) -> int:
    state.initialized = True
    return state.current_index


def set_device(state, device: Any) -> None:
    if isinstance(device, int) and device < 0:
        return  # torch: a negative index is a no-op
    state.current_index = index(state, device)
    state.initialized = True


def exchange_device(state, device: int) -> int:
    """`torch._C._cuda_exchangeDevice` (and torch.cuda's and torch.accelerator's forms): makes
    `device` current and answers the previous one; a negative index changes nothing (-1).
    torch's own `torch.cuda.device`, `device_of` and `torch.accelerator.device_index` enter
    through it, so dynamo knows them as it knows them on CUDA (`with torch.cuda.device(i)` in a
    fullgraph compile); an ordinal the device lacks raises CUDA's error at entry, as there."""
    if device is None or device < 0:  # None: a device index dynamo read from a traced tensor
        return -1
    previous = state.current_index
    set_device(state, device)
    return previous


def maybe_exchange_device(state, device: int) -> int:
    """`torch._C._cuda_maybeExchangeDevice`: the previous device back at a context's exit,
    without initializing CUDA where it was not."""
    if device is None or device < 0:
        return -1
    previous = state.current_index
    state.current_index = index(state, device)
    return previous


def dynamo_device_context_patches(state) -> list[tuple[Any, str, Any]]:
    """The staticmethods dynamo's device-context variables hold (`CUDADeviceVariable`,
    `AcceleratorDeviceIndexVariable`: bound to torch's exchange functions when dynamo was
    imported, before the emulation; torch 2.11 reads torch.cuda's at each trace instead), as
    the device's exchanges, where this torch has them."""
    module = torch_internals.lazy_module("dynamo_ctx_manager")
    out = []
    for owner_name in ("CUDADeviceVariable", "AcceleratorDeviceIndexVariable"):
        owner = getattr(module, owner_name, None)
        for name, call in (("_exchange_fn", exchange_device),
                           ("_maybe_exchange_fn", maybe_exchange_device)):
            if owner is None or not isinstance(vars(owner).get(name), staticmethod):
                continue

            def exchange(device: int, _call=call) -> int:
                return _call(state, device)

            out.append((owner, name, staticmethod(exchange)))
    return out


def get_device_properties(state, device: Any = None) -> CudaDeviceProperties:
    try:
        index(state, device)
    except DeviceIndexError as error:
        raise AssertionError(f"Invalid device id ({error})") from None  # torch's own words first
    props = state.properties
    return CudaDeviceProperties(props.name, props.major, props.minor, props.total_memory,
                                props.multi_processor_count)


def get_device_name(state, device: Any = None) -> str:
    return get_device_properties(state, device).name


def get_device_capability(state, device: Any = None) -> tuple[int, int]:
    index(state, device)
    return (state.properties.major, state.properties.minor)


def mem_get_info(state, device: Any = None) -> tuple[int, int]:
    total = state.properties.total_memory
    return (total - state.memory.accounting(index(state, device)).stat("reserved_bytes", "current"),
            total)


def emulated_cudart(state) -> EmulatedCudart:
    return EmulatedCudart(lambda device: mem_get_info(state, device))


def _stat(state, name: str, field: str, device: Any) -> int:
    return state.memory.accounting(index(state, device)).stat(name, field)


def memory_allocated(state, device: Any = None) -> int:
    return _stat(state, "allocated_bytes", "current", device)


def max_memory_allocated(state, device: Any = None) -> int:
    return _stat(state, "allocated_bytes", "peak", device)


def memory_reserved(state, device: Any = None) -> int:
    return _stat(state, "reserved_bytes", "current", device)


def max_memory_reserved(state, device: Any = None) -> int:
    return _stat(state, "reserved_bytes", "peak", device)


def reset_peak_memory_stats(state, device: Any = None) -> None:
    state.memory.accounting(index(state, device)).reset_peak()


def reset_accumulated_memory_stats(state, device: Any = None) -> None:
    state.memory.accounting(index(state, device)).reset_accumulated()


def memory_stats(state, device: Any = None):
    """The native caching allocator's keys (caching_allocator.py: what it models)."""
    return state.memory.accounting(index(state, device)).memory_stats()


def attach_out_of_memory_observer(state, observer: Callable) -> None:
    """`torch._C._cuda_attach_out_of_memory_observer` (PyTorch's memory notes: a snapshot taken
    when an allocation fails): called as CUDA's allocator calls it, before the error is raised."""
    if not callable(observer):
        raise TypeError(f"_cuda_attach_out_of_memory_observer() takes a callable, got "
                        f"{type(observer).__name__}")
    state.oom_observers.append(observer)


def memory_stats_nested(state, device: Any = None) -> dict:
    """`torch._C._cuda_memoryStats` (behind `memory_stats_as_nested_dict`): the statistics as the
    nested dict whose dotted paths are `memory_stats`' keys."""
    nested: dict = {}
    for key, value in memory_stats(state, device).items():
        *path, leaf = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def memory_summary(state, device: Any = None, abbreviated: bool = False) -> str:
    stats = memory_stats(state, device)
    fields = ("current", "peak", "allocated", "freed")
    rows = [f"{'':<36}" + "".join(f"{field:>16}" for field in fields)]
    for name in ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes",
                 "inactive_split_bytes", "allocation", "active", "segment", "inactive_split"):
        for scope in ("all",) if abbreviated else ("all", "small_pool", "large_pool"):
            rows.append(f"{name + '.' + scope:<36}" + "".join(
                f"{stats[f'{name}.{scope}.{field}']:>16}" for field in fields))
    props = state.properties
    return (f"emulated CUDA device {index(state, device)} ({props.name}), caching allocator's "
            f"accounting of {props.total_memory} bytes:\n" + "\n".join(rows))


def empty_cache(state) -> None:
    # CUDA's allocator does nothing while a capture is underway, in any thread (PyTorch #158152;
    # it raised before torch 2.8): cached segments stay reserved until a call after the capture.
    if state.capture is not None:
        return
    for allocator in state.memory.device_accountings():  # every device's cache, as CUDA's
        allocator.empty_cache()
    state.pool_handles.release_cached()


def is_initialized(state) -> bool:
    # A device tensor initializes CUDA as torch.cuda.init() does (torch's C++ side calls
    # _lazy_init when it makes one).
    return state.initialized or state.memory.adopted_any


def init(state) -> None:
    state.initialized = True


def synchronize(state, device: Any = None) -> None:
    waited = index(state, device)  # a device the emulation lacks raises before the sync
    refuse_host_sync(state, "torch.cuda.synchronize()", device=True)
    state.notify_sync("torch.cuda.synchronize", None)
    state.streams.clock.host_waits_for_device(waited)


def current_stream(state, device: Any = None) -> Stream:
    return as_plain_stream(state.streams.current(device))


def default_stream(state, device: Any = None) -> Stream:
    return as_plain_stream(state.streams.default(device))


def stream_context_class(state) -> type:
    """torch.cuda.StreamContext: `stream` is current inside (None: nothing changes)."""
    streams = state.streams

    class StreamContext:
        # Every change goes through `torch.cuda.set_stream`, looked up at each call, as torch's own
        # StreamContext does: a runtime that wraps it to follow the current stream (vLLM keeps
        # its current stream in a thread-local so) sees each stream context.
        def __init__(self, stream: Stream | None) -> None:
            self.stream = stream
            self.idx = -1 if stream is None else stream.device_index
            self._saved: list[Stream] = []
            self._prev_index = state.current_index

        def __enter__(self) -> None:
            if self.stream is None:
                return
            self._prev_index = state.current_index
            self._saved = [streams.current(self._prev_index)]
            if self.stream.device_index != self._prev_index:
                self._saved.append(streams.current(self.stream.device_index))
            torch.cuda.set_stream(self.stream)

        def __exit__(self, *exc) -> None:
            if self.stream is None:
                return
            for saved in reversed(self._saved):
                torch.cuda.set_stream(saved)
            state.current_index = self._prev_index

    return StreamContext


def stream(state, stream: Stream | None):
    return torch.cuda.StreamContext(stream)  # the replaced class: looked up at call time


def is_current_stream_capturing(state) -> bool:
    return state.is_current_stream_capturing()


def graph_pool_handle(state) -> tuple[int, int]:
    return state.pool_handles.user_handle()  # CUDA's MempoolId_t (pool_handles.py)


def sleep(state, cycles: int) -> None:
    if not state.capturing():  # a captured sleep spins at replay (not timed: docs/fidelity.md)
        state.streams.clock.sleep(state.streams.current(), int(cycles))
    if state.observers:
        state.notify_op("torch.cuda._sleep", (cycles,), {}, None)
        state.notify_stream("sleep", state.streams.current(), int(cycles))


def _generator(state, device: Any = None):
    return state.default_generators.generators[index(state, device)]


def accelerator_default_generator(state, device_index: int = -1):
    """The accelerator's default generator of a device (`torch.accelerator.get_rng_state`, and
    inductor's lowering of a graph-safe random op, which clones it): the device's own."""
    return _generator(state, None if device_index is None or device_index < 0 else device_index)


def manual_seed(state, seed: int) -> None:
    _generator(state).manual_seed(int(seed))


def manual_seed_all(state, seed: int) -> None:
    for generator in state.default_generators.generators:
        generator.manual_seed(int(seed))


def seed(state) -> None:
    _generator(state).seed()


def seed_all(state) -> None:
    """torch.cuda.seed_all: a fresh seed for the first device, the same for the others."""
    first, *others = state.default_generators.generators
    first.seed()
    for generator in others:
        generator.manual_seed(first.initial_seed())


def get_rng_state(state, device: Any = "cuda") -> torch.Tensor:
    return _generator(state, device).get_state()


def set_rng_state(state, new_state: torch.Tensor, device: Any = "cuda") -> None:
    _generator(state, device).set_state(new_state)


def get_rng_state_all(state) -> list[torch.Tensor]:
    return [get_rng_state(state, i) for i in range(state.properties.count)]


def set_rng_state_all(state, new_states) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(state, s, i)


def initial_seed(state) -> int:
    return _generator(state).initial_seed()


def is_bf16_supported(state, including_emulation: bool = True) -> bool:
    return True


def get_arch_list(state) -> list[str]:
    return [f"sm_{state.properties.major}{state.properties.minor}"]


# Where the emulated device's cuBLAS handles "live": torch.cuda.current_blas_handle() answers a
# pointer, never 0 (a library handed it checks for null)
_BLAS_HANDLE_BASE = 0x7B0000


def current_blas_handle(state) -> int:
    """at::cuda::getCurrentCUDABlasHandle: the calling thread's handle on the current device,
    reserved (created at its first use, which a capture refuses as a matmul's) and given its
    workspace on the current stream, as the thread's first matmul would."""
    stream = state.streams.current()
    handle = state.blas_workspaces.note_call(stream, "torch.cuda.current_blas_handle()")
    return _BLAS_HANDLE_BASE + (stream.device_index << 12) + handle + 1


def nothing(state, *args, **kwargs) -> None:
    """What has no effect on the emulated device (ipc_collect, the host cache)."""


def set_allocator_settings(state, settings: str) -> None:
    """`torch.cuda.memory._set_allocator_settings`: the options the emulated device acts on
    (capture_frees.py) are kept, and torch's own parser sees the whole string, as on CUDA."""
    torch_internals.set_allocator_settings(settings)  # a CUDA build's own errors come first
    options = parse_settings(settings)
    if OPTION in options:
        state.record_stream_reuse = options[OPTION]
    for key in unmodelled_settings(settings):
        if key not in state.unmodelled_allocator_settings:  # reported once each, not at every call
            state.unmodelled_allocator_settings.add(key)
            warnings.warn(
                f"torch.cuda.memory._set_allocator_settings: the emulated CUDA device's allocator "
                f"model does not act on {key!r}; its memory statistics (reserved bytes, segments) "
                f"follow CUDA's default allocator settings, results are unaffected",
                UserWarning, stacklevel=3)


def clear_cublas_workspaces(state) -> None:
    """Every cuBLAS workspace back to the allocator (blas_workspaces.py); the next BLAS call on
    a stream makes its workspace again."""
    state.blas_workspaces.clear()


def accelerator_is_available(state) -> bool:
    return True


def current_accelerator(state, check_available: bool = False) -> torch.device:
    return torch.device("cuda")


def current_device_index(state) -> int:
    return state.current_index


def cuda_set_stream(state, stream_id: int = 0, device_index: int = 0, device_type: int = 1) -> None:
    """torch._C._cuda_setStream: the stream torch's Python helpers name by id."""
    streams = state.streams
    stream = streams.by_id.get((stream_id, device_index))
    if stream is None:
        stream = streams.default(device_index) if stream_id == 0 else Stream(
            device_index, stream_id=stream_id)
    streams.set_current(stream)
    state.current_index = stream.device_index


def set_sync_debug_mode(state, mode) -> None:
    state.sync_debug_mode = check_sync_debug_mode(mode)


def get_sync_debug_mode(state) -> int:
    return state.sync_debug_mode


def _allocator_index(state, device: Any) -> int | None:
    """The device whose caching allocator a memory-fraction call names: torch's Python passes an
    index it has not checked, and CUDA's allocator checks it against the devices it set up."""
    if device is None:
        return state.current_index
    target = device.index if isinstance(device, torch.device) else device
    if target is None:
        return state.current_index
    return target if 0 <= target < state.properties.count else None


def set_memory_fraction(state, fraction, device: Any = None) -> None:
    target = _allocator_index(state, device)
    if target is None:  # CachingDeviceAllocator.h's assertValidDevice
        raise RuntimeError(f"Invalid device argument {device}: did you call init?")
    state.memory_fractions[target] = check_memory_fraction(fraction)


def get_memory_fraction(state, device: Any = None) -> float:
    target = _allocator_index(state, device)
    if target is None:
        raise RuntimeError(f"Allocator not initialized for device {device}: did you call init?")
    return state.memory_fraction_of(target)


def caching_allocator_enable(state, value: bool) -> None:
    """`torch.cuda.memory.caching_allocator_enable`: off, each block that frees a whole segment
    gives it back to the device at once (nothing cached); on again, caching resumes."""
    for allocator in state.memory.device_accountings():
        allocator.caching = bool(value)


def caching_allocator_is_enabled(state) -> bool:
    return state.memory.accounting().caching


def can_device_access_peer(state, device: int, peer: int) -> bool:
    return device != peer and max(device, peer) < state.properties.count and min(device, peer) >= 0


def allocator_state_class(state) -> type:
    """What torch._inductor.cudagraph_trees imports once is_built() says CUDA (torch._dynamo.reset()
    imports it): a name only; the emulated device has no CUDA allocator to hand out states of."""
    return type("AllocatorState", (), {})


def cuda_graph_class(state) -> type:
    return torch_cuda_graph_class()


def cuda_graph_base(state) -> type:
    """`torch._C._CUDAGraph`, the C++ half under torch's Python CUDAGraph: the emulated one, which
    the emulated `torch.cuda.CUDAGraph` derives from, so a patch of it (`mock.patch.object(
    torch._C._CUDAGraph, "replay", ...)`) reaches the graphs' `super()` calls as on CUDA."""
    return EmulatedGraphBase


def default_generators(state) -> tuple:
    return state.default_generators.generators


def nvtx_ranges(state) -> NvtxRanges:
    return NvtxRanges()


def device_generator_class(state) -> type:
    count = state.properties.count

    def device_index(device: Any) -> int | None:
        if not names_cuda(device):
            return None
        index = cuda_index(device, state.current_index, count)
        if state.is_current_stream_capturing():
            raise generator_made_in_capture(index)
        return index

    return generator_class(device_index, state.is_current_stream_capturing)


def no_default_capture_stream(state) -> None:
    return None


def cudnn_unavailable(state, *args) -> bool:
    """The device's kernels are the cpu's: no cuDNN, even where torch was built with it (a CUDA
    build on a machine without a GPU), or RNNs would flatten their weights with cuDNN."""
    return False


def record_stream(state, self, stream) -> None:
    """Tensor.record_stream: its C++ argument parser takes only torch's own Stream type."""
    if not is_device_memory(self):
        # aten::record_stream has CUDA kernels only
        raise NotImplementedError(
            "Could not run 'aten::record_stream' with arguments from the 'CPU' backend. "
            f"(Tensor.record_stream of a host tensor of shape {tuple(self.shape)}: only device "
            f"memory has streams to record.)")
    state.streams.record_stream(self, as_device_stream(stream))


def list_gpu_processes(state, device: Any = None) -> str:
    """torch.cuda.list_gpu_processes: no other process uses the emulated device."""
    return f"GPU:{index(state, device)}\nno processes are running"


# torch.cuda's readings through NVML (torch/cuda/__init__.py), besides list_gpu_processes
NVML_READINGS = ("utilization", "memory_usage", "temperature", "power_draw", "clock_rate",
                 "device_memory_used")


def nvml_query(name: str) -> Callable:
    """torch.cuda's NVML readings (utilization, temperature, ...): the emulated device has no NVML
    and no figure that would mean anything, so a reading is refused by name, not made up."""

    def refuse(state, *args, **kwargs):
        raise UnsupportedOnEmulatedDevice(
            f"torch.cuda.{name}() is not supported by harness.emulate_cuda(): it reads the GPU "
            f"through NVML, and the emulated device has no hardware to read. Keep monitoring calls "
            f"out of the code under test, or catch NotImplementedError around them")

    refuse.__name__ = name
    return refuse


def nvrtc_refused(what: str, how: str) -> UnsupportedOnEmulatedDevice:
    """The refusal of code that compiles its own CUDA C++: NVRTC output runs only on a GPU."""
    return UnsupportedOnEmulatedDevice(
        f"{what} is not supported by harness.emulate_cuda(): it compiles CUDA C++ with NVRTC "
        f"{how}, and the emulated device runs torch's CPU kernels, with no driver to load a kernel "
        f"into. Run code that compiles its own kernels on a GPU (the graph sanitizer, "
        f"--emulate-cuda there)")


def jiterator_launch(state, *args, **kwargs):
    """torch.cuda.jiterator's launches."""
    raise nvrtc_refused("torch.cuda.jiterator", "at the first call")


def compile_kernel(state, *args, **kwargs):
    """torch.cuda._compile_kernel."""
    raise nvrtc_refused("torch.cuda._compile_kernel()",
                        "and loads the result with the CUDA driver")


def backward_engine(state):
    return engine_with_placement(state, torch_internals.engine_run_backward)


def implicit_grads(state):
    return implicit_grads_with_placement(state, torch_internals.make_grads)


def function_apply(state):
    return function_outputs_recorded(state, vars(torch.autograd.Function)["apply"])


def backward_function_apply(state):
    return materialized_grads_placed(state, torch.autograd.function.BackwardCFunction.apply)


def backward_function_apply_boxed(state):
    return materialized_grads_placed(state, torch.autograd.function.BackwardCFunction.apply_boxed,
                                     boxed=True)


def saved_tensor_hooks(state):
    return saved_tensor_hooks_with_placement(
        state, torch_internals.push_saved_tensors_default_hooks)


def host_memory_stats(state) -> dict:
    return state.memory.host.stats()


def host_empty_cache(state) -> None:
    state.memory.host.empty_cache()


def reset_peak_host_memory_stats(state) -> None:
    state.memory.host.reset_peak()


def reset_accumulated_host_memory_stats(state) -> None:
    state.memory.host.reset_accumulated()


def get_stream_from_external(state, data_ptr: int, device: Any = None) -> Stream:
    """A stream for the raw handle `data_ptr`: the default stream for handle 0, else the external
    stream wrapping it, which compares unequal to a pooled stream of the same handle (both as
    measured on CUDA); a plain `torch.cuda.Stream` either way, as torch builds it from the ids."""
    index = state.streams.device_index(device)
    if int(data_ptr) == 0:
        return as_plain_stream(state.streams.default(index))
    return as_plain_stream(ExternalStream(data_ptr, index))


def cuda_array_interface(state):
    """Tensor.__cuda_array_interface__ hands a raw device pointer to CuPy, Numba and the like;
    the emulated device's memory is host memory, which none of them can read as device memory."""
    host_interface = torch.Tensor.__cuda_array_interface__

    def interface(tensor):
        if not is_device_memory(tensor):
            return host_interface.__get__(tensor)
        raise UnsupportedOnEmulatedDevice(
            f"Tensor.__cuda_array_interface__ of a cuda tensor of shape {tuple(tensor.shape)}: "
            f"it hands a raw CUDA device pointer to another library (CuPy, Numba, ...), and the "
            f"emulated CUDA device's memory is host memory that no CUDA library can read. Share "
            f"the tensor through DLPack (torch.from_dlpack / __dlpack__) or run this code on a GPU")

    return property(interface)


def tunable_op(name: str):
    """The replacement of one of `torch._C`'s TunableOp functions: the state's settings."""
    def build(state):
        return getattr(state.tunable_ops, name)
    return build


def swaps_past_watches(state):
    """torch.utils.swap_tensors that swaps past the harness's own weak references (watch_refs.py):
    in place once the harness watches a tensor, and from the emulation's start."""
    return install_swaps_past_watches()


def checkpoint_restore(state):
    return restore_location(state, torch.serialization.default_restore_location)


def checkpoint_tag(state):
    return location_tag(state, torch.serialization.location_tag)


# --- the table: which torch attribute gets which replacement ---------------------------------


@dataclass(frozen=True)
class Replacement:
    """`owner.name` is replaced, for the emulation's duration, by what `build(state)` returns.

    `call` (the default): `build` is a replacement function taking the state first; torch's
    callers get it bound to the state. `value`: `build(state)` returns the replacement itself (a
    class, a constant, a wrapped original). `if_present`: replaced only where this torch has the
    name (`torch.accelerator` grows between releases). Rows of `torch.cuda` are also put in the
    submodules that define the same name (`torch.cuda.memory.memory_stats`, ...).
    """

    owner: str
    name: str
    build: Callable[..., Any]
    kind: str = "call"
    if_present: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("call", "value"):
            raise ValueError(f"Replacement({self.owner}.{self.name}): kind {self.kind!r}; "
                             f"accepted: 'call', 'value'")

    def replacement(self, state) -> Any:
        if self.kind == "value":
            return self.build(state)
        fn = self.build

        @functools.wraps(fn)
        def bound(*args, **kwargs):
            return fn(state, *args, **kwargs)

        del bound.__wrapped__  # so inspect.signature shows torch's arguments, not the state
        return bound


def _cuda(name: str, build: Callable, kind: str = "call") -> Replacement:
    return Replacement("torch.cuda", name, build, kind)


def _private(name: str, build: Callable, kind: str = "call") -> Replacement:
    # torch._C's own names, which torch's Python helpers (and torch.testing's TestCase) call.
    return Replacement("torch._C", name, build, kind)


def _accelerator(name: str, build: Callable) -> Replacement:
    return Replacement("torch.accelerator", name, build, if_present=True)


# Add rows at the end of their group; keep the order (other changes add rows at the same time).
REPLACEMENTS: tuple[Replacement, ...] = (
    _cuda("is_available", is_available),
    _cuda("device_count", device_count),
    _cuda("current_device", current_device),
    _cuda("set_device", set_device),
    _cuda("_exchange_device", exchange_device),
    _cuda("_maybe_exchange_device", maybe_exchange_device),
    _cuda("get_device_name", get_device_name),
    _cuda("get_device_properties", get_device_properties),
    _cuda("get_device_capability", get_device_capability),
    _cuda("mem_get_info", mem_get_info),
    _cuda("memory_allocated", memory_allocated),
    _cuda("max_memory_allocated", max_memory_allocated),
    _cuda("memory_reserved", memory_reserved),
    _cuda("max_memory_reserved", max_memory_reserved),
    _cuda("reset_peak_memory_stats", reset_peak_memory_stats),
    _cuda("reset_max_memory_allocated", reset_peak_memory_stats),
    _cuda("reset_max_memory_cached", reset_peak_memory_stats),
    _cuda("reset_accumulated_memory_stats", reset_accumulated_memory_stats),
    _cuda("memory_stats", memory_stats),
    _cuda("memory_summary", memory_summary),
    _cuda("list_gpu_processes", list_gpu_processes),
    _cuda("empty_cache", empty_cache),
    _cuda("is_initialized", is_initialized),
    _cuda("init", init),
    _cuda("_lazy_init", init),
    _cuda("synchronize", synchronize),
    _cuda("Stream", lambda state: Stream, "value"),
    _cuda("ExternalStream", lambda state: ExternalStream, "value"),
    _cuda("Event", lambda state: Event, "value"),
    _cuda("current_stream", current_stream),
    _cuda("default_stream", default_stream),
    _cuda("stream", stream),
    _cuda("StreamContext", stream_context_class, "value"),
    _cuda("is_current_stream_capturing", is_current_stream_capturing),
    _cuda("graph_pool_handle", graph_pool_handle),
    _cuda("CUDAGraph", cuda_graph_class, "value"),
    _cuda("_sleep", sleep),
    _cuda("manual_seed", manual_seed),
    _cuda("manual_seed_all", manual_seed_all),
    _cuda("seed", seed),
    _cuda("seed_all", seed_all),
    _cuda("get_rng_state", get_rng_state),
    _cuda("set_rng_state", set_rng_state),
    _cuda("get_rng_state_all", get_rng_state_all),
    _cuda("set_rng_state_all", set_rng_state_all),
    _cuda("initial_seed", initial_seed),
    _cuda("is_bf16_supported", is_bf16_supported),
    _cuda("get_arch_list", get_arch_list),
    _cuda("current_blas_handle", current_blas_handle),
    _cuda("ipc_collect", nothing),
    _cuda("default_generators", default_generators, "value"),

    _accelerator("is_available", accelerator_is_available),
    _accelerator("device_count", device_count),
    _accelerator("current_accelerator", current_accelerator),
    _accelerator("current_device_index", current_device_index),
    _accelerator("current_device_idx", current_device_index),
    _accelerator("set_device_index", taking_a_device(set_device, optional=False)),
    _accelerator("set_device_idx", taking_a_device(set_device, optional=False)),
    _accelerator("current_stream", taking_a_device(accelerator_current_stream)),
    _accelerator("set_stream", accelerator_set_stream),
    _accelerator("synchronize", taking_a_device(synchronize)),
    _accelerator("memory_allocated", taking_a_device(memory_allocated)),
    _accelerator("max_memory_allocated", taking_a_device(max_memory_allocated)),
    _accelerator("memory_reserved", taking_a_device(memory_reserved)),
    _accelerator("max_memory_reserved", taking_a_device(max_memory_reserved)),
    _accelerator("reset_peak_memory_stats", taking_a_device(reset_peak_memory_stats)),
    _accelerator("memory_stats", taking_a_device(memory_stats)),
    _accelerator("empty_cache", empty_cache),
    _accelerator("get_memory_info", taking_a_device(mem_get_info)),
    _accelerator("get_device_capability", taking_a_device(device_capability_refused)),
    _accelerator("empty_host_cache", host_empty_cache),
    _accelerator("reset_accumulated_memory_stats",
                 taking_a_device(reset_accumulated_memory_stats)),

    # not _cuda_getDeviceCount: torch.cuda._is_compiled() asks for it to tell a CUDA build
    _private("_cuda_jiterator_compile_and_launch_kernel", jiterator_launch),
    _private("_cuda_setStream", cuda_set_stream),
    _private("_cuda_setDevice", set_device),
    _private("_cuda_getDevice", current_device),
    _private("_cuda_clearCublasWorkspaces", clear_cublas_workspaces),
    _private("_cuda_emptyCache", empty_cache),
    _private("_cuda_synchronize", synchronize),
    _private("_cuda_isCurrentStreamCapturing", is_current_stream_capturing),
    _private("_host_emptyCache", host_empty_cache),
    _private("_accelerator_setAllocatorSettings", set_allocator_settings),
    _private("_cuda_set_sync_debug_mode", set_sync_debug_mode),
    _private("_cuda_get_sync_debug_mode", get_sync_debug_mode),
    _private("_cuda_setMemoryFraction", set_memory_fraction),
    _private("_cuda_getMemoryFraction", get_memory_fraction),
    _private("_cuda_memoryStats", memory_stats_nested),
    _private("_cuda_cudaCachingAllocator_enable", caching_allocator_enable),
    _private("_cuda_cudaCachingAllocator_is_enabled", caching_allocator_is_enabled),
    _private("_cuda_CUDAAllocator_AllocatorState", allocator_state_class, "value"),
    _private("_cuda_canDeviceAccessPeer", can_device_access_peer),
    _private("_cuda_hostMemoryStats", host_memory_stats),
    _private("_cuda_resetPeakHostMemoryStats", reset_peak_host_memory_stats),
    _private("_cuda_resetAccumulatedHostMemoryStats", reset_accumulated_host_memory_stats),
    _private("_cuda_attach_out_of_memory_observer", attach_out_of_memory_observer),
    _private("_can_use_flash_attention", sdpa_backends.can_use_flash_attention),
    _private("_can_use_mem_efficient_attention", sdpa_backends.can_use_efficient_attention),
    _private("_can_use_cudnn_attention", sdpa_backends.can_use_cudnn_attention),
    _private("_is_flash_attention_available", sdpa_backends.flash_attention_available),
    *(_private(name, tunable_op(method), "value") for name, method in TUNABLE_OP_NAMES.items()),
    _private("_construct_storage_from_data_pointer", storage_from_data_pointer, "value"),
    _private("_CUDAGraph", cuda_graph_base, "value"),

    Replacement("torch.cuda.nvtx", "_nvtx", nvtx_ranges, "value"),
    Replacement("torch.cuda", "_cudart", emulated_cudart, "value"),
    Replacement("torch", "Generator", device_generator_class, "value"),
    Replacement("torch.cuda.graph", "default_capture_stream", no_default_capture_stream, "value"),
    Replacement("torch.backends.cudnn", "is_available", cudnn_unavailable),
    Replacement("torch.backends.cudnn", "is_acceptable", cudnn_unavailable),
    Replacement("torch.Tensor", "record_stream", record_stream),
    Replacement("torch.autograd", "_engine_run_backward", backward_engine, "value"),
    Replacement("torch.autograd", "_make_grads", implicit_grads, "value"),
    Replacement("torch.autograd.Function", "apply", function_apply, "value"),
    Replacement("torch.autograd.function.BackwardCFunction", "apply", backward_function_apply,
                "value"),
    Replacement("torch.autograd.function.BackwardCFunction", "apply_boxed",
                backward_function_apply_boxed, "value", if_present=True),
    Replacement("torch._C._autograd", "_push_saved_tensors_default_hooks", saved_tensor_hooks,
                "value"),
    Replacement("torch", "Stream", stream_class, "value"),
    Replacement("torch", "Event", event_class, "value"),
    Replacement("torch.serialization", "default_restore_location", checkpoint_restore, "value"),
    Replacement("torch.serialization", "location_tag", checkpoint_tag, "value"),
    Replacement("torch._C", "_cuda_exchangeDevice", exchange_device, if_present=True),
    Replacement("torch._C", "_cuda_maybeExchangeDevice", maybe_exchange_device, if_present=True),
    Replacement("torch._C", "_accelerator_exchangeDevice", exchange_device, if_present=True),
    Replacement("torch._C", "_accelerator_maybeExchangeDevice", maybe_exchange_device,
                if_present=True),
    Replacement("torch.cuda", "_compile_kernel", compile_kernel, if_present=True),
    Replacement("torch.cuda.graphs", "_dump_graph_dot", lambda state: dump_graph_dot, "value",
                if_present=True),
    Replacement("torch.utils", "swap_tensors", swaps_past_watches, "value"),
    Replacement("torch.UntypedStorage", "device", storage_device, "value"),
    Replacement("torch.UntypedStorage", "is_shared", storage_is_shared, "value"),
    Replacement("torch.UntypedStorage", "resize_", storage_resize, "value"),
    Replacement("torch.UntypedStorage", "__new__", storage_new, "value"),
    Replacement("torch.UntypedStorage", "_share_cuda_", share_cuda_refused, "value"),
    Replacement("torch.cuda", "get_stream_from_external", get_stream_from_external,
                if_present=True),
    Replacement("torch.Tensor", "__cuda_array_interface__", cuda_array_interface, "value"),
    Replacement("torch.Tensor", "_make_wrapper_subclass", make_wrapper_subclass, "value"),
    Replacement("torch.Tensor", "__new__", legacy_subclass_constructor, "value"),
    Replacement("torch.backends.cuda.cuFFTPlanCache", "size", fft_plans.size_property, "value"),
    Replacement("torch.backends.cuda.cuFFTPlanCache", "max_size", fft_plans.max_size_property,
                "value"),
    Replacement("torch.backends.cuda.cuFFTPlanCache", "clear", fft_plans.clear_method, "value"),
    *(Replacement("torch.cuda", name, nvml_query(name), if_present=True) for name in NVML_READINGS),
    *(Replacement(owner, "get_current_stream", dynamo_current_stream(owner), "value",
                  if_present=True) for owner in ("torch._dynamo.utils", "torch._dynamo.guards")),
    Replacement("torch._C", "_accelerator_getDefaultGenerator", accelerator_default_generator,
                if_present=True),
    Replacement("torch", "get_device_module", device_module_class, "value"),
    Replacement("torch._C", "_get_accelerator", accelerator_of_the_build, "value"),
    Replacement("torch._dynamo.utils", "build_event", dynamo_builds_event, "value",
                if_present=True),
    Replacement("torch._dynamo.utils", "build_stream", dynamo_builds_stream, "value",
                if_present=True),
    # torch's memory statistics ask it first: CUDA's allocator is set up with CUDA itself
    Replacement("torch._C", "_accelerator_isAllocatorInitialized", is_initialized,
                if_present=True),
)

# torch.cuda's names that its submodules define too, and that code may reach through them.
_CUDA_SUBMODULES = ("torch.cuda.memory", "torch.cuda.random", "torch.cuda.streams",
                    "torch.cuda.graphs")


def owner_object(path: str) -> Any:
    """The torch module or class a table row names ("torch.cuda.graph" is the class; "torch._C"
    is reached through the door to torch's private names)."""
    return torch_internals.torch_namespace(path)


def patches(state, table: tuple[Replacement, ...] = REPLACEMENTS) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for every row of `table` that applies to this torch."""
    keep_dynamo_out()
    out: list[tuple[Any, str, Any]] = []
    for row in table:
        owner = owner_object(row.owner)
        if row.if_present and row.name not in vars(owner):
            continue
        value = row.replacement(state)
        out.append((owner, row.name, value))
        if row.owner == "torch.cuda":
            out += [(module, row.name, value) for module in map(owner_object, _CUDA_SUBMODULES)
                    if row.name in vars(module)]
    # The allocator tooling's replacements share one registry of pools and raw blocks, so they
    # come as a group rather than as rows.
    from harness.emulation.allocator_tools import patches as allocator_tool_patches

    out += allocator_tool_patches(state)
    # cudagraph trees' calls into CUDA's allocator (pool_checkpoints.py); its raw_delete frees the
    # blocks a restored checkpoint allocated, then the allocator tools' raw blocks
    from harness.emulation.pool_checkpoints import patches as pool_checkpoint_patches

    tools_delete = next(value for owner, name, value in out
                        if name == "_cuda_cudaCachingAllocator_raw_delete")
    out += pool_checkpoint_patches(state, tools_delete)
    # torch.compile's replacements (compiled.py) and autocast's cache are groups of their own too.
    out += compile_patches(state)
    out.append((torch, "clear_autocast_cache",
                clearing_cache_too(state.autocast_cache, torch.clear_autocast_cache)))
    from harness.emulation.autocast_bodies import patches as autocast_body_patches

    out += autocast_body_patches(state)
    from harness.emulation.foreach_groups import patches as foreach_group_patches

    out += foreach_group_patches(state)
    from harness.emulation.dlpack import patches as dlpack_patches

    out += dlpack_patches(state)
    out += accelerator_call_patches(state)
    out += dynamo_device_context_patches(state)
    from harness.emulation.legacy_types import patches as legacy_type_patches

    out += legacy_type_patches(state)
    from harness.emulation.device_comm import patches as device_comm_patches

    out += device_comm_patches(state)
    from harness.emulation.distributed import patches as distributed_patches

    out += distributed_patches(state)
    from harness.emulation.custom_ops import patches as custom_op_patches

    out += custom_op_patches(state)
    from harness.emulation.profiling import patches as profiling_patches

    out += profiling_patches(state)
    from harness.emulation.triton_launches import patches as triton_launch_patches

    out += triton_launch_patches(state)
    from harness.emulation.user_dispatch_modes import patches as user_dispatch_mode_patches

    out += user_dispatch_mode_patches(state)
    from harness.emulation.compiled_stream_calls import patches as stream_call_patches
    from harness.emulation.compiled_stream_calls import in_graph_class_patches, replaced_calls

    out += stream_call_patches(replaced_calls(out)) + in_graph_class_patches(out)
    return out


__all__ = ["REPLACEMENTS", "CudaDeviceProperties", "DeviceIndexError", "Replacement", "patches"]
