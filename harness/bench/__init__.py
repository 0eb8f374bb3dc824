"""Benchmarks behind `harness bench NAME`: each public module here exposes `main(argv) -> int`.
Speed lives here, never in tests; results are appended to docs/benchmarks.md."""
