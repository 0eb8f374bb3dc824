"""Capture lint: every hazard of a callable in one pass, each named with its source line; clean on
the reference runtime's decode step; the hazard of a transformers model the audit fails."""

from __future__ import annotations

import inspect
import textwrap
import warnings

import pytest
import torch

from harness import cli
from harness.check import capture_lint
from harness.check.lint import DYNAMIC_SHAPE, HOST_COPY, HOST_DATA, HOST_SYNC, RANDOM, REFUSED
from harness.runtime.scheduler import Scheduler, Sequence


def planted(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    n = int(x.sum())                   # host sync
    picked = torch.nonzero(x > 3)      # data-dependent shape
    offsets = torch.tensor([1.0, 2.0])  # host data
    noise = torch.rand(2)              # random
    first = x.tolist()[0]              # host sync that skips the dispatcher
    torch.add(x, 1, out=out)           # out= of the wrong size: refused
    return x[:n] + picked.sum() + offsets.sum() + noise.sum() + first


def _line_of(text: str) -> int:
    source, start = inspect.getsourcelines(planted)
    return start + next(i for i, line in enumerate(source) if text in line)


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_every_hazard_of_a_planted_function_in_one_pass():
    x, out = torch.arange(8.0), torch.empty(3)
    report = capture_lint(lambda: planted(x, out))
    assert not report.clean and report.stopped is None
    assert report.kinds() == {HOST_SYNC, DYNAMIC_SHAPE, HOST_DATA, RANDOM, REFUSED}, str(report)
    expected = {
        HOST_SYNC: "int(x.sum())", DYNAMIC_SHAPE: "torch.nonzero", HOST_DATA: "torch.tensor([1.0, 2.0])",
        RANDOM: "torch.rand(2)", REFUSED: "out=out",
    }
    for kind, text in expected.items():
        wheres = [h.where for h in report.hazards if h.kind == kind]
        assert any(f"test_lint.py:{_line_of(text)}:" in w for w in wheres), (kind, wheres)
    assert any(h.op == "Tensor.tolist" and f":{_line_of('x.tolist()')}:" in h.where for h in report.hazards)


def test_lint_runs_the_eager_values_past_a_sync():
    x = torch.arange(8.0)
    seen = []

    def step():
        n = int((x > 5).sum())  # 2 in eager; capture alone would read poison here
        seen.append(n)
        return x[:n] * 2

    report = capture_lint(step)
    assert seen == [2]
    assert [h.kind for h in report.hazards] == [HOST_SYNC]


def test_external_memory_is_listed_with_its_path_and_parameters_are_not(tiny_hf_model):
    from harness.adapters.transformers import TransformersRuntime

    runtime = TransformersRuntime(tiny_hf_model, max_cache_len=32)
    report = capture_lint(runtime.decode_step(2), name="tiny llama decode")
    assert report.clean, str(report)
    names = {e.name for e in report.external}
    for suffix in (".input_ids", ".position_ids", ".cache.layers[0].keys", ".cache.layers[0].cumulative_length"):
        assert any(n.endswith(suffix) for n in names), (suffix, names)
    assert not any("weight" in n for n in names)


def test_reference_runtime_decode_step_is_clean(engine_factory, grounding_requests):
    engine = engine_factory()
    scheduler = Scheduler(engine.kv_cache.allocator, max_batch_size=8, max_num_tokens=256, block_size=16)
    for index, request in enumerate(grounding_requests[:3]):
        scheduler.add(Sequence(index, request))
    with torch.inference_mode():
        batch = scheduler.schedule()
        engine.prepare_padded(batch.spans, input_ids=batch.input_ids)
        engine.model(engine.input_ids, engine.metadata, engine.kv_cache)
        for sequence in batch.sequences:
            sequence.tokens.append(1)
        scheduler.finish_step(batch)
        batch = scheduler.schedule()
        assert batch.kind == "decode"
        engine.prepare_padded(batch.spans, input_ids=batch.input_ids)
        report = capture_lint(lambda: engine.model(engine.input_ids, engine.metadata, engine.kv_cache),
                              context=(engine,))
    assert report.clean, str(report)
    names = {e.name for e in report.external}
    assert {"Engine.input_ids", "Engine.kv_cache.tensor"} <= names, names
    # The metadata's buffers are views of one storage, reported once under a public buffer's name.
    metadata_names = {n for n in names if n.startswith("Engine.metadata.")}
    assert len(metadata_names) == 1 and not metadata_names.pop().startswith("Engine.metadata._"), names


def test_lint_names_the_sync_of_a_model_the_audit_fails():
    from harness.adapters.transformers import TransformersRuntime
    from harness.audit.tiny import Architecture, build_tiny

    model = build_tiny(Architecture("opt", "OPTForCausalLM"), torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = capture_lint(TransformersRuntime(model, max_cache_len=32).decode_step(2))
    syncs = [h for h in report.hazards if h.kind == HOST_SYNC]
    assert syncs and "models/opt/modeling_opt.py" in syncs[0].where, str(report)


def rope_rebuilt_on_the_host(x: torch.Tensor) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
    return x * inv_freq.to(x.device)


def test_a_host_tensor_moved_to_the_device_is_named_on_a_cpu_device():
    # On a cpu device the copy itself is invisible; how the tensor was made tells (host_tensors.py).
    x = torch.ones(2, 4)
    report = capture_lint(lambda: rope_rebuilt_on_the_host(x))
    assert report.kinds() == {HOST_COPY}, str(report)
    assert "inv_freq.to(x.device)" in report.hazards[0].where, str(report)
    assert report.stopped is None


@pytest.mark.gpu
def test_host_copy_is_named_on_cuda():
    buffer = torch.zeros(4, device="cuda")
    host = torch.ones(4)
    report = capture_lint(lambda: buffer.copy_(host), device="cuda")
    assert HOST_COPY in report.kinds(), str(report)


def test_cli_lint_exits_1_on_hazards_and_0_when_clean(tmp_path, monkeypatch, capsys):
    (tmp_path / "lint_me.py").write_text(textwrap.dedent("""
        import torch
        x = torch.arange(4.0)
        def bad():
            return x[: int(x.sum())]
        def make_good():
            y = torch.ones(3)
            return lambda: y * 2
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["lint", "lint_me:bad"]) == 1
    assert "host sync: aten._local_scalar_dense.default" in capsys.readouterr().out
    assert cli.main(["lint", "--factory", "lint_me:make_good"]) == 0
    assert "clean" in capsys.readouterr().out
    assert cli.main(["lint", "lint_me"]) == 2
