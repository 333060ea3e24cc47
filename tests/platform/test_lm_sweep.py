"""A whole sweep of a tiny random causal LM (Llama architecture) on real BBC headlines as the user's
own prompt/completion file, through the production path (spec → plan → Ray Tune → store →
analysis): every trial stored with its NLL per epoch and its ROUGE-L, and the optimum is the
configuration with the smallest seed-mean NLL, computed here from the stored rows."""
import json
import math

import pandas as pd
import pytest

from dptune.analysis.report import write_heatmaps
from dptune.platform.sweep.catalog import trainables_catalog
from dptune.platform.sweep.launcher import RunSettings
from dptune.platform.store.results_store import ResultsStore
from dptune.platform.sweep.driver import run_sweep
from dptune.search_spaces import load_spec, plan_sweep
from dptune.trainables.data.generation import headline_pairs
from lm_data import word_tokenizer

TINY = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1}


def test_a_causal_lm_sweep_stores_nll_curves_and_rouge_and_its_optimum_is_the_smallest_nll(local_ray, tmp_path):
    prompts, headlines = headline_pairs()
    pairs = tmp_path / "headlines.jsonl"
    pairs.write_text("\n".join(json.dumps({"article": p, "headline": h}) for p, h in zip(prompts[:96], headlines)))
    tok = word_tokenizer(prompts[:96] + headlines[:96], str(tmp_path / "tok"))
    spec = {"axes": {"epsilon": 8, "epochs": 2,
                     "backbone": {"name": "hf:llama", "weights": "random", "tokenizer": tok, **TINY},
                     "dataset": {"name": "text_pairs", "data_dir": str(pairs), "prompt_field": "article",
                                 "completion_field": "headline", "max_length": 24}},
            "clip_bound": [0.01, 10], "batch_size": [24], "seeds": [0, 1],
            "learning_rate": {"reference": 0.05, "reference_batch_size": 24, "multipliers": [1]},
            "pruning": {"min_steps": 1}, "search": {"scheduler": "none", "proxy": "off", "transfer": "off"},
            "trial": {"optimizer": "adam", "generation_examples": 4, "max_new_tokens": 4}}
    plan = plan_sweep(load_spec(spec, trainables_catalog()), trainables_catalog())
    assert (plan.metric, plan.mode, plan.num_trials) == ("test_nll", "min", 4)
    settings = RunSettings(experiment="lm", storage=str(tmp_path / "runs"), max_failures=0, verbose=0)
    outcome = run_sweep(plan, settings)
    assert (outcome.finished, outcome.errored, outcome.metric) == (4, 0, "test_nll")

    store = ResultsStore(settings.paths.store)
    rows = store.table("trials")
    assert len(rows) == 4 and set(rows["metric"]) == {"test_nll"} and set(rows["metric_mode"]) == {"min"}
    # the NLL is in its own column with its signed score; accuracy holds accuracies only (none here)
    assert (rows["score"] == -rows["test_nll"]).all() and rows["accuracy"].isna().all()
    assert rows["test_accuracy"].isna().all()
    assert rows["test_rougeL"].between(0, 1).all() and rows["test_bleu"].between(0, 1).all()
    assert (rows["test_perplexity"] - rows["test_nll"].map(math.exp)).abs().max() < 1e-6
    epochs = store.table("epochs")
    assert epochs.groupby("trial_id")["epoch"].apply(sorted).tolist() == [[1, 2]] * 4
    assert epochs["test_nll"].notna().all() and (epochs["score"] == -epochs["test_nll"]).all()
    assert epochs["accuracy"].isna().all()

    means = rows.groupby(["clip_bound", "batch_size", "learning_rate"])["test_nll"].mean()
    assert means.max() - means.min() > 1e-4   # C = 0.01 and C = 10 train differently
    smallest = means.idxmin()
    write_heatmaps(store, tmp_path / "analysis")
    optimum = pd.read_csv(tmp_path / "analysis" / "optima.csv").iloc[0]
    assert (optimum["clip_bound"], optimum["batch_size"], optimum["learning_rate"]) == pytest.approx(smallest)
    assert optimum["value"] == pytest.approx(means.min()) and math.isnan(optimum["accuracy"])


def _pairs_spec(pairs: str, tok: str, **backbone) -> dict:
    return {"axes": {"epsilon": 8, "epochs": 1,
                     "backbone": {"name": "hf:llama", "weights": "random", "tokenizer": tok, **TINY, **backbone},
                     "dataset": {"name": "text_pairs", "data_dir": pairs, "prompt_field": "article",
                                 "completion_field": "headline", "max_length": 24}},
            "clip_bound": [0.1, 10], "batch_size": [24], "seeds": [0],
            "learning_rate": {"reference": 0.05, "reference_batch_size": 24, "multipliers": [0.5, 1]},
            "pruning": {"min_steps": 1},
            "search": {"scheduler": "none", "proxy": "off", "transfer": "off", "pack": "off", "bracket": "off"},
            "trial": {"optimizer": "adam", "generation_examples": 0}}


@pytest.fixture
def headline_files(tmp_path, monkeypatch):
    """A prompt/completion file and a tokenizer in the folder the sweep runs in, named by relative paths."""
    prompts, headlines = headline_pairs()
    (tmp_path / "headlines.jsonl").write_text(
        "\n".join(json.dumps({"article": p, "headline": h}) for p, h in zip(prompts[:72], headlines)))
    word_tokenizer(prompts[:72] + headlines[:72], str(tmp_path / "tok"))
    monkeypatch.chdir(tmp_path)
    return "./headlines.jsonl", "./tok"


def test_relative_paths_in_a_spec_mean_the_same_files_in_every_trial(local_ray, tmp_path, headline_files):
    """Issue 47: `data_dir: ./pairs.jsonl` was found by the plan but read by each trial from Ray's trial
    folder, so every trial failed. Paths are read once, against the folder dptune runs in."""
    plan = plan_sweep(load_spec(_pairs_spec(*headline_files), trainables_catalog()), trainables_catalog())
    settings = RunSettings(experiment="relative", storage="runs", max_failures=0, verbose=0)
    outcome = run_sweep(plan, settings)
    assert (outcome.finished, outcome.errored, outcome.recurring) == (4, 0, None)
    rows = ResultsStore(str(tmp_path / "runs" / "relative" / "store")).table("trials")
    assert len(rows) == 4 and rows["test_nll"].notna().all()
    assert set(rows["dataset"]) == {f"text_pairs[completion_field=headline,data_dir={tmp_path / 'headlines.jsonl'},"
                                    "max_length=24,prompt_field=article]"}


def test_an_error_of_the_input_stops_the_sweep_at_its_first_trial_without_retries(local_ray, tmp_path, headline_files):
    """Issue 47: an input that only the built model can refuse (a LoRA target it does not have) ends
    the first trial with one line, is not retried (max_failures 2), and stops the sweep: at most the
    trials already running (2 CPUs) are recorded, each with the error, the rest are not run."""
    spec = _pairs_spec(*headline_files, peft="lora", lora_targets=["nonexistent_proj"])
    plan = plan_sweep(load_spec(spec, trainables_catalog()), trainables_catalog())
    assert plan.num_trials == 4
    settings = RunSettings(experiment="bad", storage=str(tmp_path / "runs"), max_failures=2, verbose=0)
    outcome = run_sweep(plan, settings)
    assert outcome.recurring is not None and "lora_targets: nonexistent_proj not found" in outcome.recurring
    ran = [r for r in outcome.results if "training_iteration" in r.metrics]   # the others were stopped before
    assert ran and all(r.metrics["error"] == outcome.recurring for r in ran)
    assert all(r.error is None for r in outcome.results)   # ended by its report: Ray Tune retried nothing
    rows = ResultsStore(settings.paths.store).table("trials")
    assert 1 <= len(rows) <= 2 and (rows["status"] == "error").all()
    assert all("nonexistent_proj" in e for e in rows["error"])
    assert outcome.unrun >= 2
