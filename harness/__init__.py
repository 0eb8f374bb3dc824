"""capture-harness: graph-capture correctness harness."""
