"""`torch.cuda.current_stream()` and `torch.accelerator.current_stream()` called inside a
`torch.compile`d function on the emulated CUDA device.

Dynamo knows torch's functions by identity: its rule map makes `torch.cuda.current_stream` an
in-graph function, and a handler answers it with the stream variable dynamo tracks as current
(entered and left by `torch.cuda.stream(s)` blocks in the trace), of CUDA's stream type. The
emulated device replaces those functions, so without more dynamo would inline the replacement,
whose fresh `torch.cuda.Stream` built from the current stream's ids a CPU wheel's dynamo tries to
fold from constants and cannot ("StreamVariable() is not a constant"). For the emulation's duration
dynamo's rule map, its handlers and its stream-type table know each replacement as the function
it replaces.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import torch

from harness import torch_internals

# (owner, name) of the replaced functions dynamo handles by identity
CALLS = (("torch.cuda", "current_stream"), ("torch.accelerator", "current_stream"),
         ("torch.cuda", "default_stream"), ("torch.cuda", "stream"))


def patches(replaced: dict[Callable, Callable]) -> list[tuple[Any, str, Any]]:
    """Dynamo's lookups, each answering for a replacement as for the function it replaces
    (`replaced`: original -> replacement)."""
    trace_rules = torch_internals.lazy_module("dynamo_trace_rules")
    torch_variables = torch_internals.lazy_module("dynamo_torch_variables")
    in_graph = torch_variables.TorchInGraphFunctionVariable
    rule_map, handlers = trace_rules.get_torch_obj_rule_map, in_graph._get_handlers
    # Both tables are built once, at their first use, from the functions torch's names hold then:
    # built inside an emulation, they would know its replacements, and no function of torch's
    # after it. They are built now, before the replacements are in place.
    rule_map()
    handlers()

    def known(table: Callable[[], dict]) -> collections.ChainMap:
        found = table()
        return collections.ChainMap(
            {new: found[old] for old, new in replaced.items() if old in found}, found)

    def get_torch_obj_rule_map() -> collections.ChainMap:
        return known(rule_map)

    get_torch_obj_rule_map.cache_clear = rule_map.cache_clear  # dynamo's clear_lru_cache
    out = [(trace_rules, "get_torch_obj_rule_map", get_torch_obj_rule_map),
           (in_graph, "_get_handlers", staticmethod(lambda: known(handlers)))]
    streams = torch_internals.lazy_module("dynamo_stream_variables")
    stream_class_of = getattr(streams, "_get_stream_variable_cls", None)
    if stream_class_of is not None:  # torch 2.13 on: the stream type a function's answer has
        reverse = {new: old for old, new in replaced.items()}

        def stream_class(stream_fn: object) -> Any:
            return stream_class_of(reverse.get(stream_fn, stream_fn))

        out.append((streams, "_get_stream_variable_cls", stream_class))
    return out


def in_graph_class_patches(planned: list[tuple[Any, str, Any]]) -> list[tuple[Any, str, Any]]:
    """Dynamo's set of classes whose construction it puts in the graph (`torch.cuda.Stream()`,
    `torch.cuda.Event()` in a compiled function), answering for the emulation's replacements
    too. The set is built once, at its first use, from the classes torch's names hold then: first
    used outside an emulation, it knew torch's own classes and not the emulated ones, so dynamo
    traced into an emulated stream's constructor ("Missing tp_iternext") in one test order and
    not in another. `planned` is read before the patches are applied."""
    variable = torch_internals.lazy_module("dynamo_user_defined_variables").UserDefinedClassVariable
    in_graph = getattr(variable, "_in_graph_classes", None)
    if in_graph is None:
        return []
    known = in_graph()
    added = {value for owner, name, value in planned
             if isinstance(value, type) and getattr(owner, name, None) in known}
    if not added:
        return []
    merged = known | added
    return [(variable, "_in_graph_classes", staticmethod(lambda: merged))]


def replaced_calls(planned: list[tuple[Any, str, Any]]) -> dict[Callable, Callable]:
    """original -> replacement of CALLS among the (owner, name, value) patches `planned`,
    read before they are applied."""
    wanted = {(torch_internals.torch_namespace(owner), name) for owner, name in CALLS}
    return {getattr(owner, name): value for owner, name, value in planned
            if (owner, name) in wanted and callable(getattr(owner, name, None))}
