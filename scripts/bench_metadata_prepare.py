"""Host microseconds of AttentionMetadata.prepare per call, for the batches a serving loop builds.

    .venv/bin/python scripts/bench_metadata_prepare.py [--device cuda] [--number 20000]
        [--implementation FILE]

The metadata is sized like `harness bench capture`'s engine (64 sequences, 128 token rows, 8 blocks
of 16 per sequence). Each case runs with and without padding; the best of 5 repeats is printed.
`--implementation` times the AttentionMetadata of another copy of harness/ops/metadata.py (an
earlier commit's, from `git show COMMIT:harness/ops/metadata.py > FILE`) on the same batches.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import timeit

from harness.ops import AttentionMetadata, SequenceSpan

MAX_BATCH, MAX_TOKENS, BLOCKS, BLOCK_SIZE = 64, 128, 8, 16
PAD_SLOT = 1000 * BLOCK_SIZE


def decodes(count: int, first_block: int = 0) -> list[SequenceSpan]:
    return [SequenceSpan(40 + i % 7, 1, tuple(range(first_block + 3 * i, first_block + 3 * i + 3)))
            for i in range(count)]


def cases() -> list[tuple[str, list[SequenceSpan], int | None, int | None]]:
    prefills = [SequenceSpan(16, 16, (200,)), SequenceSpan(20, 12, (201, 202))]
    mixed = prefills + decodes(6)
    return [
        ("1 decode", decodes(1), None, None),
        ("1 decode padded to 8", decodes(1), 8, 8),
        ("8 decodes", decodes(8), None, None),
        ("8 decodes padded to 16", decodes(8), 16, 16),
        ("64 decodes", decodes(64), None, None),
        ("64 decodes padded to 128 tokens", decodes(64), 128, 64),
        ("prefill of 16", [SequenceSpan(16, 16, (5,))], None, None),
        ("prefill of 16 padded to 32", [SequenceSpan(16, 16, (5,))], 32, 4),
        ("2 prefills + 6 decodes", mixed, None, None),
        ("2 prefills + 6 decodes padded", mixed, 64, 16),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--implementation", help="another metadata.py to time instead")
    args = parser.parse_args()
    metadata_class = AttentionMetadata
    if args.implementation:
        spec = importlib.util.spec_from_file_location("timed_metadata", args.implementation)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while defining
        spec.loader.exec_module(module)
        metadata_class = module.AttentionMetadata
    md = metadata_class(MAX_BATCH, MAX_TOKENS, BLOCKS, BLOCK_SIZE, PAD_SLOT, device=args.device)
    print(f"{args.implementation or 'harness.ops.metadata'} on {args.device}")
    for name, spans, tokens, seqs in cases():
        def call() -> None:
            md.prepare(spans, num_tokens=tokens, num_seqs=seqs)
        best = min(timeit.repeat(call, number=args.number, repeat=5)) / args.number
        print(f"{name:34s} {best * 1e6:8.2f} us")


if __name__ == "__main__":
    main()
