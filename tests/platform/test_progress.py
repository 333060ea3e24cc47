"""The sweep's one line per ended trial says whether a scheduler stopped it."""
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
