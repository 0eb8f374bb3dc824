"""The emulated CUDA device behind `harness.emulate_cuda()`: unmodified code written against
`torch.cuda` and "cuda" tensors runs on a machine without CUDA, with CUDA's rules.

One responsibility per file: `session.py` enters and leaves the emulation (and refuses bad use);
`state.py` the device's state and the observer interface stream tracking hooks into; `device_memory.py`
which storages are device memory and which host memory is pinned; `placement.py` the
TorchFunctionMode that places every op; `transfers.py` copies between the memories and host reads;
`backward.py` autograd's products; `compiled.py` torch.compile's graphs on the device; `cuda_api.py` the replaced `torch.cuda` functions;
`cuda_streams.py` streams and events; `cuda_graph.py` `torch.cuda.CUDAGraph` on the emulator;
`tracking/` stream and race tracking (`tracking/real_streams.py` over a real GPU's streams);
`stream_races.py` `track_stream_races()`, on either;
`rules.py` CUDA's error texts; `sanitizer.py` the same graph API over a real GPU;
`capture_syncs.py` the host syncs a capture refuses; `threads.py` the device in new threads;
`pool_handles.py` CUDA's pool ids for the emulator's pools; `pool_checkpoints.py` CUDA's allocator
calls of torch's cudagraph trees (pool routing, checkpoints) over them; `device_indices.py` which
of several emulated devices a storage is on.
"""

from harness.emulation.active import emulation_active
from harness.emulation.session import emulate_cuda
from harness.emulation.stream_races import track_stream_races

__all__ = ["emulate_cuda", "emulation_active", "track_stream_races"]
