"""The one door to torch's private names.

Every name the harness reaches that torch does not promise to keep (`torch._C._*`,
`torch.utils._python_dispatch`, `torch.utils._pytree`, `torch._ops`, `torch._dynamo`, ...) is
resolved here and nowhere else (suites/cuda_device/test_torch_internals.py walks harness/ to
hold that). It stands alone, like records.py, so that every layer may import it: the graph emulator
(`graphs/emulator`) uses private names as much as the emulated device does, and must not import
`harness.emulation`.

A torch release that moves or changes one of these names must not give wrong answers: importing
this module never fails (an absent name is bound to a stand-in that raises `TorchInternalsError`
when used), and `check()`, which `emulate_cuda()` calls on entry, probes each name cheaply and
refuses with one message naming the torch version and every missing or misbehaving piece.

Two modules are heavy to import (`torch._dynamo`, `torch._subclasses.fake_tensor`): they stay
unimported until first use, and the check on entry only asks that they can be found.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.internals_findings import findings


class TorchInternalsError(RuntimeError):
    """This torch lacks (or changed) a private name the harness needs."""


@dataclass(frozen=True)
class Internal:
    """One private torch name: `module` (imported) then the attributes of `attribute` (dotted).

    `probe(obj)` returns True when the object behaves as the harness uses it (raising counts as
    not behaving). `lazy`: the module is not imported on entry, only found. `optional`: only
    some builds define it (CUDA builds), so entering does not require it; `optional_name()`
    answers None where this build lacks it.
    """

    module: str
    attribute: str
    probe: Callable[[Any], bool] = callable
    lazy: bool = False
    optional: bool = False

    @property
    def path(self) -> str:
        return f"{self.module}.{self.attribute}" if self.attribute else self.module


def resolve(entry: Internal) -> Any:
    """The object `entry` names in this torch (AttributeError / ImportError when absent)."""
    return functools.reduce(getattr, filter(None, entry.attribute.split(".")),
                            importlib.import_module(entry.module))


def _entered(factory: Any) -> bool:
    with factory():
        pass
    return True


def _is_class_with(*methods: str) -> Callable[[Any], bool]:
    return lambda obj: isinstance(obj, type) and all(hasattr(obj, m) for m in methods)


def _flattens(tree_flatten: Any) -> bool:
    leaves, _ = tree_flatten([1, (2, {"a": 3})])
    return leaves == [1, 2, 3]


def _maps_only(tree_map_only: Any) -> bool:
    return tree_map_only(int, lambda x: x + 1, [1, ("a", 2)]) == [2, ("a", 3)]


def _counts(length: Any) -> bool:
    return isinstance(length(), int)


def _lists(stack: Any) -> bool:
    return isinstance(stack(), list)


def _counts_uses(use_count: Any) -> bool:
    storage = torch.empty(1).untyped_storage()  # held: the count is of a live storage
    return use_count(storage._cdata) >= 1


def _tells_expired(expired: Any) -> bool:
    storage = torch.empty(1).untyped_storage()
    return expired(storage._cdata) is False


def _swaps_memory(swap: Any) -> bool:
    a, b = torch.zeros(1), torch.ones(1)
    swap(a.untyped_storage(), b.untyped_storage())
    return a.item() == 1.0 and b.item() == 0.0


def _finds_the_storage(new_with_weak_ptr: Any) -> bool:
    storage = torch.empty(1).untyped_storage()
    return new_with_weak_ptr(storage._cdata) is storage


def _found(module: str) -> Callable[[Any], bool]:
    return lambda _: importlib.util.find_spec(module) is not None


# Exported name -> what it is in torch. Add rows at the end (other changes add rows too).
NAMES: dict[str, Internal] = {
    # torch._C: modes, dispatch keys, storages
    "DisableTorchFunction": Internal("torch._C", "DisableTorchFunction", _entered),
    "AutoDispatchBelowADInplaceOrView": Internal("torch._C", "_AutoDispatchBelowADInplaceOrView",
                                                 _entered),
    "DISPATCH_KEY_PYTHON": Internal("torch._C", "DispatchKey.Python", lambda k: k is not None),
    "DISPATCH_KEY_PYTHON_TLS_SNAPSHOT": Internal("torch._C", "DispatchKey.PythonTLSSnapshot",
                                                 lambda k: k is not None),
    "dispatch_tls_is_dispatch_key_included": Internal(
        "torch._C", "_dispatch_tls_is_dispatch_key_included"),
    "dispatch_tls_set_dispatch_key_included": Internal(
        "torch._C", "_dispatch_tls_set_dispatch_key_included"),
    "len_torch_dispatch_stack": Internal("torch._C", "_len_torch_dispatch_stack", _counts),
    "dispatch_has_kernel_for_dispatch_key": Internal(
        "torch._C", "_dispatch_has_kernel_for_dispatch_key"),
    "dispatch_get_all_op_names": Internal("torch._C", "_dispatch_get_all_op_names", callable),
    "DispatchKeySet": Internal("torch._C", "DispatchKeySet", lambda cls: cls is not None),
    "DISPATCH_KEY_AUTOCAST_CPU": Internal("torch._C", "DispatchKey.AutocastCPU",
                                          lambda k: k is not None),
    "ExcludeDispatchKeyGuard": Internal("torch._C", "_ExcludeDispatchKeyGuard", callable),
    "construct_storage_from_data_pointer": Internal("torch._C",
                                                    "_construct_storage_from_data_pointer"),
    # how torch makes a wrapper subclass (torchao's weights, DTensor): a tensor that owns no memory
    "make_wrapper_subclass": Internal("torch._C", "TensorBase._make_wrapper_subclass"),
    "storage_use_count": Internal("torch._C", "_storage_Use_Count", _counts_uses),
    "storage_expired": Internal("torch", "UntypedStorage._expired", _tells_expired),
    "len_torch_function_stack": Internal("torch._C", "_len_torch_function_stack", _counts),
    "pop_torch_function_stack": Internal("torch._C", "_pop_torch_function_stack"),
    "push_on_torch_function_stack": Internal("torch._C", "_push_on_torch_function_stack"),
    "get_function_stack_at": Internal("torch._C", "_get_function_stack_at"),
    "TensorBase": Internal("torch._C", "TensorBase", lambda c: "device" in c.__dict__),
    "Generator": Internal("torch._C", "Generator", _is_class_with("manual_seed", "get_state")),
    "nn_one_hot": Internal("torch._C", "_nn.one_hot"),
    "nn_parse_to": Internal("torch._C", "_nn._parse_to"),
    "autograd_C": Internal("torch._C", "_autograd", lambda m: m is not None),
    "push_saved_tensors_default_hooks": Internal(
        "torch._C", "_autograd._push_saved_tensors_default_hooks"),
    "engine_run_backward": Internal("torch.autograd", "_engine_run_backward"),
    "make_grads": Internal("torch.autograd", "_make_grads"),
    "has_compatible_shallow_copy_type": Internal("torch", "_has_compatible_shallow_copy_type"),
    # torch._ops
    "OpOverload": Internal("torch._ops", "OpOverload", _is_class_with("name")),
    "OpOverloadPacket": Internal("torch._ops", "OpOverloadPacket", _is_class_with("overloads")),
    # flex attention's, torch.cond's: a dispatch mode sees one call of it, not the ops it runs
    "HigherOrderOperator": Internal("torch._ops", "HigherOrderOperator", _is_class_with("name")),
    # torch.utils._pytree
    "tree_flatten": Internal("torch.utils._pytree", "tree_flatten", _flattens),
    "tree_map_only": Internal("torch.utils._pytree", "tree_map_only", _maps_only),
    # torch.utils._python_dispatch and torch.overrides
    "TorchDispatchMode": Internal("torch.utils._python_dispatch", "TorchDispatchMode",
                                  _is_class_with("__torch_dispatch__", "__enter__")),
    "get_current_dispatch_mode_stack": Internal(
        "torch.utils._python_dispatch", "_get_current_dispatch_mode_stack", _lists),
    "disable_current_modes": Internal("torch.utils._python_dispatch", "_disable_current_modes",
                                      _entered),
    "push_mode": Internal("torch.utils._python_dispatch", "_push_mode"),
    "pop_mode": Internal("torch.utils._python_dispatch", "_pop_mode"),
    "get_current_function_mode_stack": Internal("torch.overrides",
                                                "_get_current_function_mode_stack", _lists),
    # a subclass's __torch_function__ that makes torch treat it as having no override
    "disabled_torch_function_impl": Internal("torch._C", "_disabled_torch_function_impl"),
    # torch.utils._device
    "DeviceContext": Internal("torch.utils._device", "DeviceContext",
                              _is_class_with("__torch_function__")),
    "device_constructors": Internal("torch.utils._device", "_device_constructors",
                                    lambda f: len(f()) > 0),
    # torch._tensor_str
    "tensor_str": Internal("torch._tensor_str", "_str"),
    # heavy modules: found on entry, imported at first use
    "dynamo": Internal("torch._dynamo", "", _found("torch._dynamo"), lazy=True),
    "fake_tensor": Internal("torch._subclasses.fake_tensor", "",
                            _found("torch._subclasses.fake_tensor"), lazy=True),
    "DISPATCH_KEY_COMPOSITE_IMPLICIT": Internal("torch._C", "DispatchKey.CompositeImplicitAutograd",
                                                lambda k: k is not None),
    "op_dk": Internal("torch", "ops.aten.matmul.default._op_dk"),
    # the C++ calls of torch.nn.utils.rnn's packing and of the RNN modules over packed input,
    # which take the batch sizes as a host tensor beside device data
    "pack_padded_sequence_call": Internal("torch", "_VF._pack_padded_sequence"),
    "pad_packed_sequence_call": Internal("torch", "_VF._pad_packed_sequence"),
    "packed_rnn_calls": Internal("torch", "_VF", lambda vf: all(
        hasattr(vf, name) for name in ("lstm", "gru", "rnn_tanh", "rnn_relu"))),
    "nn_module": Internal("torch._C", "_nn", lambda m: m is not None),
    "native_batch_norm_legit": Internal("torch", "_native_batch_norm_legit", callable),
    "native_batch_norm_legit_no_training": Internal(
        "torch", "_native_batch_norm_legit_no_training", callable),
    "group_tensors_by_device_and_dtype": Internal("torch._C", "_group_tensors_by_device_and_dtype"),
    "dynamo_output_graph": Internal("torch._dynamo.output_graph", "",
                                    _found("torch._dynamo.output_graph"), lazy=True),
    "dynamo_eval_frame": Internal("torch._dynamo.eval_frame", "",
                                  _found("torch._dynamo.eval_frame"), lazy=True),
    "dynamo_utils": Internal("torch._dynamo.utils", "", _found("torch._dynamo.utils"), lazy=True),
    # dynamo's device-context variables (torch.cuda.device, torch.accelerator.device_index)
    "dynamo_ctx_manager": Internal("torch._dynamo.variables.ctx_manager", "",
                                   _found("torch._dynamo.variables.ctx_manager"), lazy=True),
    # dynamo's tensor variables (TensorVariable: `x.device` and the reads like it) and guards
    "dynamo_tensor_variables": Internal("torch._dynamo.variables.tensor", "",
                                        _found("torch._dynamo.variables.tensor"), lazy=True),
    "dynamo_guards": Internal("torch._dynamo.guards", "", _found("torch._dynamo.guards"),
                              lazy=True),
    # dynamo's rule map (which variable each torch function is) and its stream variables
    "dynamo_trace_rules": Internal("torch._dynamo.trace_rules", "",
                                   _found("torch._dynamo.trace_rules"), lazy=True),
    "dynamo_stream_variables": Internal("torch._dynamo.variables.streams", "",
                                        _found("torch._dynamo.variables.streams"), lazy=True),
    # dynamo's user-defined class variables: the classes whose construction it puts in the graph
    "dynamo_user_defined_variables": Internal("torch._dynamo.variables.user_defined", "",
                                              _found("torch._dynamo.variables.user_defined"),
                                              lazy=True),
    # dynamo's torch.* variables: `get_overridable_functions`, the calls it hands to a mode
    "dynamo_torch_variables": Internal("torch._dynamo.variables.torch", "",
                                       _found("torch._dynamo.variables.torch"), lazy=True),
    "triton_utils": Internal("torch.utils._triton", "", _found("torch.utils._triton"), lazy=True),
    "inductor_config": Internal("torch._inductor.config", "", _found("torch._inductor.config"),
                                lazy=True),
    "library_impls": Internal("torch.library", "_impls", lambda impls: isinstance(impls, set)),
    "inductor_cudagraph_trees": Internal("torch._inductor.cudagraph_trees", "",
                                         _found("torch._inductor.cudagraph_trees"), lazy=True),
    # where dynamo keeps the user Triton kernels a graph launches (kernel_side_table)
    "triton_kernel_wrap": Internal("torch._higher_order_ops.triton_kernel_wrap", "",
                                   _found("torch._higher_order_ops.triton_kernel_wrap"), lazy=True),
    "tree_unflatten": Internal("torch.utils._pytree", "tree_unflatten"),
    "dynamo_convert_frame": Internal("torch._dynamo.convert_frame", "",
                                     _found("torch._dynamo.convert_frame"), lazy=True),
    "inductor_compile_fx": Internal("torch._inductor.compile_fx", "",
                                    _found("torch._inductor.compile_fx"), lazy=True),
    # AOTAutograd's config: `decompose_custom_triton_ops` (torch.export keeps triton_ops whole)
    "functorch_config": Internal("torch._functorch.config", "", _found("torch._functorch.config"),
                                 lazy=True),
    "set_allocator_settings": Internal("torch._C", "_accelerator_setAllocatorSettings"),
    # the build's accelerator (cpu on a CPU build): what the emulated device answers cuda for
    "get_accelerator": Internal("torch._C", "_get_accelerator"),
    # CUDA's caching allocator's private pools (the graph sanitizer's pools, sanitizer_pools.py)
    "cuda_begin_allocate_current_thread_to_pool": Internal(
        "torch._C", "_cuda_beginAllocateCurrentThreadToPool"),
    "cuda_end_allocate_to_pool": Internal("torch._C", "_cuda_endAllocateToPool"),
    "cuda_release_pool": Internal("torch._C", "_cuda_releasePool"),
    "graph_pool_handle": Internal("torch._C", "_graph_pool_handle"),
    # A torch call whose aten ops the stream tracking already knows runs past its dispatch mode.
    "DisableTorchDispatch": Internal("torch._C", "_DisableTorchDispatch", _entered),
    "get_dispatch_stack_at": Internal("torch._C", "_get_dispatch_stack_at"),
    # torch.func's wrappers (vmap's batched tensors, grad's): no storage of their own
    "is_functorch_wrapped_tensor": Internal("torch._C", "_functorch.is_functorch_wrapped_tensor"),
    # One call for whether any device type's autocast is on: a learned call's signature asks it
    # first (call_patterns.py), `torch.is_autocast_enabled(device)` parses its argument each time
    "is_any_autocast_enabled": Internal("torch._C", "_is_any_autocast_enabled"),
    # What torch.are_deterministic_algorithms_enabled returns, without its Python frame
    "deterministic_algorithms": Internal("torch._C", "_get_deterministic_algorithms"),
    "functorch_get_unwrapped": Internal("torch._C", "_functorch.get_unwrapped"),
    # torch.profiler on the emulated device (profiling.py): a range the profiler records, its
    # states, and the autograd profiler's steps the device's events are added in
    "RecordFunctionFast": Internal("torch._C", "_profiler._RecordFunctionFast",
                                   lambda c: _entered(lambda: c("harness probe"))),
    "ProfilerState": Internal("torch._C", "_profiler.ProfilerState",
                              lambda s: hasattr(s, "KINETO_GPU_FALLBACK") and hasattr(s, "KINETO")),
    "ProfilerActivity": Internal("torch._C", "_profiler.ProfilerActivity",
                                 lambda a: hasattr(a, "CUDA")),
    "autograd_profile_start_trace": Internal("torch.autograd.profiler", "profile._start_trace"),
    "autograd_profile_parse_kineto_results": Internal("torch.autograd.profiler",
                                                      "profile._parse_kineto_results"),
    # random ops torch.distributions calls (the emulated device's draws, device_draws.py)
    "standard_gamma": Internal("torch", "_standard_gamma"),
    "sample_dirichlet": Internal("torch", "_sample_dirichlet"),
    # whether Python dispatch is off here (inside a kernel run under _DisableTorchDispatch)
    "dispatch_tls_is_dispatch_key_excluded": Internal(
        "torch._C", "_dispatch_tls_is_dispatch_key_excluded"),
    # a storage made to raise on access (cudagraph trees' overwritten outputs); CUDA builds only
    "set_storage_access_error_msg": Internal("torch._C", "_set_storage_access_error_msg",
                                             optional=True),
    # torch function handling back on inside a DisableTorchFunction block (a user's op body)
    "EnableTorchFunction": Internal("torch._C", "_EnableTorchFunction", _entered),
    "is_torch_function_enabled": Internal("torch._C", "_is_torch_function_enabled"),
    # torch.library.custom_op's ops by qualified name (their device kernels in `_backend_fns`)
    "library_custom_ops": Internal("torch._library.custom_ops", "",
                                   _found("torch._library.custom_ops"), lazy=True),
    # a storage's memory released and made to raise on access through every tensor over it
    # (cudagraph trees' overwritten outputs, views and detached copies included); CUDA builds only
    "set_storage_data_ptr_access_error_msg": Internal(
        "torch._C", "_set_storage_data_ptr_access_error_msg", optional=True),
    # inductor's helpers: `any_is_symbolic`, what decides `triton.cudagraph_skip_dynamic_graphs`
    "inductor_utils": Internal("torch._inductor.utils", "", _found("torch._inductor.utils"),
                               lazy=True),
    # inductor's log and count of the graphs it runs without CUDA graphs
    "inductor_cudagraph_utils": Internal("torch._inductor.cudagraph_utils", "",
                                         _found("torch._inductor.cudagraph_utils"), lazy=True),
    # AOTAutograd's partitioner: `functionalize_rng_ops` picks activation checkpointing's
    # random-op wrappers by the traced device (emulation/compiled_rng.py)
    "functorch_partitioners": Internal("torch._functorch.partitioners", "",
                                       _found("torch._functorch.partitioners"), lazy=True),
    # those wrappers (higher-order operators), and the dispatch key set a higher-order operator's
    # call dispatches on (what its `__call__` computes after the torch-function check)
    "rng_prims": Internal("torch._prims.rng_prims", "", _found("torch._prims.rng_prims"),
                          lazy=True),
    "hop_compute_keyset": Internal("torch._ops", "_compute_keyset"),
    # a storage's memory exchanged with another's (a pool block taking over an allocation made
    # outside a capture, pool_checkpoints.py; torch 2.12 and later: without it torch's own trees
    # cannot run and the device keeps its stand-in), and a storage's Python object from its
    # address (what CUDA's allocator calls are handed)
    "storage_swap_data_ptr": Internal("torch", "UntypedStorage._swap_data_ptr_", _swaps_memory,
                                      optional=True),
    "storage_from_weak_ptr": Internal("torch", "UntypedStorage._new_with_weak_ptr",
                                      _finds_the_storage),
    # what cudagraph trees call that the emulated device takes from torch as it is (device-agnostic
    # C++: cached tensors, objects kept in thread-local state)
    "set_cached_tensors_enabled": Internal("torch._C", "_set_cached_tensors_enabled"),
    "add_cached_tensor": Internal("torch._C", "_add_cached_tensor"),
    "remove_cached_tensor": Internal("torch._C", "_remove_cached_tensor"),
    "stash_obj_in_tls": Internal("torch._C", "_stash_obj_in_tls", optional=True),
    "get_obj_in_tls": Internal("torch._C", "_get_obj_in_tls", optional=True),
    "is_key_in_tls": Internal("torch._C", "_is_key_in_tls", optional=True),
    # torch.autograd.graph.set_override_stale_capture_stream's flag (torch 2.14 and later): the
    # autograd engine's stream checks across a capture boundary (emulation/backward_streams.py)
    "override_stale_capture_stream": Internal("torch._C", "_override_stale_capture_stream",
                                              optional=True),
    # CUDA graph conditional nodes (emulation/conditional_nodes.py): torch's helpers for torch.cond
    # (the if node, with `begin_capture_to_if_node`; torch 2.13 and later) and torch.while_loop
    # (the while node and `set_conditional_handle_for_current_node`; torch 2.14 and later) mark
    # the builds whose CUDAGraph has those calls
    "cudagraph_if_else_node": Internal("torch._higher_order_ops.cudagraph_conditional_nodes",
                                       "if_else_node", optional=True),
    "cudagraph_while_loop_node": Internal("torch._higher_order_ops.cudagraph_conditional_nodes",
                                          "while_loop_node", optional=True),
    # torch.cuda.graphs' DOT dump of a graph's template (torch 2.14: debug_dump() and export_dot's
    # hook call it; the emulated device replaces it, cuda_graph.py), and the refusal without
    # cuda-bindings it makes first
    "cuda_graphs_dump_graph_dot": Internal("torch.cuda.graphs", "_dump_graph_dot", optional=True),
    "cuda_graphs_require_bindings": Internal("torch.cuda.graphs", "_require_cuda_bindings",
                                             optional=True),
    # where dynamo's aot_autograd backends call AOTAutograd (aot_module_simplified)
    "dynamo_backends_common": Internal("torch._dynamo.backends.common", "",
                                       _found("torch._dynamo.backends.common"), lazy=True),
    # dynamo's backend="cudagraphs" (its `cudagraphs`, and the helpers it calls)
    "dynamo_backends_cudagraphs": Internal("torch._dynamo.backends.cudagraphs", "",
                                           _found("torch._dynamo.backends.cudagraphs"), lazy=True),
    # the effect an op is registered with (AOTAutograd threads an effectful op through its graphs
    # instead of dropping it as dead code: `_linalg_check_errors` is one in torch 2.13, not 2.11)
    "op_effect": Internal("torch._higher_order_ops.effects", "_get_effect", optional=True),
    # the objects (streams, events) dynamo hands a graph, which the graph looks up by index
    "dynamo_graph_bytecode_inputs": Internal("torch._dynamo.graph_bytecode_inputs", "",
                                             _found("torch._dynamo.graph_bytecode_inputs"),
                                             lazy=True),
}


def problems(names: dict[str, Internal] | None = None,
             resolver: Callable[[Internal], Any] = resolve) -> list[str]:
    """What is wrong with `names` (default: all of NAMES) in this torch, one line per name:
    `path (missing: ...)` or `path (does not behave: ...)`. `resolver` finds an entry's object
    (the seam a test plants a missing name through)."""
    return findings((NAMES if names is None else names).values(),
                    lambda entry: None if entry.lazy else resolver(entry),
                    optional=lambda entry: entry.optional)


def check(names: dict[str, Internal] | None = None,
          resolver: Callable[[Internal], Any] = resolve) -> None:
    """Raise one TorchInternalsError naming the torch version and every missing or misbehaving
    private name, or return when all are there and behave."""
    found = problems(names, resolver)
    if found:
        raise TorchInternalsError(
            f"torch {torch.__version__} lacks or changed {len(found)} private name(s) the "
            f"harness's emulated CUDA device needs: " + "; ".join(found)
            + ". Use a torch in the range pyproject.toml declares, or update "
              "harness/torch_internals.py for this release.")


class _Absent:
    """What a name this torch lacks is bound to: using it raises, naming it."""

    def __init__(self, path: str, error: Exception) -> None:
        self._message = (f"torch {torch.__version__} has no {path} ({error}), which the harness "
                         f"needs; harness.torch_internals.check() lists every such name")

    def __call__(self, *args, **kwargs):
        raise TorchInternalsError(self._message)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TorchInternalsError(self._message)


def bind(entry: Internal) -> Any:
    try:
        return resolve(entry)
    except (AttributeError, ImportError) as error:
        if entry.attribute in _BASE_CLASSES:
            # the harness subclasses it at import: a class that refuses to be made instead
            return type(entry.attribute, (), {"__init__": _Absent(entry.path, error)})
        return _Absent(entry.path, error)


_BASE_CLASSES = ("TorchDispatchMode", "DeviceContext", "Generator", "TensorBase",
                 "HigherOrderOperator")


DisableTorchFunction = bind(NAMES["DisableTorchFunction"])
EnableTorchFunction = bind(NAMES["EnableTorchFunction"])
is_torch_function_enabled = bind(NAMES["is_torch_function_enabled"])
AutoDispatchBelowADInplaceOrView = bind(NAMES["AutoDispatchBelowADInplaceOrView"])
DISPATCH_KEY_PYTHON = bind(NAMES["DISPATCH_KEY_PYTHON"])
DISPATCH_KEY_PYTHON_TLS_SNAPSHOT = bind(NAMES["DISPATCH_KEY_PYTHON_TLS_SNAPSHOT"])
dispatch_tls_is_dispatch_key_included = bind(NAMES["dispatch_tls_is_dispatch_key_included"])
dispatch_tls_set_dispatch_key_included = bind(NAMES["dispatch_tls_set_dispatch_key_included"])
len_torch_dispatch_stack = bind(NAMES["len_torch_dispatch_stack"])
library_impls = bind(NAMES["library_impls"])
dispatch_has_kernel_for_dispatch_key = bind(NAMES["dispatch_has_kernel_for_dispatch_key"])
dispatch_get_all_op_names = bind(NAMES["dispatch_get_all_op_names"])
ExcludeDispatchKeyGuard = bind(NAMES["ExcludeDispatchKeyGuard"])
DispatchKeySet = bind(NAMES["DispatchKeySet"])
DISPATCH_KEY_AUTOCAST_CPU = bind(NAMES["DISPATCH_KEY_AUTOCAST_CPU"])
construct_storage_from_data_pointer = bind(NAMES["construct_storage_from_data_pointer"])
make_wrapper_subclass = bind(NAMES["make_wrapper_subclass"])
storage_use_count = bind(NAMES["storage_use_count"])
storage_expired = bind(NAMES["storage_expired"])
storage_swap_data_ptr = bind(NAMES["storage_swap_data_ptr"])
storage_from_weak_ptr = bind(NAMES["storage_from_weak_ptr"])
len_torch_function_stack = bind(NAMES["len_torch_function_stack"])
pop_torch_function_stack = bind(NAMES["pop_torch_function_stack"])
push_on_torch_function_stack = bind(NAMES["push_on_torch_function_stack"])
get_function_stack_at = bind(NAMES["get_function_stack_at"])
TensorBase = bind(NAMES["TensorBase"])
Generator = bind(NAMES["Generator"])
nn_one_hot = bind(NAMES["nn_one_hot"])
nn_parse_to = bind(NAMES["nn_parse_to"])
autograd_C = bind(NAMES["autograd_C"])
push_saved_tensors_default_hooks = bind(NAMES["push_saved_tensors_default_hooks"])
engine_run_backward = bind(NAMES["engine_run_backward"])
make_grads = bind(NAMES["make_grads"])
has_compatible_shallow_copy_type = bind(NAMES["has_compatible_shallow_copy_type"])
OpOverload = bind(NAMES["OpOverload"])
OpOverloadPacket = bind(NAMES["OpOverloadPacket"])
HigherOrderOperator = bind(NAMES["HigherOrderOperator"])
tree_flatten = bind(NAMES["tree_flatten"])
tree_map_only = bind(NAMES["tree_map_only"])
TorchDispatchMode = bind(NAMES["TorchDispatchMode"])
get_current_dispatch_mode_stack = bind(NAMES["get_current_dispatch_mode_stack"])
disable_current_modes = bind(NAMES["disable_current_modes"])
push_mode = bind(NAMES["push_mode"])
pop_mode = bind(NAMES["pop_mode"])
get_current_function_mode_stack = bind(NAMES["get_current_function_mode_stack"])
disabled_torch_function_impl = bind(NAMES["disabled_torch_function_impl"])
DeviceContext = bind(NAMES["DeviceContext"])
device_constructors = bind(NAMES["device_constructors"])
tensor_str = bind(NAMES["tensor_str"])
pack_padded_sequence_call = bind(NAMES["pack_padded_sequence_call"])
pad_packed_sequence_call = bind(NAMES["pad_packed_sequence_call"])
packed_rnn_calls = bind(NAMES["packed_rnn_calls"])
DISPATCH_KEY_COMPOSITE_IMPLICIT = bind(NAMES["DISPATCH_KEY_COMPOSITE_IMPLICIT"])
nn_module = bind(NAMES["nn_module"])
native_batch_norm_legit = bind(NAMES["native_batch_norm_legit"])
native_batch_norm_legit_no_training = bind(NAMES["native_batch_norm_legit_no_training"])
group_tensors_by_device_and_dtype = bind(NAMES["group_tensors_by_device_and_dtype"])
set_allocator_settings = bind(NAMES["set_allocator_settings"])
get_accelerator = bind(NAMES["get_accelerator"])
tree_unflatten = bind(NAMES["tree_unflatten"])
cuda_begin_allocate_current_thread_to_pool = bind(NAMES["cuda_begin_allocate_current_thread_to_pool"])
cuda_end_allocate_to_pool = bind(NAMES["cuda_end_allocate_to_pool"])
cuda_release_pool = bind(NAMES["cuda_release_pool"])
graph_pool_handle = bind(NAMES["graph_pool_handle"])
DisableTorchDispatch = bind(NAMES["DisableTorchDispatch"])
get_dispatch_stack_at = bind(NAMES["get_dispatch_stack_at"])
is_functorch_wrapped_tensor = bind(NAMES["is_functorch_wrapped_tensor"])
is_any_autocast_enabled = bind(NAMES["is_any_autocast_enabled"])
deterministic_algorithms = bind(NAMES["deterministic_algorithms"])
functorch_get_unwrapped = bind(NAMES["functorch_get_unwrapped"])
RecordFunctionFast = bind(NAMES["RecordFunctionFast"])
ProfilerState = bind(NAMES["ProfilerState"])
ProfilerActivity = bind(NAMES["ProfilerActivity"])
autograd_profile_start_trace = bind(NAMES["autograd_profile_start_trace"])
autograd_profile_parse_kineto_results = bind(NAMES["autograd_profile_parse_kineto_results"])
standard_gamma = bind(NAMES["standard_gamma"])
sample_dirichlet = bind(NAMES["sample_dirichlet"])
dispatch_tls_is_dispatch_key_excluded = bind(NAMES["dispatch_tls_is_dispatch_key_excluded"])
hop_compute_keyset = bind(NAMES["hop_compute_keyset"])


def optional_name(name: str) -> Any:
    """The object of an `optional` entry of NAMES, or None where this build lacks it."""
    entry = NAMES[name]
    if not entry.optional:
        raise ValueError(f"{name!r} is not an optional entry of harness.torch_internals.NAMES")
    try:
        return resolve(entry)
    except (AttributeError, ImportError):
        return None


def lazy_module(name: str) -> Any:
    """One of the heavy private modules of NAMES marked lazy (`dynamo_output_graph`,
    `dynamo_eval_frame`, `dynamo_utils`, `triton_utils`, `inductor_config`,
    `inductor_cudagraph_trees`, `triton_kernel_wrap`, `functorch_config`), imported at first
    use."""
    entry = NAMES[name]
    if not entry.lazy or entry.attribute:
        raise ValueError(f"{name!r} is not a lazy module of harness.torch_internals.NAMES")
    return importlib.import_module(entry.module)


def call_composite_kernel(func: Any, *args: Any, **kwargs: Any) -> Any:
    """`func`'s C++ CompositeImplicitAutograd kernel (not torch._decomp's Python one, which
    `OpOverload.decompose` prefers): its ops go through the dispatcher, and the modes, one by one."""
    return func._op_dk(DISPATCH_KEY_COMPOSITE_IMPLICIT, *args, **kwargs)


def storage_key(storage: Any) -> int:
    """The address of a storage's C++ object: the same for every Python object of one storage."""
    return storage._cdata


def mark_dynamic(tensor: torch.Tensor, dim: int) -> None:
    """torch._dynamo.mark_dynamic (imported at first use)."""
    importlib.import_module("torch._dynamo").mark_dynamic(tensor, dim)


def is_fake_tensor(t: Any) -> bool:
    """isinstance(t, torch._subclasses.fake_tensor.FakeTensor) (the module imported at first use)."""
    return isinstance(t, importlib.import_module("torch._subclasses.fake_tensor").FakeTensor)


def fake_tensor_mode(**options: Any) -> Any:
    """A torch._subclasses.fake_tensor.FakeTensorMode (imported at first use)."""
    return importlib.import_module("torch._subclasses.fake_tensor").FakeTensorMode(**options)


def shape_env() -> Any:
    """A fresh torch.fx.experimental.symbolic_shapes.ShapeEnv (imported at first use)."""
    return importlib.import_module("torch.fx.experimental.symbolic_shapes").ShapeEnv()


def torch_namespace(path: str) -> Any:
    """The torch module or class a dotted path names ("torch._C", "torch.cuda.graph"): what the
    emulated device replaces attributes of, private owners included."""
    return functools.reduce(getattr, path.split(".")[1:], torch)

