"""On a real GPU emulate_cuda() is the graph sanitizer, which has no stream schedule and no
emulated device properties: asking for them there is refused, not ignored. (`races` is taken: it
tracks no stream races, but the setting decides a replay that reads shared-pool memory another
graph overwrote; test_shared_pool_replay_order.py.) And the text-level choices the plugin and the
lists accept are the emulation's own."""

from __future__ import annotations

import pytest
import torch

import harness
from harness import device_options
from harness.emulation.tracking.observer import RACE_MODES
from harness.emulation.tracking.schedule import SCHEDULES


@pytest.mark.parametrize("options, named", [
    ({"schedule": "adversarial"}, "schedule='adversarial'"),
    ({"total_memory": 8 << 30}, "total_memory=8589934592"),
], ids=["schedule", "total_memory"])
def test_the_sanitizer_refuses_what_only_the_emulated_device_has(outside_emulation, monkeypatch,
                                                                  options, named):
    if not torch.cuda.is_available():
        # What device="auto" sees on a GPU machine: the sanitizer is chosen, nothing entered yet.
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=rf"emulate_cuda\({named}\) on a real GPU: the graph "
                                         rf"sanitizer runs there"):
        with harness.emulate_cuda(**options):
            pass


@pytest.mark.gpu
def test_on_a_gpu_the_sanitizer_with_defaults_still_enters(outside_emulation):
    with harness.emulate_cuda() as state:
        assert state.kind == "cuda"


def test_the_options_module_offers_the_emulations_choices():
    assert device_options.SCHEDULES == SCHEDULES and device_options.RACE_MODES == RACE_MODES


@pytest.mark.parametrize("text, size", [("8GiB", 8 << 30), ("512MiB", 512 << 20), ("16GB", 16 * 10**9),
                                        ("1.5G", 1_500_000_000), (4096, 4096), (" 2 TiB ", 2 << 40)])
def test_sizes_parse(text, size):
    assert device_options.parse_size(text, where="--emulate-cuda-memory") == size


@pytest.mark.parametrize("text", ["8 gigs", "GiB", "-1GiB", "0", True, "8GiBs"])
def test_a_bad_size_names_itself(text):
    with pytest.raises(device_options.DeviceOptionError, match=rf"^--emulate-cuda-memory {text!r}"):
        device_options.parse_size(text, where="--emulate-cuda-memory")
