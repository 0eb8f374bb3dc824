"""Runtimes we did not write, behind the same `generate(requests) -> list[Generation]` protocol
(`harness.records.Runtime`). They use `harness.graphs` and `harness.records` only, so the checks
compare them with the reference engine without either knowing of the other."""
