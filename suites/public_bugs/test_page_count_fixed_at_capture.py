"""A paged-attention decode graph captured with one KV page count and replayed with another
(TensorRT-LLM #15556: a FlashInfer graph captured with one page count and replayed with another
hung: https://github.com/NVIDIA/TensorRT-LLM/pull/15556). The runtime plans each step on the host
and writes the page table into the captured buffer, as it should, but the kernel slices the table
by the host page count of the plan (`indices[:num_pages]`): the capture keeps the slice it saw. A
replay with more pages never reads the new ones; one with fewer pages reads a stale entry the last
plan left behind the live ones (another request's page). Nothing to refuse (CUDA replays the
captured slice too): the output differs from eager's, and `explain_against_eager` names the
gather and the host value frozen at capture. Fixed: the kernel reads the whole table and masks it
with the page count the plan writes into a device tensor."""

from __future__ import annotations

import pytest
import torch

from harness.check.causes import HOST_VALUE_FROZEN
from harness.check.explain_cuda import explain_against_eager

MAX_PAGES = 4
PAGE = 4


class PagedDecode:
    def __init__(self, *, count_on_device: bool) -> None:
        self.count_on_device = count_on_device
        # page p holds p + 1 in each slot
        self.pages = (torch.arange(8, device="cuda").float() + 1).unsqueeze(1).repeat(1, PAGE)
        self.indices = torch.zeros(MAX_PAGES, dtype=torch.long, device="cuda")
        self.num_pages = 0  # the host's plan
        self.num_pages_device = torch.zeros((), dtype=torch.long, device="cuda")
        self.slots = torch.arange(MAX_PAGES, device="cuda")
        self.out = torch.zeros((), device="cuda")

    def plan(self, page_ids: list[int]) -> None:
        self.indices[:len(page_ids)].copy_(torch.tensor(page_ids))
        self.num_pages = len(page_ids)
        self.num_pages_device.fill_(len(page_ids))

    def attend(self) -> None:
        if self.count_on_device:
            live = (self.slots < self.num_pages_device).unsqueeze(1)
            self.out.copy_(torch.where(live, self.pages[self.indices], 0.0).sum())
        else:
            self.out.copy_(self.pages[self.indices[:self.num_pages]].sum())

    def graphed(self, plans: list[list[int]]) -> list[float]:
        self.plan(plans[0])
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.attend()
        outs = []
        for page_ids in plans[1:]:
            self.plan(page_ids)
            graph.replay()
            outs.append(self.out.item())
        return outs

    def eager(self, plans: list[list[int]]) -> list[float]:
        outs = []
        for page_ids in plans[1:]:
            self.plan(page_ids)
            self.attend()
            outs.append(self.out.item())
        return outs


# captured with two pages; replayed with three, then with one (entries 1 and 2 left from before)
PLANS = [[0, 1], [2, 3, 4], [5]]
EAGER = [PAGE * (3 + 4 + 5), PAGE * 6]


def test_replays_with_another_page_count_read_the_captured_slice():
    assert PagedDecode(count_on_device=False).eager(PLANS) == EAGER
    graphed = PagedDecode(count_on_device=False).graphed(PLANS)
    assert graphed == [PAGE * (3 + 4), PAGE * (6 + 4)]  # page 4 never read; stale page 3 read


@pytest.mark.explains_against_eager
def test_explain_names_the_gather_and_the_frozen_page_count():
    found = explain_against_eager(lambda: PagedDecode(count_on_device=False).graphed(PLANS),
                                  lambda: PagedDecode(count_on_device=False).eager(PLANS))
    assert found.diverged, found
    assert "self.indices[:self.num_pages]" in found.where, found
    assert found.cause is not None and found.cause.kind == HOST_VALUE_FROZEN, found.cause


def test_a_page_count_on_the_device_replays_every_plan_as_eager():
    assert PagedDecode(count_on_device=True).graphed(PLANS) == EAGER
