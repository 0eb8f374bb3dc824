"""`emulate_cuda()`: entering and leaving the emulated CUDA device (or the graph sanitizer).

Entering puts the `torch.cuda` replacements (cuda_api.py) in place and pushes the placement mode;
leaving restores every replaced name exactly as it was (a name that was absent is removed again)
and removes the placement mode from the mode stack by identity, whatever was pushed above it.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

import torch

from harness import torch_internals
from harness.torch_internals import (DeviceContext, get_current_dispatch_mode_stack,
                                     get_current_function_mode_stack)
# active_state and emulation_active are also reached here by the parts above the device
from harness.emulation.active import active_state, emulation_active, in_force, is_in_force  # noqa: F401
from harness.emulation.backward import remove_function_mode
from harness.emulation.cuda_graph import CUDAGraph
from harness.emulation.replacing import apply
from harness.emulation.state import DeviceProperties, DeviceState

DEVICES = ("auto", "cpu", "cuda")
OPTIONS = {"name": "name", "total_memory": "total_memory", "capability": None,
           "multi_processor_count": "multi_processor_count", "device_count": "count",
           "cuda_version": None}
# The emulation a child process entered at startup because its parent ran inside one
# (children.py): an explicit emulate_cuda() in the child replaces it.
_INHERITED: list[Any] = []


def _properties(options: dict) -> DeviceProperties:
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"emulate_cuda() got unknown option(s) {sorted(unknown)}; accepted: "
                        f"device ({', '.join(DEVICES)}), {', '.join(OPTIONS)}")
    fields = {OPTIONS[k]: v for k, v in options.items() if OPTIONS[k] is not None}
    if "capability" in options:
        capability = options["capability"]
        if not (isinstance(capability, tuple) and len(capability) == 2
                and all(isinstance(c, int) for c in capability)):
            raise ValueError(f"capability must be a (major, minor) tuple of ints, got {capability!r}")
        fields["major"], fields["minor"] = capability
    return DeviceProperties(**fields)


def _refuse_bad_use(device: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"emulate_cuda(device={device!r}): unknown device; accepted: "
                         f"{', '.join(repr(d) for d in DEVICES)}")
    if emulation_active() is not None:
        raise RuntimeError(f"emulate_cuda() entered inside another emulate_cuda() "
                           f"(device={emulation_active()!r}): one emulation at a time")
    from harness.graphs.emulator.recorder import Recorder

    if any(isinstance(m, Recorder) for m in get_current_dispatch_mode_stack()) or (
            torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        raise RuntimeError("emulate_cuda() entered inside a graph capture; enter it before "
                           "capturing")
    contexts = [m for m in get_current_function_mode_stack()
                if isinstance(m, DeviceContext) and torch.device(m.device).type != "cpu"]
    if contexts:  # a default of cpu, the default anyway, is harmless
        raise RuntimeError(f"emulate_cuda() entered inside a device mode (a torch.device("
                           f"{contexts[-1].device!s}) context or torch.set_default_device); "
                           f"enter emulate_cuda() first, then set the device")
    if device == "cpu" and torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError("emulate_cuda(device='cpu') after torch.cuda was initialized on the "
                           "real GPU(s): tensors already on them cannot join the emulated device; "
                           "enter it before any CUDA work, or use device='auto' (the sanitizer)")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("emulate_cuda(device='cuda') (the graph sanitizer) needs a GPU, and "
                           "torch.cuda.is_available() is False; use device='auto' or 'cpu'")


@contextlib.contextmanager
def emulate_cuda(device: str = "auto", *, schedule: str = "issue_order", races: str = "strict",
                 children: bool = False, **options) -> Iterator[Any]:
    """See harness.emulate_cuda."""
    from harness.emulation.tracking.observer import RACE_MODES
    from harness.emulation.tracking.schedule import SCHEDULES

    if schedule not in SCHEDULES:
        raise ValueError(f"emulate_cuda(schedule={schedule!r}); accepted: {', '.join(SCHEDULES)}")
    if races not in RACE_MODES:
        raise ValueError(f"emulate_cuda(races={races!r}); accepted: {', '.join(RACE_MODES)}")
    if _INHERITED:
        # An explicit emulation takes its place; left first, since the inherited one's
        # torch.cuda.is_available() answers True and would pick the sanitizer below.
        _INHERITED.pop().__exit__(None, None, None)
    kind = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    if kind == "cuda":
        _refuse_sanitizer_options(schedule, races, options)
    _refuse_bad_use(device)
    torch_internals.check()  # a torch that moved a private name fails here, not with wrong answers
    properties = _properties(options)
    with contextlib.ExitStack() as stack:
        if kind == "cpu":
            if options.get("cuda_version") is not None:
                _report_cuda_version(options["cuda_version"], stack)
            state = _enter_cpu(properties, stack, schedule, races)
            if children:
                from harness.emulation.children import inherit_in_children

                inherit_in_children(stack, {"device": "cpu", "schedule": schedule, "races": races,
                                            **options})
        else:
            from harness.emulation.sanitizer import enter_sanitizer

            state = enter_sanitizer(stack, races)
        stack.enter_context(in_force(state))
        yield state


def _report_cuda_version(version: Any, stack: contextlib.ExitStack) -> None:
    """`cuda_version="12.8"`: a CPU build's torch reports that CUDA version while the emulation
    lasts. Asked for by name only: the emulation otherwise never changes what torch says of its own
    build (a CUDA wheel's extensions, torchvision's among them, check it against their own). Test
    files that gate CUDA-graph tests on `torch.version.cuda` (PyTorch's test_cuda.py) need it on a
    CPU build, where it is None."""
    if not (isinstance(version, str) and re.fullmatch(r"\d+\.\d+", version)):
        raise ValueError(f"emulate_cuda(cuda_version={version!r}): expected a CUDA version such as "
                         f"'12.8'")
    built = torch.version.cuda
    if built is not None and built != version:
        raise ValueError(f"emulate_cuda(cuda_version={version!r}): this torch {torch.__version__} is a "
                         f"CUDA {built} build and reports it (torch.version.cuda); cuda_version is for "
                         f"a CPU build, where torch.version.cuda is None; drop it")
    stack.callback(setattr, torch.version, "cuda", built)
    torch.version.cuda = version


def _refuse_sanitizer_options(schedule: str, races: str, options: dict) -> None:
    """On a real GPU emulate_cuda() is the graph sanitizer: the GPU schedules its own streams and
    the device is the GPU itself, so these settings would do nothing. `races` is taken: there it
    decides only what a replay that reads memory CUDA reads silently does (shared-pool memory
    another graph overwrote, memory freed since the capture), as on the emulated device."""
    given = [f"schedule={schedule!r}"] if schedule != "issue_order" else []
    given += [f"{key}={value!r}" for key, value in options.items()]
    if given:
        raise ValueError(f"emulate_cuda({', '.join(given)}) on a real GPU: the graph sanitizer runs "
                         f"there, and the stream schedule and device properties "
                         f"belong to the emulated device only; drop them, or enter "
                         f"emulate_cuda(device='cpu') before any CUDA work for the emulated device")


def enter_inherited(options: dict) -> None:
    """This process is a child of one inside `emulate_cuda(children=True)` (children.py): enter
    the same emulation for the rest of its life, unless one is already active."""
    if emulation_active() is not None:
        return
    context = emulate_cuda(**options)
    context.__enter__()
    _INHERITED.append(context)


def _enter_cpu(properties: DeviceProperties, stack: contextlib.ExitStack, schedule: str,
               races: str) -> DeviceState:
    from harness.emulation.accelerator_calls import fresh_device_modules
    from harness.emulation.compiled_graphs import clear_triton_answer
    from harness.emulation.compiled_trees import trees_shut_down
    from harness.emulation.cuda_api import patches
    from harness.emulation.device_memory import is_device_memory
    from harness.emulation.inner_autocast import InnerAutocast
    from harness.emulation.int4_kernels import Int4Kernels
    from harness.emulation.op_bodies import wrap_registered
    from harness.emulation.placement import Placement

    state = DeviceState(properties)
    state.kind = "cpu"
    state.races = races
    state.schedule = schedule
    apply(patches(state), stack)
    stack.enter_context(fresh_device_modules())
    stack.callback(clear_triton_answer)
    state.cuda_only_ops.route_registered()
    stack.callback(state.cuda_only_ops.close)
    int4_kernels = Int4Kernels()
    int4_kernels.register()
    stack.callback(int4_kernels.close)
    inner_autocast = InnerAutocast(is_device_memory, lambda: state.memory.call_on_device)
    inner_autocast.register()
    stack.callback(inner_autocast.unregister)
    stack.callback(wrap_registered(state))
    placement = state.placement = Placement(state)
    placement.__enter__()
    stack.callback(remove_function_mode, placement)
    stack.callback(_reset_default_device)
    # torch's cudagraph trees keep their managers (graphs, pools of this device) in thread-local
    # state that torch._dynamo.reset() clears only while CUDA is initialized: the device's are
    # shut down with it, while its replacements are still in place
    stack.callback(trees_shut_down, state.every_threads_trees)
    state.streams_tracking = None
    if races != "off" or schedule != "issue_order":
        from harness.emulation.tracking.observer import DeviceStreams

        tracking = DeviceStreams(state, schedule=schedule, races="report" if races == "off" else races)
        stack.enter_context(tracking.work)
        stack.enter_context(state.observe(tracking))
        state.streams_tracking = tracking
    else:
        # Which work a capture records does not depend on whether races are looked for.
        from harness.emulation.tracking.capture_streams import CaptureRules
        from harness.emulation.tracking.observer import stream_key

        stack.enter_context(state.observe(CaptureRules(state, stream_key)))
    from harness.emulation.threads import thread_start_patch

    apply(thread_start_patch(state, lambda: is_in_force(state)), stack)
    return state


def _reset_default_device() -> None:
    """A `torch.set_default_device("cuda")` made inside the emulation does not outlive it."""
    if torch.get_default_device().type == "cuda":
        torch.set_default_device(None)
