"""Benchmarks behind `harness bench NAME`: each public module here exposes `main(argv) -> int`.
Speed lives here, never in tests; results go to stdout, and are appended to a file only where
`--output FILE` says (this project keeps its own in docs/benchmarks.md)."""
