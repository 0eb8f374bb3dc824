"""A background thread's CUDA work during a capture made in the default `capture_error_mode`
("global"): vLLM #48053, "Use capture_error_mode="thread_local" on all CUDA-graph capture paths"
(KV-offloading copy daemons, weight prefetchers and telemetry threads invalidated every capture
while they worked on streams of their own). The offload daemon copies a KV block to pinned host
memory on its own stream and synchronizes that stream to hand the block over. The copy alone would
run outside the graph; the synchronize is a potentially unsafe call, which a global capture refuses
from any thread: the daemon gets "operation not permitted when stream is capturing" and the capture
fails at its end with the invalidated-capture error, on CUDA and on the emulated device alike.
Fixed: capture with `capture_error_mode="thread_local"`, which judges the capturing thread's calls
only; the daemon's block arrives and the graph replays."""

from __future__ import annotations

import threading

import pytest
import torch

NOT_PERMITTED = "operation not permitted when stream is capturing"
INVALIDATED = "operation failed due to a previous error during capture"


class OffloadDaemon:
    """Copies KV blocks to the host on its own stream, one block when asked."""

    def __init__(self) -> None:
        self.stream = torch.cuda.Stream()
        self.kv_block = torch.arange(256, dtype=torch.float32, device="cuda")
        self.host_block = torch.zeros(256).pin_memory()
        self.asked, self.done = threading.Event(), threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.asked.wait()
        try:
            with torch.cuda.stream(self.stream):
                self.host_block.copy_(self.kv_block, non_blocking=True)
            self.stream.synchronize()  # the block is on the host: hand it over
        except RuntimeError as error:
            self.errors.append(str(error))
        finally:
            self.done.set()

    def offload_now(self) -> None:
        """Ask for one block and wait until the daemon has tried (a host handshake, no CUDA)."""
        self.asked.set()
        self.done.wait()


def _capture_while_offloading(mode: str):
    """The decode graph captured while the daemon offloads a block; the graph with the tensors it
    reads and writes, what ending the capture raised, and the daemon."""
    daemon = OffloadDaemon()
    hidden = torch.ones(64, device="cuda")
    out = torch.zeros(64, device="cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    caller_stream = torch.cuda.current_stream()
    # torch.cuda.Stream() hands out a pool of 32 streams round-robin: in a long process the
    # daemon's can be the very stream torch.cuda.graph captures on, whose synchronize every mode
    # refuses (seen once on an H100). The bug is the unsafe call from another stream.
    capture_stream = torch.cuda.Stream()
    while capture_stream == daemon.stream:
        capture_stream = torch.cuda.Stream()
    ended = None
    try:
        with torch.cuda.graph(graph, stream=capture_stream, capture_error_mode=mode):
            out.copy_(hidden * 2)
            daemon.offload_now()
            out.add_(1)
    except RuntimeError as error:
        ended = str(error)
    finally:
        daemon.asked.set()  # never leave the daemon waiting
        daemon.thread.join()
        torch.cuda.set_stream(caller_stream)  # torch.cuda.graph leaves its stream current on failure
    return (graph, hidden, out), ended, daemon


def test_the_daemons_sync_invalidates_a_global_capture():
    _, ended, daemon = _capture_while_offloading("global")
    assert len(daemon.errors) == 1 and NOT_PERMITTED in daemon.errors[0], daemon.errors
    assert ended is not None and INVALIDATED in ended, ended


def test_a_thread_local_capture_lets_the_daemon_work_and_replays():
    (graph, _hidden, out), ended, daemon = _capture_while_offloading("thread_local")
    assert ended is None and daemon.errors == [], (ended, daemon.errors)
    assert daemon.host_block.tolist() == [float(i) for i in range(256)]
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [3.0] * 64
