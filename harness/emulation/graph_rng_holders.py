"""The CUDA generators' seed and offset holders of graphs, made and written through torch's
dispatcher as CUDA's generator makes and writes them, so that a user's dispatch mode sees them.

CUDA's generator hands a captured random kernel its seed and offset through two one-element
int64 device tensors (CUDAGeneratorState's "extragraph" holders), made with `at::empty` and
written with `fill_`, both dispatched: a dispatch mode on the stack sees those calls (H100, torch
2.11: two `empty` and two `fill_` at the first capture, two `fill_` at each later capture and at
each replay of a graph that drew). When, and on which stream, depends on the build:

- up to torch 2.11 (CUDAGeneratorState::register_graph, capture_prologue): one pair per generator
  state, made on the current stream when the state registers its first live graph
  (capture_begin registers the default generator's state, register_generator_state another's)
  and freed when its last registered graph is destroyed; each capture_begin fills every
  registered state's pair with its seed and 0, before it checks the stream;
- torch 2.12 and 2.13 (CUDAGeneratorState::init_capture_state, keyed by capture id): one pair
  per (state, capture), made by capture_begin once the capture began, on the default stream (out
  of the capture's pool), freed when the graph is reset or destroyed; nothing is filled then;
- from torch 2.14 (get_capture_state(id, create_if_not_found)): the pair is made at the capture's
  first draw from the state, inside the random kernel, on the default stream. No dispatch mode
  sees those two `empty` calls: a mode's `__torch_dispatch__` runs with the mode off the stack, so
  when the kernel runs every mode is off it.

Each build fills the pair of each state a graph drew from (a whole-graph increment that is not 0)
with the state's seed and offset at every replay, before the launch, on the replay's stream
(replay_prologue / setup_for_replay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Hashable

import torch

from harness import torch_internals

# torch 2.12 keyed the generators' capture state by capture id (pytorch/pytorch#176752); no
# Python name came with it, `UntypedStorage._swap_data_ptr_` came in the same release.
PAIR_PER_STATE = torch_internals.optional_name("storage_swap_data_ptr") is None
# torch 2.14 made the pair at a capture's first draw; Generator.philox_state came with it.
PAIR_AT_FIRST_DRAW = hasattr(torch.Generator, "philox_state")

_INT64 = 1 << 64


@dataclass(frozen=True)
class HolderState:
    """A generator state as the holders see it: `key` names it (CUDA's CUDAGeneratorState
    object), `device` is where its pair lives, `seed_and_offset()` reads it now."""

    key: Hashable
    device: torch.device
    seed_and_offset: Callable[[], tuple[int, int]]


def _signed(value: int) -> int:
    """A uint64 seed or offset as `int64_t(value)` hands it to fill_."""
    return value - _INT64 if value >= _INT64 >> 1 else value


def made_pair(device: torch.device) -> tuple:
    """`at::empty({1}, kLong on device)` twice, dispatched: on the current stream."""
    return tuple(torch.empty(1, dtype=torch.int64, device=device) for _ in range(2))


def _normal_pair(make: Callable[[torch.device], tuple], device: torch.device) -> tuple:
    """`make(device)` with inference mode off, as every build makes its pair (under
    `c10::InferenceMode guard(false)`, pytorch/pytorch#172706): a pair made inside an
    inference_mode block is filled outside it, by a later capture or a replay."""
    with torch.inference_mode(False):
        return make(device)


class GraphRngHolders:
    """One device set's holders. `hidden_pair(device)` makes a pair out of every dispatch mode's
    sight on the device's default stream (the host's: the first draw's pair of torch 2.14);
    `default_stream(device)` is the stream torch 2.12-2.13 make their pairs on; `untracked()`
    a context in which the device's stream tracking judges no op: the fills of a pair on one
    stream at capture and on another at replay are ordered by nothing a user could write, and
    no user code reaches the pair (CUDA's own, PyTorch's bookkeeping)."""

    def __init__(self, hidden_pair: Callable[[torch.device], tuple],
                 default_stream: Callable[[torch.device], Any],
                 untracked: Callable[[], ContextManager],
                 made_pair: Callable[[torch.device], tuple] = made_pair) -> None:
        self._hidden_pair = hidden_pair
        self._made_pair = made_pair
        self._default_stream = default_stream
        self._untracked = untracked
        # up to torch 2.11: state key -> (registered graph keys, pair)
        self._per_state: dict[Hashable, tuple[set, tuple]] = {}
        # from torch 2.12: graph key -> {state key: pair}
        self._per_capture: dict[int, dict[Hashable, tuple]] = {}
        # graph key -> {state key: state}: what each replay of the graph fills, in draw order
        self._drawn: dict[int, dict[Hashable, HolderState]] = {}

    # --- capture ------------------------------------------------------------------------------

    def register(self, graph: int, state: HolderState) -> None:
        """Up to torch 2.11, CUDAGeneratorState::register_graph: the state's first live graph
        makes its pair, on the current stream."""
        if not PAIR_PER_STATE:
            return
        graphs, pair = self._per_state.get(state.key, (set(), ()))
        if not graphs:
            pair = _normal_pair(self._made_pair, state.device)
        graphs.add(graph)
        self._per_state[state.key] = (graphs, pair)

    def capture_prologue(self, graph: int, states: list[HolderState]) -> None:
        """capture_begin before its stream check: up to torch 2.11 each state registers the graph
        and has its pair filled with its seed and 0 (CUDAGeneratorState::capture_prologue)."""
        self._drawn.pop(graph, None)
        if not PAIR_PER_STATE:
            return
        for state in states:
            self.register(graph, state)
        for state in states:
            self._fill(self._per_state[state.key][1], state.seed_and_offset()[0], 0)

    def capture_began(self, graph: int, states: list[HolderState]) -> None:
        """capture_begin once the capture began: torch 2.12 and 2.13 make each state's pair for
        this capture on the default stream (CUDAGeneratorState::init_capture_state)."""
        if PAIR_PER_STATE or PAIR_AT_FIRST_DRAW:
            return
        pairs = self._per_capture.setdefault(graph, {})
        for state in states:
            if state.key not in pairs:
                with torch.cuda.stream(self._default_stream(state.device)):
                    pairs[state.key] = _normal_pair(self._made_pair, state.device)

    def drew(self, graph: int, state: HolderState) -> None:
        """A random op of graph `graph`'s capture drew from `state`: its replays fill the state's
        pair; from torch 2.14 the capture's first draw from it makes the pair."""
        self._drawn.setdefault(graph, {}).setdefault(state.key, state)
        if PAIR_AT_FIRST_DRAW:
            pairs = self._per_capture.setdefault(graph, {})
            if state.key not in pairs:
                pairs[state.key] = _normal_pair(self._hidden_pair, state.device)

    # --- replay -------------------------------------------------------------------------------

    def replay_prologue(self, graph: int) -> None:
        """Before the launch: each state the graph drew from has its pair filled with its seed
        and offset now, on the current stream."""
        for state in self._drawn.get(graph, {}).values():
            pair = self._pair(graph, state.key)
            if pair:
                self._fill(pair, *state.seed_and_offset())

    def _fill(self, pair: tuple, seed: int, offset: int) -> None:
        with self._untracked():
            pair[0].fill_(_signed(seed))
            pair[1].fill_(_signed(offset))

    def _pair(self, graph: int, key: Hashable) -> tuple:
        if PAIR_PER_STATE:
            return self._per_state.get(key, ((), ()))[1]
        return self._per_capture.get(graph, {}).get(key, ())

    # --- end of a graph -----------------------------------------------------------------------

    def graph_reset(self, graph: int) -> None:
        """CUDAGraph::reset: from torch 2.12 the graph's capture state goes with its pairs."""
        self._drawn.pop(graph, None)
        self._per_capture.pop(graph, None)

    def graph_destroyed(self, graph: int) -> None:
        """~CUDAGraph: up to torch 2.11 each state unregisters it, and the last graph of a state
        frees its pair; later builds free the graph's own pairs (its reset)."""
        self.graph_reset(graph)
        for key, (graphs, _) in list(self._per_state.items()):
            graphs.discard(graph)
            if not graphs:
                del self._per_state[key]
