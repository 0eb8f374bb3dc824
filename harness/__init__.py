"""capture-harness: graph-capture correctness harness."""


def emulate_cuda(device: str = "auto", **options):
    """A context manager under which code written for CUDA runs unmodified.

    On a machine without a usable GPU (or with `device="cpu"`), an emulated CUDA device: tensors on
    "cuda" are CPU tensors kept apart from host memory by a registry, `torch.cuda` answers for it,
    and `torch.cuda.CUDAGraph` / `torch.cuda.graph` capture on the emulator. With a GPU (`"auto"`
    or `device="cuda"`), a graph sanitizer: real tensors and streams, emulated graphs. Options:
    `name`, `total_memory` (bytes), `capability` ((major, minor)), `multi_processor_count`,
    `device_count`. Yields the device's state (`state.observe(observer)` to hook its ops)."""
    from harness.graphs.emulator.device import emulate_cuda as _emulate_cuda

    return _emulate_cuda(device, **options)
