"""The dptune command line: help, a short run, and one-line errors with exit code 2."""
import argparse
import dataclasses
import io
import json
import re
import subprocess
import sys

import pytest

from dptune.cli import EXIT_USAGE, build_parser, main
from dptune.trainables.config import TrainConfig

#: The commands the README promises (``dptune --help`` lists all).
COMMANDS = ("sweep", "resume", "plan", "train", "query", "heatmap", "report")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def train_actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in subcommands()["train"]._actions}


def test_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "dptune", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    listed = set(re.findall(r"^    (\S+)  ", out.stdout, flags=re.MULTILINE))  # "    train     one DP …"
    assert set(COMMANDS) <= listed, sorted(set(COMMANDS) - listed)


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_each_command_has_its_own_help(command, capsys):
    descriptions = {name: p.description for name, p in subcommands().items()}
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0 and text.startswith(f"usage: dptune {command} ")
    squeeze = lambda t: re.sub(r"\s+", "", t)  # noqa: E731  (help wraps lines, also at hyphens)
    assert descriptions[command] and squeeze(descriptions[command]) in squeeze(text)
    assert list(descriptions.values()).count(descriptions[command]) == 1  # not another command's text


#: What `dptune train` offers, written out: the flag of every option, its default and its choices.
TRAIN_FLAGS = {
    "--dataset": "digits", "--model": "cnn", "--epsilon": 8.0, "--delta": 1e-5, "--clip-bound": 1.0,
    "--batch-size": 128, "--learning-rate": 2.0, "--epochs": 10.0, "--optimizer": "sgd", "--momentum": 0.0,
    "--weight-decay": 0.0, "--clip-fn": "flat", "--norm-estimator": "exact", "--sketch-k": None, "--denoise": None,
    "--denoise-kappa": 1.02, "--denoise-norm-correction": True, "--denoise-scope": "all", "--diagnostics": [],
    "--max-physical-batch-size": None, "--seed": 0, "--device": "auto", "--noise-multiplier": None,
    "--model-options": {}, "--peft": None, "--weights": None, "--data-dir": None, "--max-length": None,
    "--test-size": None, "--prompt-field": None, "--completion-field": None, "--generation-examples": None, "--max-new-tokens": 32,
    "--validation-fraction": 0.0, "--split-seed": None, "--score-noise": None,
    "--randomness": "reproducible", "--precision": "fp32"}
CHOICES = {"--optimizer": ["sgd", "adam", "adamw"], "--clip-fn": ["flat", "auto_s"],
           "--norm-estimator": ["exact", "hutchinson", "hutchpp"], "--denoise": ["rmt"],
           "--denoise-scope": ["all", "lora"], "--diagnostics": ["denoise_cosine"],
           "--peft": ["film", "lora", "head", "full"], "--randomness": ["reproducible", "secure"],
           "--precision": ["fp32", "bf16", "fp16"]}


def test_every_train_option_has_its_flag_default_and_choices():
    by_flag = {flag: a for a in train_actions().values() for flag in a.option_strings}
    assert {f for f in by_flag if f.startswith("--") and f not in ("--json", "--quiet", "--explain-engine", "--help", "--traceback",
                                                                     "--lr")} == set(TRAIN_FLAGS)
    for flag, default in TRAIN_FLAGS.items():
        assert by_flag[flag].default == default, flag
        assert by_flag[flag].help, f"{flag} has no help text"
        assert (by_flag[flag].choices and list(by_flag[flag].choices)) == CHOICES.get(flag), flag
    args = build_parser().parse_args(["train"])
    assert TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}) == TrainConfig()


def test_train_flags_keep_their_spellings_and_types():
    args = build_parser().parse_args(["train", "-C", "0.5", "-B", "64", "--lr", "0.1", "--epsilon", "inf",
                                      "--sketch-k", "8", "--model-options", '{"hidden": 16}'])
    assert (args.clip_bound, args.batch_size, args.learning_rate, args.sketch_k) == (0.5, 64, 0.1, 8)
    assert args.epsilon == float("inf") and args.model_options == {"hidden": 16} and args.denoise is None
    assert build_parser().parse_args(["train", "--learning-rate", "3"]).learning_rate == 3.0
    for bad in (["--epsilon", "lots"], ["--optimizer", "lamb"], ["-B", "1.5"], ["--model-options", "[1]"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["train", *bad])


def test_train_prints_epochs_and_writes_json(tmp_path):
    buf = io.StringIO()
    target = tmp_path / "run.json"
    code = main(["train", "--epochs", "2", "--epsilon", "2", "--quiet", "--json", str(target)], out=buf)
    text = buf.getvalue()
    assert code == 0 and "epoch   2/2" in text and "σ=" in text and "NOT for release" in text
    record = json.loads(target.read_text())
    assert len(record["history"]) == 2 and record["history"][-1]["epsilon_spent"] <= 2.0


def test_bad_argument_is_one_line_not_a_traceback():
    out = subprocess.run([sys.executable, "-m", "dptune", "train", "--dataset", "nope"], capture_output=True,
                         text=True)
    assert out.returncode == EXIT_USAGE
    assert out.stderr.strip().count("\n") == 0 and "dataset must be one of" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_bug_is_told_apart_from_a_user_error(tmp_path, monkeypatch, capsys):
    """A user error is one line and exit 2; anything else is called a bug (exit 1) with a pointer to
    --traceback, which shows it in full."""
    from dptune.platform.store import query
    from dptune.platform.store.results_store import ResultsStore

    ResultsStore(str(tmp_path / "store")).write_trial({"trial_id": "t1", "accuracy": 0.5})
    store = str(tmp_path / "store")
    assert main(["query", "DROP TABLE trials", "--store", store]) == EXIT_USAGE
    assert "refused" in capsys.readouterr().err
    assert main(["query", "SELECT 1", "--store", str(tmp_path / "missing")]) == EXIT_USAGE
    assert "no results store" in capsys.readouterr().err

    def broken(*args, **kwargs):
        raise KeyError("an index the code got wrong")

    monkeypatch.setattr(query, "run_query", broken)
    assert main(["query", "SELECT 1", "--store", store]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dptune query: internal error: KeyError:") and "--traceback" in err
    assert "bug in dptune" in err and "Traceback" not in err
    with pytest.raises(KeyError, match="an index the code got wrong"):
        main(["--traceback", "query", "SELECT 1", "--store", store])
    # the hint followed literally: the flag after the command (issue 33, item 6)
    with pytest.raises(KeyError, match="an index the code got wrong"):
        main(["query", "SELECT 1", "--store", store, "--traceback"])
    assert main(["query", "SELECT 1", "--store", store]) == 1       # and without it, still one line


@pytest.mark.parametrize("content", [b"\xff\xfe\x00a\x00x\x00e\x00s", "axes: {epsilon: 1}\n# caf\xe9\n".encode("latin-1")])
def test_a_spec_that_is_not_utf8_text_is_refused_in_one_line(tmp_path, capsys, content):
    """Issue 33, item 6: a binary or latin-1 spec file is a user error (exit 2, one line naming the file
    and the first bad byte), not an internal error."""
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    assert main(["plan", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{path}: not UTF-8 text (byte 0x" in err
