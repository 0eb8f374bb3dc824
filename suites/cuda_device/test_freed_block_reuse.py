"""A device tensor freed while another stream still reads it: on CUDA the caching allocator gives
its block back to the pool of the stream that allocated it at once, and the race is that stream's
next allocation taking the block and being touched before the read is done. A free alone, or one
whose stream waits for the reader (or the host synchronizes) before the memory is made again, is
correct. The emulated device reported the free itself, found on transformers' offloaded KV cache
(its prefetch stream waits for the default stream only before its next allocation)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import harness
from harness.emulation.tracking import RaceError, RaceKind
from suites.cuda_device._tiny_llama import prefetch_waits_for_the_offload

N = 1 << 10
ORDERS = ["wait_stream", "wait_event", "synchronize", "stream synchronize", "event synchronize"]


def _reports(program) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # races="report" also warns of each race
        with harness.emulate_cuda(device="cpu", races="report") as state:
            program()
            torch.cuda.synchronize()
            return list(state.streams_tracking.reports)


def _free_while_read(order: str, make_again: str = "full") -> None:
    """`x`, allocated on the main stream, is read on `reader` and freed; `order` says how the main
    stream comes after the read before its next allocation ("none": it does not)."""
    main, reader = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.ones(N, device="cuda")
    reader.wait_stream(main)
    with torch.cuda.stream(reader):
        total = x.sum()
        read = torch.cuda.Event()
        read.record()
    if order == "record_stream":
        x.record_stream(reader)
    del x  # back to the main stream's pool at once
    if order == "wait_stream":
        main.wait_stream(reader)
    elif order == "wait_event":
        main.wait_event(read)
    elif order == "synchronize":
        torch.cuda.synchronize()
    elif order == "stream synchronize":
        reader.synchronize()
    elif order == "event synchronize":
        read.synchronize()
    if make_again == "full":
        reused = torch.full((N,), 7.0, device="cuda")  # the main stream's next allocation
    else:  # allocated untouched, written only after the main stream waited for the reader
        reused = torch.empty(N, device="cuda")
        main.wait_stream(reader)
        reused.fill_(7.0)
    main.wait_stream(reader)
    assert total.item() == N and reused.sum().item() == 7.0 * N


@pytest.mark.parametrize("order", ORDERS)
def test_a_free_whose_stream_waits_for_the_reader_before_it_allocates_is_no_race(
        outside_emulation, order):
    assert _reports(lambda: _free_while_read(order)) == []


def test_memory_allocated_before_the_wait_and_written_after_it_is_no_race(outside_emulation):
    assert _reports(lambda: _free_while_read("none", make_again="empty")) == []


def test_a_free_reused_by_its_stream_before_the_reader_is_waited_for_is_reported(
        outside_emulation):
    reports = _reports(lambda: _free_while_read("none"))
    assert [r.kind for r in reports] == [RaceKind.FREED_IN_USE]
    text = str(reports[0])
    assert re.search(r"Freed: free \(last reference dropped\) on stream 0 at \S+"
                     r"test_freed_block_reuse\.py:\d+: del x", text), text
    assert re.search(r"Now: aten\.full\.default writes it on stream 0 at \S+:\d+: "
                     r"reused = torch\.full", text), text
    reader = re.search(r"aten\.sum\.default reads it on stream (\d+) at \S+:\d+: total = x\.sum\(\)",
                       text)
    assert reader is not None and reader.group(1) != "0", text
    assert f"tensor (shape ({N},), torch.float32)" in text, text


def test_a_free_after_record_stream_is_no_race(outside_emulation):
    assert _reports(lambda: _free_while_read("record_stream")) == []


def test_a_free_never_reused_is_no_race(outside_emulation):
    def program() -> None:
        main, reader = torch.cuda.current_stream(), torch.cuda.Stream()
        x = torch.ones(N, device="cuda")
        reader.wait_stream(main)
        with torch.cuda.stream(reader):
            x.sum()
        del x

    assert _reports(program) == []


# --- transformers' offloaded KV cache, in miniature ------------------------------------------


def _offloaded_layers(prefetch_waits: bool, layers: int = 4) -> None:
    """Each layer's keys live in pinned host memory; the prefetch stream copies the next layer's to
    the device (allocated there) while the default stream reads the current one, which is then
    dropped (transformers' offload). The prefetch stream's next allocation may take its block:
    transformers makes the prefetch stream wait for the default stream before it prefetches."""
    main, prefetch = torch.cuda.current_stream(), torch.cuda.Stream()
    offloaded = [torch.full((N,), float(i + 1)).pin_memory() for i in range(layers)]
    with torch.cuda.stream(prefetch):
        fetched = offloaded[0].to("cuda", non_blocking=True)
    sums = []
    for i in range(layers):
        main.wait_stream(prefetch)  # this layer's keys are on the device
        if prefetch_waits:
            prefetch.wait_stream(main)  # the previous layer's keys are read by now
        current = fetched
        if i + 1 < layers:
            with torch.cuda.stream(prefetch):
                fetched = offloaded[i + 1].to("cuda", non_blocking=True)
        sums.append(current.sum())  # read on the default stream
        del current  # allocated on the prefetch stream: back to its pool
    assert torch.stack(sums).tolist() == [float(N * (i + 1)) for i in range(layers)]


def test_the_offloaded_cache_pattern_runs_clean(outside_emulation):
    assert _reports(lambda: _offloaded_layers(prefetch_waits=True)) == []


def test_the_offloaded_cache_pattern_without_its_wait_is_reported(outside_emulation):
    reports = _reports(lambda: _offloaded_layers(prefetch_waits=False))
    assert reports and {r.kind for r in reports} == {RaceKind.FREED_IN_USE}
    text = str(reports[0])
    assert "del current" in text and "sums.append(current.sum())" in text, text
    assert "fetched = offloaded[i + 1].to(\"cuda\", non_blocking=True)" in text, text


def _offloading_cache_available() -> bool:
    try:
        import inspect

        from transformers import DynamicCache
    except ImportError:
        return False
    return "offloading" in inspect.signature(DynamicCache).parameters


@pytest.mark.skipif(not _offloading_cache_available(), reason="transformers without DynamicCache's offloading")
def test_transformers_offloaded_generate_agrees_with_cpu_eager_under_strict_tracking(
        outside_emulation):
    from harness.model.random_init import tiny_llama

    model = tiny_llama(seed=0, dtype=torch.float32, num_hidden_layers=3).eval()
    prompt = torch.tensor([[1, 5, 9, 3, 7, 11]])
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=6, do_sample=False).tolist()
    with harness.emulate_cuda(device="cpu", races="strict") as state:
        on_device = model.to("cuda")
        if not prefetch_waits_for_the_offload():
            # transformers 5.17: its prefetch reads the pinned copy its offload is still writing
            with torch.no_grad(), \
                    pytest.raises(RaceError, match=r"(?s)cache_utils\.py.*non_blocking"):
                on_device.generate(prompt.to("cuda"), max_new_tokens=6, do_sample=False,
                                   cache_implementation="offloaded")
            return
        with torch.no_grad():
            out = on_device.generate(prompt.to("cuda"), max_new_tokens=6, do_sample=False,
                                     cache_implementation="offloaded")
        torch.cuda.synchronize()
        assert state.streams_tracking.reports == []
        assert out.tolist() == expected
