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
    assert (rows["accuracy"] == rows["test_nll"]).all() and rows["test_accuracy"].isna().all()
    assert rows["test_rougeL"].between(0, 1).all() and rows["test_bleu"].between(0, 1).all()
    assert (rows["test_perplexity"] - rows["test_nll"].map(math.exp)).abs().max() < 1e-6
    epochs = store.table("epochs")
    assert epochs.groupby("trial_id")["epoch"].apply(sorted).tolist() == [[1, 2]] * 4
    assert epochs["test_nll"].notna().all() and (epochs["accuracy"] == epochs["test_nll"]).all()

    means = rows.groupby(["clip_bound", "batch_size", "learning_rate"])["accuracy"].mean()
    assert means.max() - means.min() > 1e-4   # C = 0.01 and C = 10 train differently
    smallest = means.idxmin()
    write_heatmaps(store, tmp_path / "analysis")
    optimum = pd.read_csv(tmp_path / "analysis" / "optima.csv").iloc[0]
    assert (optimum["clip_bound"], optimum["batch_size"], optimum["learning_rate"]) == pytest.approx(smallest)
    assert optimum["accuracy"] == pytest.approx(means.min())
