"""e. The gates that keep the warmup-only pass: one reason each, none for the plain case."""

from __future__ import annotations

import logging

import pytest

from harness.runtime.decode.decoder_graphs import CaptureFeatures, DecoderGraphs


@pytest.mark.parametrize("features, reason", [
    (CaptureFeatures(lora_graphs=True), "LoRA graphs are captured"),
    (CaptureFeatures(tunes_kernels_in_warmup=True), "kernels are tuned in the warmup-only pass"),
    (CaptureFeatures(pipeline_parallel_size=2), "pipeline parallelism (2 stages)"),
])
def test_each_feature_gate_gives_its_reason(make_engine, features, reason):
    engine = make_engine(single_pass_capture=True, capture_features=features)
    blocker = engine.decode_graphs.single_pass_blocker()
    assert blocker is not None and reason in blocker


def test_the_plain_case_has_no_blocker(make_engine):
    assert make_engine(single_pass_capture=True).decode_graphs.single_pass_blocker() is None


def test_graphs_already_captured_block_the_single_pass(make_engine):
    engine = make_engine(single_pass_capture=True)
    engine.decode_graphs.warmup_and_capture("serve")
    assert "decode graphs are already captured (decode[bs=1,greedy]" in engine.decode_graphs.single_pass_blocker()


def test_a_subclass_that_opts_out_blocks_the_single_pass(make_engine):
    class NoSinglePass(DecoderGraphs):
        supports_single_pass_capture = False

    engine = make_engine(single_pass_capture=True)
    graphs = NoSinglePass(engine, engine.backend, (2, 1), stats=engine._stats, max_num_tokens=64,
                          single_pass=True)
    assert graphs.single_pass_blocker() == "NoSinglePass sets supports_single_pass_capture = False"


def test_a_blocked_single_pass_logs_its_reason_and_keeps_two_passes(make_engine, caplog):
    engine = make_engine(single_pass_capture=True, capture_features=CaptureFeatures(lora_graphs=True))
    with caplog.at_level(logging.WARNING, logger="harness.runtime.decode.decoder_graphs"):
        engine.prepare_graphs()
    serve = engine.capture_reports[-1]
    assert serve.blocker and not serve.single_pass_tried and serve.passes == 2
    assert "single_pass_capture is ignored: LoRA graphs are captured" in caplog.text
    assert dict(engine.stats.capture_passes) == {"estimate": 2, "serve": 2}
