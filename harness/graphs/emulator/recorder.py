"""The emulator's capture: a TorchDispatchMode that records each op without running it.

Views run for real (they only alias). In-place and out= ops are recorded as they are and hand back
their arguments. Ops with fresh results get outputs from the pool, shaped by the op's meta (or
fake) kernel and poisoned until the first replay, and are recorded as an allocation-free call into
those outputs. Pool memory is recorded through the block's replay storage, so the recording never
keeps a block alive; memory the graph does not own is aliased the same way (external.py), and a
replay refuses to run once it was freed.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Callable

import torch

from harness.torch_internals import (DisableTorchFunction, HigherOrderOperator,
                                     TorchDispatchMode, disable_current_modes, tree_flatten,
                                     tree_map_only)
from harness.graphs.emulator import opinfo
from harness.graphs.base import CaptureError
from harness.graphs.emulator import collectives, cuda_errors
from harness.graphs.emulator.callsite import at_callsite, current_callsite, in_index_assignment, user_frames
from harness.graphs.emulator.conditional import (ConditionHandle, OpenConditional, node_step,
                                                 set_handle)
from harness.graphs.emulator.cuda_paths import one_hot_without_sync
from harness.graphs.emulator.external import ExternalMemory
from harness.graphs.emulator.host_tensors import HOST_COPY_REFUSED
from harness.graphs.emulator.memory import for_device
from harness.graphs.emulator.opinfo import OpKind, ReplayStep
from harness.graphs.emulator.pool import (Block, PoolArena, block_of, laid_out_like,
                                          laid_out_like_once, poison_value)
from harness.graphs.emulator.shared_blocks import SharedBlock
from harness.graphs.emulator.shapes import lacks_meta_kernel, result_shapes, to_meta
from harness.graphs.emulator.accesses import higher_order_tensors, only_metadata, split_accesses
from harness.graphs.emulator.tensor_subclasses import defer_to_subclass
from harness.graphs.emulator.trace import Argument, OpRecord, Origin
from harness.graphs.emulator.private_generators import (is_registered, private_generator,
                                                        unregistered_generator_error)


def _error(message: str, func: Any) -> CaptureError:
    return CaptureError(at_callsite(message, current_callsite()), op=opinfo.op_name(func))


def _extent_bytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.size(), t.stride()))
    return (last + 1) * t.element_size()


class Recorder(TorchDispatchMode):
    """`memory` (emulator/memory.py) says which tensors are device memory; by default what the
    plain emulator on `device` assumes. `kernel_device` is whose kernels' rules apply (the emulated
    CUDA device keeps its memory on the cpu but stands for cuda). `trace`: keep an OpRecord per op
    (trace.py): what a reader of the replay needs."""

    # Higher-order operators reach __torch_dispatch__ as one call (refused on the device by name).
    supports_higher_order_operators = True

    def __init__(self, arena: PoolArena, device: torch.device, memory=None,
                 kernel_device: torch.device | None = None, *, trace: bool = False) -> None:
        super().__init__()
        self.arena = arena
        self.device = device
        self.memory = memory if memory is not None else for_device(device)
        self.kernel_device = kernel_device if kernel_device is not None else device
        self.trace = trace  # keep an OpRecord per op (trace.py): what a reader of the replay needs
        self.steps: list[ReplayStep] = []
        self.records: list[OpRecord] = []
        self._replay_tensors: dict[tuple, torch.Tensor] = {}
        self.external = ExternalMemory()
        self.collectives = collectives.PendingCollectives()
        # Generators registered with the graph (CUDAGraph.register_generator_state): random ops
        # may draw from these besides the device's default generator (private_generators.py).
        self.registered_generators: tuple[torch.Generator, ...] = ()
        # The emulated CUDA device's draws (its device_draws.CaptureDraws): a random op draws from
        # a state object of the device at each replay. None: random ops draw from the generator
        # their recorded arguments name, or the cpu's default one.
        self.draws: Any = None
        # The emulated CUDA device's stream an allocation is made on (a key): the pool serves each
        # stream from segments of its own, as CUDA's allocator does. None: one stream.
        self.allocation_stream: Callable[[], object] | None = None
        self.reads: set[int] = set()  # storages the recording reads (data pointers)
        self.writes: set[int] = set()  # and writes: what a replay touches as one stream op
        # Cut at each event recorded as a graph node (`Event(external=True)`): the accesses
        # before it, which a stream waiting on that event at replay is ordered after.
        self.segments: list[tuple[frozenset[int], frozenset[int], Any]] = []
        self._segment: tuple[set[int], set[int]] = (set(), set())
        # The first sync CUDA refused during this capture: the call invalidated the capture, which
        # then fails at its end on CUDA even where the caller caught the error.
        self.sync_refusal: CaptureError | None = None
        # The pool blocks this capture allocated, and those of earlier captures into the same pool
        # it reads (shared_blocks.py).
        # (Blocks compare by identity, and a dict keeps the allocation order.)
        self.allocated_blocks: dict[Block, None] = {}
        self.shared_blocks: dict[Block, SharedBlock] = {}
        # The conditional nodes whose bodies are being captured, outermost first (conditional.py).
        self.conditionals: list[OpenConditional] = []

    def refuse_sync(self, error: CaptureError) -> CaptureError:
        """Note `error`, a refused sync (cudaErrorStreamCaptureUnsupported), and return it."""
        if self.sync_refusal is None:
            self.sync_refusal = error
        return error

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):
            return self._higher_order_op(func, args, kwargs)
        if collectives.is_collective(func):
            return self._record_collective(func, args, kwargs)
        if types and defer_to_subclass(types):
            # a user's subclass, an AsyncCollectiveTensor that waits in its own dispatch
            return NotImplemented
        if self._is_host_work(func, args, kwargs):
            # CUDA runs host work once, when capture meets it, and never replays it.
            return func(*args, **kwargs)
        if self.sync_refusal is not None:
            # An invalidated capture fails every later launch into it (the CUDA programming
            # guide's invalidation rule; measured on the H200 by scripts/cublas_handle_probe.py).
            raise CaptureError(
                f"{cuda_errors.INVALIDATED} (cudaErrorStreamCaptureInvalidated): {func} launched "
                f"into a capture invalidated by an earlier refused call: "
                f"{str(self.sync_refusal).splitlines()[0]}", op=str(func))
        if func is torch.ops.aten.lift_fresh.default:
            return self._lift_host_data(args[0])
        if func is torch.ops.aten.equal.default:
            known = opinfo.equal_on_host(*args)
            if known is not None:
                return known
        if func is torch.ops.aten.one_hot.default and opinfo.bind(func, args, kwargs)["num_classes"] > 0:
            with self:
                return one_hot_without_sync(*args, **kwargs)
        refusal = self._refusal(func, args, kwargs)
        if refusal is not None:
            raise refusal
        if opinfo.is_composite(func):
            with self:
                return func.decompose(*args, **kwargs)
        self._check_generator(func, kwargs)
        kind = opinfo.op_kind(func)
        if kind is OpKind.VIEW or only_metadata(func):
            return func(*args, **kwargs)
        first_step = len(self.steps)
        if kind is OpKind.MUTATING:
            self._check_mutation(func, args, kwargs)
            self._note_accesses(func, args, kwargs, None)
            self.steps.append((func._op, *self._for_replay((args, kwargs))))
            self._trace(func, args, kwargs, ())
            outputs = opinfo.aliased_returns(func, args, kwargs)
        else:
            device = self._output_device(func, args, kwargs)
            shapes = opinfo.device_result_dtypes(func, args, kwargs,
                                                 result_shapes(func, args, kwargs), device)
            outputs = tree_map_only(torch.Tensor, lambda meta: self._allocate(meta, device), shapes)
            self._record_fresh(func, kind, args, kwargs, outputs)
            self._note_accesses(func, args, kwargs, outputs)
        if self.draws is not None and len(self.steps) > first_step:
            self._draw_at_replay(first_step, func, args, kwargs, outputs)
        return outputs

    def _draw_at_replay(self, first_step: int, func, args, kwargs, outputs) -> None:
        """A random op of the emulated CUDA device: its steps draw from the device's state."""
        state = self.draws.source(func, args, kwargs)
        if state is not None and self.conditionals:
            self.conditionals[-1].drew = True
        if state is not None:
            self.steps[first_step:] = self.draws.replay_steps(
                self.steps[first_step:], func, args, kwargs, outputs, state)

    def _refusal(self, func, args: tuple, kwargs: dict) -> CaptureError | None:
        """What CUDA raises for this op during capture, in its words, then the op and the line;
        one that invalidates the capture is noted (`refuse_sync`)."""
        name = opinfo.op_name(func)
        refusal = opinfo.capture_refusal(func, args, kwargs, self.device, self.memory)
        if refusal is not None:
            error = cuda_errors.capture_refused(refusal.cuda_text, at_callsite(
                f"{name} cannot be captured: {refusal.why}", current_callsite()), op=name)
            return self.refuse_sync(error) if refusal.invalidates else error
        reason = opinfo.kernel_dtype_reason(func, args, kwargs, self.kernel_device)
        if reason:
            return _error(f"{name} cannot be captured: {reason}", func)
        return None

    def _check_generator(self, func, kwargs) -> None:
        generator = private_generator(kwargs, self.device)
        if generator is not None and not is_registered(generator, self.registered_generators):
            raise unregistered_generator_error(func, generator)

    def _lift_host_data(self, t: torch.Tensor) -> torch.Tensor:
        """`torch.tensor(data)` during capture: a copy of host data made when capture meets it."""
        if t.device.type != "cpu":
            raise cuda_errors.pageable_copy_refused(at_callsite(
                f"torch.tensor(...) builds a {t.device} tensor from host data during capture, "
                f"{HOST_COPY_REFUSED}", current_callsite()), op="aten.lift_fresh.default")
        # A host tensor on a cpu device (HostTensors refused the device ones): keep it as a constant.
        self.external.hold(t)
        if in_index_assignment():
            return t  # `x[i] = 1.0`: a host scalar on CUDA too, never copied
        warnings.warn(at_callsite(
            f"a host tensor of shape {tuple(t.shape)} is built from Python data during capture "
            f"(no torch.device given); the graph keeps its values as a constant. Built for the "
            f"device, it would be a pageable host-to-device copy that CUDA graph capture refuses: "
            f"build it before capture",
            current_callsite()), UserWarning, stacklevel=2)
        return t

    def keep_freed_bytes(self, enabled: bool) -> None:
        """Whether memory the capture reads outside its pool keeps its bytes for the replay when
        it is freed (external.py: ExternalMemory.keep_freed_bytes); call before the first op."""
        self.external = ExternalMemory(enabled)

    def discard(self) -> None:
        """Forget a failed capture's recording: its steps and every alias it made."""
        self.steps.clear()
        self.records.clear()
        self._replay_tensors.clear()
        self.external = ExternalMemory(self.external.keep_freed_bytes)
        self.collectives = collectives.PendingCollectives()
        self.reads.clear()
        self.writes.clear()
        self.segments.clear()
        self._segment = (set(), set())
        self.allocated_blocks.clear()
        self.shared_blocks.clear()
        self.conditionals.clear()

    # --- conditional nodes (conditional.py) ---------------------------------------------------

    def begin_conditional(self, pred: torch.Tensor, loops: bool) -> None:
        """A conditional node begins: the step that reads `pred` into its handle, then its body,
        the steps recorded until `end_conditional()`; `loops` makes it a while node."""
        handle = ConditionHandle()
        self._record_set_handle(handle, pred)
        self.conditionals.append(OpenConditional(handle, loops, len(self.steps)))

    def set_condition(self, pred: torch.Tensor) -> None:
        """A step that reads `pred` into the handle of the innermost open conditional node."""
        self._record_set_handle(self.conditionals[-1].handle, pred)

    def end_conditional(self) -> bool:
        """The innermost open conditional node ends: its body's steps become the node's one step
        (their records point at it). Returns whether a random op of the body drew."""
        node = self.conditionals.pop()
        body = self.steps[node.start:]
        del self.steps[node.start:]  # in place: the RNG recording appends to this very list
        self.steps.append(node_step(node, body))
        self.records[:] = [r if r.step < node.start else replace(r, step=node.start)
                           for r in self.records]
        return node.drew

    def _record_set_handle(self, handle: ConditionHandle, pred: torch.Tensor) -> None:
        # Called from the graph's API, above this mode: the alias is made below every mode, as
        # in __torch_dispatch__.
        with DisableTorchFunction(), disable_current_modes():
            self.steps.append((set_handle, (handle, self._replay_tensor(pred)), {}))
        if _has_storage(pred):
            address = pred.untyped_storage().data_ptr()
            self.reads.add(address)
            self._segment[0].add(address)

    # --- replay view of capture-time tensors -------------------------------------------------

    def _for_replay(self, tree: Any) -> Any:
        return tree_map_only(torch.Tensor, self._replay_tensor, tree)

    def _replay_tensor(self, t: torch.Tensor) -> torch.Tensor:
        block = block_of(t)
        if block is None:
            if t.dim() == 0 and not self.memory.is_device(t):
                return self.external.host_scalar(t)
            return self.external.alias(t)
        if block.routed:
            # Allocated outside any capture by a thread routed to a pool (cudagraph trees' warm-ups
            # and recording inputs): memory the graph reads but did not allocate, kept while its
            # pool is in use, as CUDA keeps a graph pool's addresses.
            return self.external.alias(t, owner_pool=block.pool)
        if block.pool is not self.arena.token:
            # Another graph's pool owns it (a workspace first allocated in that graph's capture):
            # freed once its last tensor is dropped and that pool's graphs are reset or gone.
            return self.external.alias(t, owner_pool=block.pool)
        if block not in self.allocated_blocks and block not in self.shared_blocks:
            self.shared_blocks[block] = SharedBlock(
                block, f"shape {tuple(t.shape)}, {t.dtype}", current_callsite())
            self.arena.share(block)
        # The block itself, not its id: a freed block's id can be reused by a later block.
        return laid_out_like_once(self._replay_tensors, block, block.replay_storage, t)

    def _higher_order_op(self, func, args: tuple, kwargs: dict) -> Any:
        tensors = higher_order_tensors(args, kwargs)
        if not self.memory.all_device and not any(self.memory.is_device(t) for t in tensors):
            return func(*args, **kwargs)  # host work, run once as CUDA runs it
        if func.name() == "with_effects":
            return self._with_effects(*args, **kwargs)
        raise CaptureError(at_callsite(
            f"{func.name()}, a higher-order operator (torch.cond, torch.while_loop, flex "
            f"attention's eager path), inside a capture: the emulated graph records aten ops "
            f"and cannot see into the graph this operator runs. CUDA captures the kernels it "
            f"launches (a torch.cond whose predicate is read on the host excepted: that is a "
            f"sync, refused). Capture it natively, compile it (torch.compile) before the capture, "
            f"or call the branch it takes directly.", current_callsite()), op=func.name())

    def _with_effects(self, token: torch.Tensor, op: Any, *args: Any, **kwargs: Any) -> tuple:
        """AOTAutograd's `with_effects(token, op, ...)`, which threads an ordering token through an
        op torch registers as effectful (from torch 2.13 `_linalg_check_errors`, which a compiled
        `linalg.inv` keeps so): CUDA runs the op as any other, so it meets the capture's rules
        here; the new token is an empty host tensor (torch's `new_token_tensor()`)."""
        with self:
            out = op(*args, **kwargs)
        with disable_current_modes(), DisableTorchFunction():
            new_token = torch.empty(0)
        return (new_token, *out) if isinstance(out, tuple) else (new_token, out)

    def _is_host_work(self, func, args, kwargs) -> bool:
        """On a cuda device, an op that touches no tensor on it and makes none there (CPU tensor
        math, `torch.arange(n)` without a device) is host work, not part of the graph."""
        if self.memory.all_device:
            return False
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if any(self.memory.is_device(t) for t in tensors):
            return False
        if tensors and func is torch.ops.aten._local_scalar_dense.default:
            # A host tensor's value read inside a device op (a fused optimizer's tensor betas,
            # which CUDA's kernel takes as doubles): no device memory is read, so no sync.
            return True
        targets = self.memory.call_targets_device()
        if targets is not None:
            return not targets
        named = opinfo.bind(func, args, kwargs)
        target = named.get("device") or (None if tensors else torch.get_default_device())
        return target is None or torch.device(target).type != self.device.type

    def _output_device(self, func, args, kwargs) -> torch.device:
        named = opinfo.bind(func, args, kwargs)
        if "device" in named and not any(isinstance(v, torch.Tensor) for v in named.values()):
            return torch.device(named["device"] or torch.get_default_device())
        if named.get("device") is not None:
            return torch.device(named["device"])
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        for t in tensors:
            if t.device.type != "cpu" or t.dim() > 0:
                return t.device
        return tensors[0].device if tensors else self.device

    def _allocate(self, meta: torch.Tensor, device: torch.device) -> torch.Tensor:
        nbytes = _extent_bytes(meta)
        if nbytes == 0:
            out = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device=device)
        else:
            stream = None if self.allocation_stream is None else self.allocation_stream()
            storage, block = self.arena.allocate(nbytes, stream)
            self.allocated_blocks[block] = None
            if block.contested:  # handed the bytes of a block another capture reads
                block.allocated_at = current_callsite()
            out = laid_out_like(storage, meta, device).fill_(poison_value(meta.dtype))
        self.memory.mark_device(out)
        return out

    # --- recording ---------------------------------------------------------------------------

    def _note_accesses(self, func, args, kwargs, outputs) -> None:
        reads, writes = split_accesses(func, args, kwargs, _has_storage)
        read = {t.untyped_storage().data_ptr() for t in reads}
        written = {t.untyped_storage().data_ptr() for t in writes}
        written.update(t.untyped_storage().data_ptr() for t in tree_flatten(outputs)[0]
                       if isinstance(t, torch.Tensor) and _has_storage(t))
        self.reads |= read
        self.writes |= written
        self._segment[0].update(read)
        self._segment[1].update(written)

    def cut_at_event(self, event: Any) -> None:
        """`event` was recorded as a node of the graph (an external event): the accesses since
        the last cut precede it at every replay."""
        reads, writes = self._segment
        self.segments.append((frozenset(reads - writes), frozenset(writes), event))
        self._segment = (set(), set())

    def replay_segments(self) -> tuple:
        """The recording's accesses cut at its event nodes, each with the event recorded after
        it (None for the last part); empty when the graph records no event."""
        if not self.segments:
            return ()
        reads, writes = self._segment
        return (*self.segments, (frozenset(reads - writes), frozenset(writes), None))

    def _record_collective(self, func, args, kwargs) -> Any:
        if func.namespace == collectives.PROCESS_GROUP_NAMESPACE:
            self.steps.append((collectives.run_process_group_collective,
                               (func._op, *self._for_replay((args, kwargs))), {}))
            return self.collectives.process_group_returns(func, args, kwargs)
        if collectives.is_wait(func):
            self.collectives.waited(args[0])
            return args[0]
        if collectives.is_pass_through(func):
            return func(*args, **kwargs)  # wraps the result to wait on first use
        if opinfo.op_kind(func) is OpKind.MUTATING:
            self.steps.append((collectives.run_inplace_functional_collective,
                               (func._op, *self._for_replay((args, kwargs))), {}))
            result = opinfo.aliased_returns(func, args, kwargs)
        else:
            device = self._output_device(func, args, kwargs)
            result = tree_map_only(torch.Tensor, lambda meta: self._allocate(meta, device),
                                   result_shapes(func, args, kwargs))
            replay_outs = [self._replay_tensor(t) for t in tree_flatten(result)[0]
                           if isinstance(t, torch.Tensor)]
            self.steps.append((collectives.run_functional_collective,
                               (func._op, *self._for_replay((args, kwargs)), replay_outs), {}))
        self.collectives.functional_result(func, result)
        return result

    def _record_fresh(self, func, kind, args, kwargs, outputs) -> None:
        replay_args, replay_kwargs = self._for_replay((args, kwargs))
        replay_outs = [self._replay_tensor(t) for t in tree_flatten(outputs)[0]
                       if isinstance(t, torch.Tensor)]
        if kind is OpKind.FUNCTIONAL:
            known, maker = opinfo.special_replay(func)
            if known:
                if maker is not None:
                    named = opinfo.bind(func, replay_args, replay_kwargs)
                    self.steps.append(maker(named, replay_outs[0]))
                    self._trace(func, args, kwargs, replay_outs)
                return
            out_op = opinfo.out_overload(func)
            # An op that returned an undefined tensor (cuDNN's RNN without a dropout state) has no
            # out= tensor for it: its out= overload cannot be called.
            if out_op is not None and len(replay_outs) == len(opinfo.out_names(out_op)):
                # Only the arguments the caller gave: every default passed costs parsing at replay.
                named = opinfo.bind(func, replay_args, replay_kwargs, defaults=False)
                allowed = {a.name for a in out_op._schema.arguments}
                call = {k: v for k, v in named.items() if k in allowed}
                call.update(zip(opinfo.out_names(out_op), replay_outs))
                self.steps.append((out_op._op, (), call))
                self._trace(func, args, kwargs, replay_outs)
                return
        self.steps.append((_copy_results, (func._op, replay_args, replay_kwargs, replay_outs), {}))
        self._trace(func, args, kwargs, replay_outs)

    def _trace(self, func, args, kwargs, outputs: list[torch.Tensor] | tuple) -> None:
        """What a reader of the replay needs to know about the op just recorded (trace.py)."""
        if not self.trace:
            return
        arguments: list[Argument] = []
        written: list[torch.Tensor] = []
        external: list[torch.Tensor] = []
        writes = {a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        for name, value in opinfo.bind(func, args, kwargs).items():
            items = ([(name, value)] if not isinstance(value, (list, tuple)) else
                     [(f"{name}[{i}]", v) for i, v in enumerate(value)])
            for label, item in items:
                if isinstance(item, torch.Tensor):
                    replay = self._replay_tensor(item)
                    arguments.append(Argument(label, replay, self._origin(item), name in writes))
                    if name in writes:
                        written.append(replay)
                        if arguments[-1].origin is Origin.EXTERNAL:
                            external.append(replay)
                elif item is value:
                    arguments.append(Argument(label, item, Origin.HOST))
            if isinstance(value, (list, tuple)) and not any(isinstance(v, torch.Tensor) for v in value):
                arguments.append(Argument(name, value, Origin.HOST))
        self.records.append(OpRecord(len(self.steps) - 1, opinfo.op_name(func), user_frames(),
                                     tuple(arguments), (*written, *outputs), tuple(external)))

    def _origin(self, t: torch.Tensor) -> Origin:
        if block_of(t) is not None:
            return Origin.POOL
        if self.external.holds(t) or (self.device.type != "cpu" and t.device.type == "cpu" and t.dim() == 0):
            return Origin.CONSTANT
        return Origin.EXTERNAL

    def _check_mutation(self, func, args, kwargs) -> None:
        """Run the op on meta copies: a shape error surfaces now, as CUDA's host-side checks would,
        and a mutated argument whose shape changes (out= of the wrong size, resize_) is refused."""
        mutated = [a for a in func._schema.arguments
                   if a.alias_info is not None and a.alias_info.is_write]
        named = opinfo.bind(func, args, kwargs)
        meta_args, meta_kwargs = tree_map_only(torch.Tensor, to_meta, (args, kwargs))
        if meta_kwargs.get("generator") is not None:
            # Shapes do not depend on it, and the meta kernels (torch's refs) refuse a generator.
            meta_kwargs = {**meta_kwargs, "generator": None}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                func(*meta_args, **meta_kwargs)
        except Exception as meta_error:
            # An aten shape error is the user's; a custom op failing here has no fake, and so
            # nothing to validate against.
            if func.namespace == "aten" and not lacks_meta_kernel(meta_error):
                raise
            return
        meta_named = opinfo.bind(func, meta_args, meta_kwargs)
        for arg in mutated:
            before, after = named.get(arg.name), meta_named.get(arg.name)
            if not isinstance(before, torch.Tensor) or before.shape == after.shape:
                continue
            what = f"out= argument {arg.name!r}" if arg.is_out else f"argument {arg.name!r}"
            raise _error(
                f"{opinfo.op_name(func)} would resize its {what} from {tuple(before.shape)} to "
                f"{tuple(after.shape)} during capture; a graph cannot reallocate memory it "
                f"recorded, so pass a tensor of the final shape", func)


class CompiledCodeRecorder(Recorder):
    """A recorder that steps aside while torch.compile decides and compiles (the emulated CUDA
    device's): dynamo skips every frame while a dispatch mode that does not is on, so a compiled
    call inside a capture ran as eager code, where CUDA runs the compiled graph into the capture
    (and a graph that differs from the eager ops, such as torch 2.11's `linalg.inv` without its
    `_linalg_check_errors`, gets another verdict). Dynamo compiles with every mode off; the
    compiled code then runs under the recorder."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


def _has_storage(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and t.device.type != "meta" and t.dim() > 0


def _copy_results(fn, args, kwargs, outs) -> None:
    """Replay of an op without an out= overload: run it, copy its results into the captured outputs."""
    results = [r for r in tree_flatten(fn(*args, **kwargs))[0] if isinstance(r, torch.Tensor)]
    for dst, src in zip(outs, results):
        # An empty output its meta kernel could not size (cuDNN's RNN reserve, a kernel's
        # workspace) stays empty, as the caller got it at capture; any other copies (a scalar the
        # meta kernel shaped otherwise, such as SDPA's philox seed, broadcasts as before).
        if dst.numel() or not src.numel():
            dst.copy_(src)
