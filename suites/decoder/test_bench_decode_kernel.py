"""`harness bench capture --decode-kernel`, `--rope-kv-write` and `--decode-linear`: every engine
of the run attends decode batches with the kernel, rotates and stores K/V and runs its linear
layers the way asked for, and the run says which one served and why."""

from __future__ import annotations

import pytest

from harness.bench import capture


def test_profile_names_the_decode_kernel_that_served(capsys, graph_backend):
    assert capture.main(["--profile", "--model", "tiny", "--batch", "1", "--backend", graph_backend.name,
                         "--iters", "1", "--warmup", "0", "--decode-kernel", "torch"]) == 0
    assert "decode kernel: torch (requested)" in capsys.readouterr().out


def test_triton_where_it_cannot_run_is_refused_before_any_timing(graph_backend):
    if graph_backend.name == "cuda":
        pytest.skip("on a real CUDA device triton may run")
    with pytest.raises(ValueError, match=r"decode_kernel='triton' cannot run here"):
        capture.main(["--profile", "--model", "tiny", "--backend", graph_backend.name,
                      "--iters", "1", "--warmup", "0", "--decode-kernel", "triton"])


@pytest.mark.parametrize("mode", ["fused", "separate"])
def test_profile_runs_and_names_the_rope_kv_write_asked_for(capsys, graph_backend, mode):
    assert capture.main(["--profile", "--model", "tiny", "--batch", "1", "--backend", graph_backend.name,
                         "--iters", "1", "--warmup", "0", "--rope-kv-write", mode]) == 0
    assert f"rope + KV write: {mode} (requested" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["fused", "separate"])
def test_profile_runs_and_names_the_decode_linear_asked_for(capsys, graph_backend, mode):
    assert capture.main(["--profile", "--model", "tiny", "--batch", "1", "--backend", graph_backend.name,
                         "--iters", "1", "--warmup", "0", "--decode-linear", mode]) == 0
    assert f"decode linear: {mode} (requested" in capsys.readouterr().out
