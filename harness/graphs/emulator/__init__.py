"""The emulator's internals: the recorder that captures without running (`recorder.py`), op
classification (`opinfo.py`), the pool arena (`pool.py`), memory a graph reads but does not own
(`external.py`), generator state (`rng.py`), host reads and host tensors (`host_guard.py`,
`host_tensors.py`), ops whose CPU kernel syncs where CUDA's does not (`cuda_paths.py`), the
capture flag and op names (`capture_flag.py`, `op_tracker.py`), and the user's line in errors
(`callsite.py`). The backend built on them is `harness.graphs.emulated`."""
