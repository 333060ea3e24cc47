"""Issue 47: whether a figure is private is declared once, in the trial schema (dptune/schema/figures.py),
and everything that shows a figure reads it there. Every kind of trial is run and every figure it
emits — each epoch's metrics, the Tune report of a trial and of a pack — must be declared; the two
figures that went out unlabelled (``truncated_train_examples``, ``fully_clipped``) are non-private in
the trackers' labels, the store's ``figures`` view, ``dptune status`` and the report."""
import math

import pytest
import torch

from dptune.errors import UserError
from dptune.schema import FIGURES, METRICS, TrainConfig, figure, non_private
from dptune.schema.figures import PRIVACY, UndeclaredFigure


def _keys(metrics: dict, into: set) -> set:
    """Every key of a report, the members of a pack's report included."""
    for key, value in metrics.items():
        if key == "members":   # a pack's report: each member's own
            for member in value.values():
                _keys(member, into)
        else:
            into.add(key)
    return into


def _digits(**options) -> TrainConfig:
    return TrainConfig(**{"dataset": "digits", "model": "mlp", "model_options": {"hidden": 8}, "epochs": 1,
                          "batch_size": 256, "device": "cpu", **options})


def _generation(tmp_path):
    from dptune.trainables.data.generation import generation_splits, headline_pairs
    from lm_data import word_tokenizer

    prompts, headlines = headline_pairs()
    tok = word_tokenizer(prompts[:24] + headlines[:24], str(tmp_path / "tok"))
    data = generation_splits("bbc_headlines", (prompts[:16], headlines[:16]), (prompts[16:24], headlines[16:24]),
                             tokenizer=tok, max_length=16)
    cfg = TrainConfig(dataset="bbc_headlines", model="hf:llama", weights="random", epsilon=8.0, batch_size=8,
                      epochs=1, learning_rate=0.01, optimizer="adam", max_new_tokens=2, device="cpu",
                      validation_fraction=0.25,
                      model_options={"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "num_key_value_heads": 1, "tokenizer": tok})
    return cfg, data


def test_every_figure_a_trial_emits_is_declared(tmp_path):
    from dptune.platform.sweep.dp_trial import epoch_report
    from dptune.platform.sweep.dp_trial import pack_report
    from dptune.trainables.pack_training import PackTrainer
    from dptune.trainables.training import Trainer

    emitted: set = set()
    runs = [(_digits(), None), (_digits(epsilon=math.inf), None),
            (_digits(validation_fraction=0.2, denoise="rmt", diagnostics=["denoise_cosine"]), None),
            (_digits(validation_fraction=0.2, score_noise=0.01), None), _generation(tmp_path)]
    for cfg, data in runs:
        trainer = Trainer(cfg, data)
        history = trainer.fit()
        for metrics in history:
            _keys(metrics, emitted)
        metric = "selection_score" if cfg.score_noise else ("test_nll" if data is not None else "test_accuracy")
        _keys(epoch_report(history[-1], trainer.plan, trainer.trainable, history, metric), emitted)
    pack = PackTrainer([_digits(clip_bound=0.5), _digits(clip_bound=2.0, learning_rate=0.5)])
    pack.fit()
    pack.errors[1] = "stopped by the scheduler"
    _keys(pack_report(pack, "test_accuracy"), emitted)
    assert {"truncated_train_examples", "fully_clipped", "member_status", "error", "selection_score",
            "nonprivate_gradnorms", "train_time_s"} <= emitted   # the walk reaches every kind of figure
    undeclared = []
    for key in sorted(emitted):
        try:
            figure(key)
        except UndeclaredFigure:
            undeclared.append(key)
    assert not undeclared, f"figures emitted but not declared in dptune/schema/figures.py: {undeclared}"


def test_an_undeclared_figure_is_refused_and_every_declaration_has_a_class_and_reason():
    with pytest.raises(UserError, match="'made_up_figure' is not declared"):
        figure("made_up_figure")
    for declared in FIGURES:
        assert declared.privacy in PRIVACY and len(declared.reason) > 10, declared
    assert figure("nonprivate_cos_gain").name == "nonprivate_*"
    for name in ("truncated_train_examples", "fully_clipped", "train_time_s", "clipped_fraction",
                 "validation_accuracy"):
        assert figure(name).privacy == "non-private", name
    for name in ("test_accuracy", "truncated_test_examples", "selection_score"):
        assert figure(name).privacy == "private", name
    for name in ("sample_rate", "steps", "noise_multiplier", "epsilon_spent"):   # N is public by convention
        assert figure(name).privacy == "public", name


def test_what_shows_a_figure_reads_its_declaration(tmp_path):
    """The trackers' label, the store's figures view, the metric labels (status, report, closing lines)
    and `dptune status`'s note all come from the declarations."""
    from dptune.platform.store.results_store import ResultsStore
    from dptune.platform.sweep.trackers import NON_PRIVATE
    from dptune.platform.views.status import SweepStatus

    for name in non_private():
        assert name in NON_PRIVATE
    assert "truncated_train_examples" in NON_PRIVATE and "fully_clipped" in NON_PRIVATE
    view = ResultsStore(str(tmp_path / "store")).query("SELECT figure, privacy FROM figures")
    assert dict(zip(view.figure, view.privacy)) == {f.name: f.privacy for f in FIGURES}
    assert "NOT private" in METRICS["validation_accuracy"].titled and "NOT" not in METRICS["test_accuracy"].titled
    import pandas as pd

    status = SweepStatus(pd.DataFrame(columns=["cell"]), 0.0, 0.0, None, 0, 0, 0, ("validation_accuracy",))
    assert "validation accuracy is NOT differentially private" in status.render()
    assert "NOT" not in SweepStatus(pd.DataFrame(columns=["cell"]), 0.0, 0.0, None, 0, 0, 0,
                                    ("test_accuracy",)).render()
