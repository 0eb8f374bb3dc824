"""The `torch.cuda` Python API on the emulated device: what `emulate_cuda()` puts in place of torch's
functions for its duration (`patches(state)`), each answering from the device's state.

Memory statistics come from the model of CUDA's caching allocator that the device's allocations and
frees drive (caching_allocator.py): `memory_stats()` has the native allocator's keys,
`memory_allocated`/`memory_reserved` and their `max_*` read its `allocated_bytes.all` and
`reserved_bytes.all`, `empty_cache()` gives back its wholly free segments, and `mem_get_info` counts
the reserved bytes as used. Random state: the emulated device draws from the cpu's default generator
(device tensors are cpu tensors), so `torch.cuda.manual_seed` and `torch.manual_seed` seed the same
generator.
"""

from __future__ import annotations

import functools
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

from harness.emulation.backward import (
    compile_marking_outputs, engine_with_placement, saved_tensor_hooks_with_placement)
from harness.emulation.generators import generator_class
from harness.emulation.rules import DeviceIndexError, cuda_index, names_cuda
from harness.emulation.cuda_streams import Event, ExternalStream, Stream
from harness.emulation.tools import (NvtxRanges, check_memory_fraction,
                                                 check_sync_debug_mode)


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
    warp_size: int = 32
    regs_per_multiprocessor: int = 65536
    L2_cache_size: int = 52_428_800
    uuid: str = "00000000-0000-0000-0000-000000000000"
    gcnArchName: str = "NVIDIA"

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
                f"L2_cache_size={self.L2_cache_size // (1024 * 1024)}MB)")


def patches(state) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for every name emulate_cuda() replaces."""
    props = state.properties
    streams = state.streams

    def index(device: Any = None) -> int:
        if device is None:
            return state.current_index
        if isinstance(device, torch.device) and device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        return cuda_index(device, state.current_index, props.count)

    def is_available() -> bool:
        return True

    def device_count() -> int:
        return props.count

    def current_device() -> int:
        state.initialized = True
        return state.current_index

    def set_device(device: Any) -> None:
        if isinstance(device, int) and device < 0:
            return  # torch: a negative index is a no-op
        state.current_index = index(device)
        state.initialized = True

    class device:
        """torch.cuda.device: a context manager that makes `device` the current one."""

        def __init__(self, device: Any) -> None:
            self.idx = -1 if device is None else index(device)
            self.prev_idx = -1

        def __enter__(self) -> None:
            self.prev_idx = state.current_index
            if self.idx >= 0:
                state.current_index = self.idx

        def __exit__(self, *exc) -> bool:
            state.current_index = self.prev_idx
            return False

    class device_of(device):
        def __init__(self, obj) -> None:
            super().__init__(obj.get_device() if obj.is_cuda else -1)

    def get_device_properties(device: Any = None) -> CudaDeviceProperties:
        index(device)
        return CudaDeviceProperties(props.name, props.major, props.minor, props.total_memory,
                                    props.multi_processor_count)

    def get_device_name(device: Any = None) -> str:
        return get_device_properties(device).name

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        index(device)
        return (props.major, props.minor)

    accounting = state.memory.accounting  # the caching allocator's, up to date

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        index(device)
        return (props.total_memory - accounting().stat("reserved_bytes", "current"),
                props.total_memory)

    def stat(name: str, field: str, device: Any = None) -> int:
        index(device)
        return accounting().stat(name, field)

    def reset_peak_memory_stats(device: Any = None) -> None:
        index(device)
        accounting().reset_peak()

    def reset_accumulated_memory_stats(device: Any = None) -> None:
        index(device)
        accounting().reset_accumulated()

    def memory_stats(device: Any = None):
        """The native caching allocator's keys (caching_allocator.py: what it models)."""
        index(device)
        return accounting().memory_stats()

    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        stats = memory_stats(device)
        fields = ("current", "peak", "allocated", "freed")
        rows = [f"{'':<36}" + "".join(f"{field:>16}" for field in fields)]
        for name in ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes",
                     "inactive_split_bytes", "allocation", "active", "segment", "inactive_split"):
            for scope in ("all",) if abbreviated else ("all", "small_pool", "large_pool"):
                rows.append(f"{name + '.' + scope:<36}" + "".join(
                    f"{stats[f'{name}.{scope}.{field}']:>16}" for field in fields))
        return (f"emulated CUDA device {index(device)} ({props.name}), caching allocator's "
                f"accounting of {props.total_memory} bytes:\n" + "\n".join(rows))

    def empty_cache() -> None:
        accounting().empty_cache()

    def is_initialized() -> bool:
        return state.initialized

    def init() -> None:
        state.initialized = True

    def synchronize(device: Any = None) -> None:
        index(device)
        state.notify_sync("torch.cuda.synchronize", None)

    def current_stream(device: Any = None) -> Stream:
        return streams.current(device)

    def default_stream(device: Any = None) -> Stream:
        return streams.default(device)

    def set_stream(stream: Stream) -> None:
        if stream is None:
            return
        streams.set_current(stream)

    class StreamContext:
        """torch.cuda.StreamContext: `stream` is current inside (None: nothing changes)."""

        def __init__(self, stream: Stream | None) -> None:
            self.stream = stream
            self.idx = -1 if stream is None else stream.device_index
            self._saved: list[Stream] = []
            self._prev_index = state.current_index

        def __enter__(self) -> None:
            if self.stream is None:
                return
            self._prev_index = state.current_index
            self._saved = [streams.current(self._prev_index), streams.current(self.stream.device_index)]
            state.current_index = self.stream.device_index
            streams.set_current(self.stream)

        def __exit__(self, *exc) -> None:
            if self.stream is None:
                return
            for saved in reversed(self._saved):
                streams.set_current(saved)
            state.current_index = self._prev_index

    def stream(stream: Stream | None) -> StreamContext:
        return StreamContext(stream)

    def is_current_stream_capturing() -> bool:
        return state.is_current_stream_capturing()

    def graph_pool_handle():
        from harness.graphs.emulator.pool import PoolArena

        return PoolArena(state.storage_device)

    def _sleep(cycles: int) -> None:
        if state.observers:
            state.notify_op("torch.cuda._sleep", (cycles,), {}, None)
            state.notify_stream("sleep", streams.current(), None)

    generator = torch.default_generator

    def manual_seed(seed: int) -> None:
        if state.capturing():
            torch.random.manual_seed(seed)  # the capture's RNG rules (emulator/rng.py) decide
        else:
            generator.manual_seed(int(seed))

    def seed() -> None:
        if state.capturing():
            torch.random.seed()
        else:
            generator.seed()

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        index(device)
        return torch.random.get_rng_state()  # looked up at call time: a capture records it

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        index(device)
        torch.random.set_rng_state(new_state)

    def get_rng_state_all() -> list[torch.Tensor]:
        return [get_rng_state(i) for i in range(props.count)]

    def set_rng_state_all(new_states) -> None:
        for i, s in enumerate(new_states):
            set_rng_state(s, i)

    def initial_seed() -> int:
        return generator.initial_seed()

    def _cuda_setStream(stream_id: int = 0, device_index: int = 0, device_type: int = 1) -> None:
        stream = streams.by_id.get((stream_id, device_index))
        if stream is None:
            stream = streams.default(device_index) if stream_id == 0 else Stream(
                device_index, stream_id=stream_id)
        streams.set_current(stream)
        state.current_index = stream.device_index

    # torch._C's own names, which torch's Python helpers (and torch.testing's TestCase) call.
    # Each its own function object: torch._dynamo's trace rules refuse one object under two names.
    private = {
        "_cuda_setStream": _cuda_setStream,
        "_cuda_setDevice": lambda device: set_device(device),
        "_cuda_getDevice": lambda: current_device(),
        "_cuda_clearCublasWorkspaces": lambda: None,
        "_cuda_emptyCache": lambda: empty_cache(),
        "_cuda_synchronize": lambda: synchronize(),
        "_cuda_isCurrentStreamCapturing": lambda: is_current_stream_capturing(),
        "_host_emptyCache": lambda: None,
        "_cuda_set_sync_debug_mode": lambda mode: setattr(state, "sync_debug_mode",
                                                          check_sync_debug_mode(mode)),
        "_cuda_get_sync_debug_mode": lambda: state.sync_debug_mode,
        "_cuda_setMemoryFraction": lambda fraction, device=None: setattr(
            state, "memory_fraction", check_memory_fraction(fraction)),
        # What torch._inductor.cudagraph_trees imports once is_built() says CUDA (torch._dynamo.reset()
        # imports it): a name only; the emulated device has no CUDA allocator to hand out states of.
        "_cuda_CUDAAllocator_AllocatorState": type("AllocatorState", (), {}),
        "_cuda_canDeviceAccessPeer": lambda device, peer: (
            device != peer and max(device, peer) < props.count and min(device, peer) >= 0),
    }  # not _cuda_getDeviceCount: torch.cuda._is_compiled() asks for it to tell a CUDA build

    from harness.emulation.session import CUDAGraph

    api: dict[str, Callable] = {
        "is_available": is_available, "device_count": device_count,
        "current_device": current_device, "set_device": set_device, "device": device,
        "device_of": device_of, "get_device_name": get_device_name,
        "get_device_properties": get_device_properties,
        "get_device_capability": get_device_capability, "mem_get_info": mem_get_info,
        "memory_allocated": lambda device=None: stat("allocated_bytes", "current", device),
        "max_memory_allocated": lambda device=None: stat("allocated_bytes", "peak", device),
        "memory_reserved": lambda device=None: stat("reserved_bytes", "current", device),
        "max_memory_reserved": lambda device=None: stat("reserved_bytes", "peak", device),
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats,
        "reset_max_memory_cached": reset_peak_memory_stats,
        "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
        "memory_stats": memory_stats,
        "memory_summary": memory_summary, "empty_cache": empty_cache,
        "is_initialized": is_initialized, "init": init, "_lazy_init": init,
        "synchronize": synchronize, "Stream": Stream, "ExternalStream": ExternalStream,
        "Event": Event, "current_stream": current_stream, "default_stream": default_stream,
        "set_stream": set_stream, "stream": stream, "StreamContext": StreamContext,
        "is_current_stream_capturing": is_current_stream_capturing,
        "graph_pool_handle": graph_pool_handle, "CUDAGraph": CUDAGraph, "_sleep": _sleep,
        "manual_seed": manual_seed, "manual_seed_all": manual_seed, "seed": seed,
        "seed_all": seed, "get_rng_state": get_rng_state, "set_rng_state": set_rng_state,
        "get_rng_state_all": get_rng_state_all, "set_rng_state_all": set_rng_state_all,
        "initial_seed": initial_seed, "is_bf16_supported": lambda including_emulation=True: True,
        "get_arch_list": lambda: [f"sm_{props.major}{props.minor}"],
        "current_blas_handle": lambda: 0, "ipc_collect": lambda: None,
    }
    accelerator = {
        "is_available": lambda: True, "device_count": lambda: props.count,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": lambda: state.current_index,
        "current_device_idx": lambda: state.current_index,
        "set_device_index": lambda device: set_device(device),
        "set_device_idx": lambda device: set_device(device),
        "current_stream": lambda device=None: streams.current(device),
        "set_stream": lambda stream: set_stream(stream),
        "synchronize": lambda device=None: synchronize(device),
        "memory_allocated": lambda device=None: stat("allocated_bytes", "current", device),
        "max_memory_allocated": lambda device=None: stat("allocated_bytes", "peak", device),
        "memory_reserved": lambda device=None: stat("reserved_bytes", "current", device),
        "max_memory_reserved": lambda device=None: stat("reserved_bytes", "peak", device),
        "reset_peak_memory_stats": lambda device=None: reset_peak_memory_stats(device),
        "memory_stats": lambda device=None: memory_stats(device),
        "empty_cache": lambda: empty_cache(),
    }
    api = _distinct(api)
    out: list[tuple[Any, str, Any]] = [(torch.cuda, name, fn) for name, fn in api.items()]
    for module in (torch.cuda.memory, torch.cuda.random, torch.cuda.streams, torch.cuda.graphs):
        out += [(module, name, fn) for name, fn in api.items() if name in module.__dict__]
    out += [(torch.accelerator, name, fn) for name, fn in accelerator.items()
            if name in torch.accelerator.__dict__]
    out += [
        (torch.cuda, "default_generators", (generator,) * props.count),
        (torch.cuda.nvtx, "_nvtx", NvtxRanges()),
        (torch, "Generator", generator_class(
            lambda device: cuda_index(device, state.current_index, props.count)
            if names_cuda(device) else None)),
        (torch.cuda.graph, "default_capture_stream", None),
        (torch.version, "cuda", "12.8"),
        *[(torch._C, name, fn) for name, fn in private.items()],
        # The optimizers' capture health check and others ask whether torch was built with CUDA.
        (torch.backends.cuda, "is_built", lambda: True),
        # The device's kernels are the cpu's: no cuDNN, even where torch was built with it (a CUDA
        # build on a machine without a GPU), or RNNs would flatten their weights with cuDNN.
        (torch.backends.cudnn, "is_available", lambda: False),
        (torch.backends.cudnn, "is_acceptable", lambda tensor: False),
        # Its C++ argument parser takes only torch's own Stream type.
        (torch.Tensor, "record_stream", lambda self, stream: streams.record_stream(self, stream)),
        (torch.autograd, "_engine_run_backward",
         engine_with_placement(state, torch.autograd._engine_run_backward)),
        (torch, "compile", compile_marking_outputs(state, torch.compile)),
        (torch._C._autograd, "_push_saved_tensors_default_hooks", saved_tensor_hooks_with_placement(
            state, torch._C._autograd._push_saved_tensors_default_hooks)),
    ]
    from harness.emulation.allocator_tools import patches as allocator_tool_patches

    out += allocator_tool_patches(state)
    from harness.emulation.foreach_groups import patches as foreach_group_patches

    out += foreach_group_patches(state)
    return out


def _distinct(api: dict[str, Any]) -> dict[str, Any]:
    """Each name its own function object (an alias gets a wrapper): torch._dynamo's trace rules
    refuse one object known under two names with different rules."""
    seen: set[int] = set()
    out = {}
    for name, fn in api.items():
        if id(fn) in seen and callable(fn) and not isinstance(fn, type):
            fn = functools.wraps(fn)(lambda *a, _fn=fn, **k: _fn(*a, **k))
        seen.add(id(fn))
        out[name] = fn
    return out


__all__ = ["CudaDeviceProperties", "DeviceIndexError", "patches"]
