"""Bad input to any `harness` verb ends in one line naming the bad value and what is accepted, exit 2;
a lint target that raises is exit 3 naming the file. Also the CLI's small promises to CI users:
--version, bench --help, bench writing only where --output says, audit --arch in any case and --list,
lint --json, and a user's xdist choice after `--` winning over the runner's -n."""

import json
import sys

import pytest
import torch

from harness.cli import main
from harness.testdb import parse_line
from harness.testdb.runner import Invocation, pytest_command
from fixtures.emulated_device import skip_unless_the_emulated_device_can_be_entered

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]\n")
    (tmp_path / "object.json").write_text('{"meta": 1}\n')
    (tmp_path / "broken.json").write_text("{not json\n")
    (tmp_path / "raises_at_import.py").write_text("raise RuntimeError('planted import failure')\n")
    (tmp_path / "factory_raises.py").write_text(
        "def make_step():\n    raise ValueError('planted factory failure')\n")
    return tmp_path


# (argv with {d} for the folder of planted files, exit code, text the one line must contain)
CASES = {
    "audit resume of a missing file": (["audit", "transformers", "--resume", "{d}/missing.json"], 2,
                                       "{d}/missing.json: cannot read it"),
    "audit -j 0": (["audit", "transformers", "-j", "0"], 2, "-j/--jobs: 0 is not accepted; expected 1 or more"),
    "faults -j 0": (["faults", "-j", "0"], 2, "-j/--jobs: 0 is not accepted; expected 1 or more"),
    "audit merge of a JSON list": (["audit", "merge", "{d}/list.json"], 2, "a JSON list; expected an audit JSON"),
    "audit merge of an object that is no audit": (["audit", "merge", "{d}/object.json"], 2, "not an audit JSON file"),
    "audit merge of a missing file": (["audit", "merge", "{d}/missing.json"], 2, "cannot read it"),
    "faults merge of broken JSON": (["faults", "merge", "{d}/broken.json"], 2, "{d}/broken.json: not JSON"),
    "faults merge of an object that is no run": (["faults", "merge", "{d}/object.json"], 2,
                                                  "no backend, device, torch, runs"),
    "repro of a JSON list": (["repro", "{d}/list.json"], 2, "a JSON list, expected an object"),
    "lint of a module that raises at import": (["lint", "raises_at_import:step"], 3,
                                              "RuntimeError: planted import failure (raised at {d}/raises_at_import.py:1)"),
    "lint of a factory that raises": (["lint", "--factory", "factory_raises:make_step"], 3,
                                      "ValueError: planted factory failure (raised at {d}/factory_raises.py:2)"),
    "lint of a module that does not exist": (["lint", "no_such_module_here:step"], 2, "no_such_module_here"),
    "render of a list selecting nothing": (["testdb", "render", "l0_cpu", "--backend", "cuda"], 2,
                                           "selects no tests"),
    "an unknown option": (["run", "l0_cpu", "--no-such-option"], 2, "unrecognized arguments: --no-such-option"),
}
CUDA_CASES = {
    "faults on cuda": (["faults", "--graph-backend", "cuda"], 2, "--graph-backend cuda needs CUDA"),
    "audit on cuda": (["audit", "transformers", "--graph-backend", "cuda"], 2, "--graph-backend cuda needs CUDA"),
    "bench capture on cuda": (["bench", "capture", "--backend", "cuda"], 2, "--backend cuda needs CUDA"),
    "bench piecewise on cuda": (["bench", "piecewise", "--device", "cuda"], 2, "--device cuda needs CUDA"),
}


def check_case(case, files, monkeypatch, capsys):
    argv, code, text = case
    monkeypatch.chdir(files)
    monkeypatch.setattr(sys, "path", list(sys.path))  # lint puts the working directory on it
    assert main([a.format(d=files) for a in argv]) == code
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err  # one line
    assert text.format(d=files) in captured.err
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_line_and_its_exit_code(name, files, monkeypatch, capsys):
    sys.modules.pop("raises_at_import", None)
    check_case(CASES[name], files, monkeypatch, capsys)


@no_cuda
@pytest.mark.parametrize("name", CUDA_CASES)
def test_cuda_without_cuda_is_refused_before_any_work(name, files, monkeypatch, capsys):
    check_case(CUDA_CASES[name], files, monkeypatch, capsys)


def test_version_and_bench_help(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("harness 0.")
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "capture, emulator, explain, piecewise" in " ".join(out.split())


def test_bench_writes_nothing_without_output_and_states_its_threads(tmp_path, monkeypatch, capsys):
    skip_unless_the_emulated_device_can_be_entered()  # the emulator bench enters it
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "emulator", "--iters", "1", "--warmup", "0", "--threads", "1",
            "--case", "hand-written decode step"]
    assert main(argv) == 0
    assert list(tmp_path.iterdir()) == []
    assert "(timed with 1 torch threads)" in capsys.readouterr().out
    assert main([*argv, "--output", "mine.md"]) == 0
    assert "(timed with 1 torch threads)" in (tmp_path / "mine.md").read_text()


def test_audit_arch_is_case_insensitive_and_list_prints_model_types(capsys):
    assert main(["audit", "transformers", "--arch", "Llama", "--arch", "MISTRAL", "--list"]) == 0
    assert capsys.readouterr().out.splitlines() == ["llama  LlamaForCausalLM", "mistral  MistralForCausalLM"]


def test_lint_json_is_the_report(tmp_path, monkeypatch, capsys):
    (tmp_path / "steps_for_json.py").write_text(
        "import torch\nx = torch.ones(3)\ndef step():\n    return (x * 2).sum().item()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["lint", "--json", "steps_for_json:step"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["clean"] is False and report["target"] == "steps_for_json:step"
    assert [(h["kind"], h["where"]) for h in report["hazards"]] == [
        ("host sync", "steps_for_json.py:4: return (x * 2).sum().item()")]
    assert [e["shape"] for e in report["external"]] == [[3]]


@pytest.mark.parametrize("extra", [("-p", "no:xdist"), ("-pno:xdist",), ("-n", "3"), ("-n3",), ("--numprocesses=2",)])
def test_a_users_xdist_choice_after_double_dash_wins_over_the_runners_workers(extra, tmp_path):
    invocation = Invocation(tuple(parse_line(t) for t in ("a", "b")))
    cmd = pytest_command(invocation, backend="emulated", junit=tmp_path / "1.xml", workers=2, extra_args=extra)
    assert cmd.count("-n") == extra.count("-n") and cmd[-len(extra):] == list(extra)
    assert "-n" in pytest_command(invocation, backend="emulated", junit=tmp_path / "1.xml", workers=2,
                                  extra_args=("-x",))
