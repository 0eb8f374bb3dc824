"""capture-harness: graph-capture correctness harness."""


def emulate_cuda(device: str = "auto", *, schedule: str = "issue_order", races: str = "strict",
                 children: bool = False, **options):
    """A context manager under which code written for CUDA runs unmodified.

    On a machine without a usable GPU (or with `device="cpu"`), an emulated CUDA device: tensors on
    "cuda" are CPU tensors kept apart from host memory by a registry, `torch.cuda` answers for it,
    and `torch.cuda.CUDAGraph` / `torch.cuda.graph` capture on the emulator. With a GPU (`"auto"`
    or `device="cuda"`), a graph sanitizer: real tensors and streams, emulated graphs. Options:
    `name`, `total_memory` (bytes), `capability` ((major, minor)), `multi_processor_count`,
    `device_count`, `cuda_version` (e.g. "12.8": a CPU build's torch reports it as
    `torch.version.cuda` meanwhile, for test files gated on it; refused on a CUDA build). Yields the device's state (`state.observe(observer)` to hook its ops).

    On the emulated device every device op is issued to the current stream and tracked: a race
    between streams, or between a stream and the host (a pinned buffer rewritten before its
    non_blocking copy ran, read before its copy landed; a side stream without wait_stream; a tensor
    freed without record_stream and its memory made again; a graph replay still in flight)
    raises `RaceError` (`races="strict"`), is collected in `state.streams_tracking.reports`
    (`"report"`), or is not looked for (`"off"`); the same setting decides a replay that reads
    shared-pool memory another graph overwrote (refused, warned of, or replayed in silence with
    the values CUDA reads); in the graph sanitizer, which tracks no stream races, that replay is
    all it decides. `schedule="adversarial"` runs each stream's work as late as
    synchronization allows (a write racing with another stream's queued access runs ahead of it),
    so such a race gives the wrong values a loaded GPU gives, every time;
    `"issue_order"` (default) runs work when issued, except after `torch.cuda._sleep` on a stream.

    `children=True` (what `--emulate-cuda` gives a pytest session): child Python processes started
    meanwhile (`subprocess`, multiprocessing) enter the same emulation, each with its own emulated
    device, once they import torch; on the emulated device only."""
    from harness.emulation import emulate_cuda as _emulate_cuda

    return _emulate_cuda(device, schedule=schedule, races=races, children=children, **options)
