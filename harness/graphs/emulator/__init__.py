"""The emulator's internals: the recorder that captures without running (`recorder.py`), op
classification (`opinfo.py`), the pool arena (`pool.py`), memory a graph reads but does not own
(`external.py`), generator state (`rng.py`), host reads and host tensors (`host_guard.py`,
`host_tensors.py`), ops whose CPU kernel syncs where CUDA's does not (`cuda_paths.py`), the
capture flag (`capture_flag.py`), the user's line in errors
(`callsite.py`), which tensors a capture treats as device memory (`memory.py`), one capture from
its beginning to its end (`capture_session.py`), and the storages each op reads and writes
(`accesses.py`). The backend built on them is `harness.graphs.emulated`; the emulated CUDA device
(`harness.emulation`) builds on them and nothing here imports it."""
