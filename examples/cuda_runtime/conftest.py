"""Nothing of the harness is needed to run this suite on a GPU; `--emulate-cuda` (the harness's
pytest plugin) runs it on a machine without one."""

from __future__ import annotations

import pytest
import torch

PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12], [13, 14, 15]]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (or pytest --emulate-cuda)")
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def eager_tokens():
    from model_runner import ModelRunner

    return ModelRunner(enforce_eager=True).generate(PROMPTS, 6)
