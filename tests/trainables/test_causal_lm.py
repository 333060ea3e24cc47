"""Causal language models under DP (generation tasks): per-example gradients of each family against a
loop, the completion loss against a hand computation, prompt/completion encoding, the embedded
GGUF model, and one-line refusals. Small random configs; the 135M model only where it is the subject."""
import importlib
import inspect
import json
import math

import pytest
import torch
from torch import nn

from dptune.errors import UserError
from dptune.schema import TrainConfig
from dptune.trainables import DPEngine
from dptune.trainables.data.generation import IGNORE, MIN_PROMPT_TOKENS, encode_pairs, text_pairs
from dptune.trainables.engine.book_keeping import BookKeepingEngine
from dptune.trainables.engine.rules.normalisation import LLAMA_RMS_NORMS
from dptune.trainables.models.catalog import create_model
from dptune.trainables.tasks import completion_nll
from dptune.trainables.training import Trainer

from lm_data import word_tokenizer
from per_example_reference import clipped_sum_loop

RTOL = 1e-7
SEQ, VOCAB = 12, 50
SMALL = {  # random-weight configs of each family, no dropout (exact comparisons)
    "llama": dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=64),   # GQA, tied
    "qwen2": dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=False, max_position_embeddings=64),  # q/k/v biases
    "gpt2": dict(n_embd=16, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
}


def small_lm(family: str, peft: str) -> nn.Module:
    return create_model(f"hf:{family}", num_classes=0, input_shape=(SEQ,), task="generation", weights="random",
                        peft=peft, vocab_size=VOCAB, **SMALL[family]).double()


def lm_batch(seed: int) -> tuple[dict, torch.Tensor]:
    """Four sequences: one full, two right-padded, one left-padded; the first 4 real tokens of each
    are its prompt (masked in the labels), padding masked too."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (4, SEQ), generator=g)
    mask = torch.ones(4, SEQ, dtype=torch.long)
    mask[1, SEQ - 3:] = 0
    mask[2, :2] = 0
    mask[3, SEQ - 5:] = 0
    labels = torch.full_like(ids, IGNORE)
    for i in range(4):
        real = mask[i].nonzero().flatten()
        labels[i, real[4:]] = ids[i, real[4:]]
    return {"input_ids": ids * mask, "attention_mask": mask}, labels


@pytest.mark.parametrize("family", sorted(SMALL))
@pytest.mark.parametrize("peft", ["lora", "full"])
def test_clipped_sums_and_norms_of_each_family_match_a_per_example_loop_in_float64(family, peft):
    torch.manual_seed(0)
    model = small_lm(family, peft)
    if peft == "lora":   # B = 0 at initialisation would leave the A factors without gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                nn.init.normal_(p, std=0.1)
    x, y = lm_batch(1)
    clip = float(clipped_sum_loop(model, x, y, 1.0, completion_nll)[1].median())
    engine = DPEngine(model, completion_nll, clip_bound=clip, noise_multiplier=0.0, expected_batch_size=1.0)
    assert isinstance(engine.norms, BookKeepingEngine)
    sums, norms = engine.clipped_sum(x, y)
    ref_sums, ref_norms = clipped_sum_loop(model, x, y, clip, completion_nll)
    assert bool((ref_norms > clip).any()) and bool((ref_norms < clip).any())
    torch.testing.assert_close(norms, ref_norms, rtol=RTOL, atol=0)
    assert sums.keys() == ref_sums.keys()
    for name, ref in ref_sums.items():
        torch.testing.assert_close(sums[name], ref, rtol=RTOL, atol=RTOL * float(ref.abs().max()) + 1e-15)
    rules = {r["rule"] for r in engine.norms.explain()}
    assert rules <= {"linear", "embedding", "normalisation"}   # RMSNorm and tied embeddings in closed form
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if peft == "lora":
        assert trainable and all("lora_" in n for n in trainable)
    else:
        assert len(trainable) == len(list(model.parameters()))


def test_the_rms_norms_the_engine_takes_in_closed_form_run_llamas_forward():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    reference = inspect.getsource(LlamaRMSNorm.forward)
    for module, name in LLAMA_RMS_NORMS.items():
        assert inspect.getsource(getattr(importlib.import_module(module), name).forward) == reference, name


def test_the_completion_loss_is_the_summed_nll_of_the_completion_tokens_computed_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 7, dtype=torch.float64)
    labels = torch.tensor([[IGNORE, IGNORE, 4, 1, 2, IGNORE], [IGNORE, 5, 5, 5, 5, 5], [IGNORE] * 6])
    expected = []
    for i in range(3):
        total = 0.0
        for t in range(1, 6):   # token t is predicted from position t - 1
            if labels[i, t] != IGNORE:
                row = logits[i, t - 1]
                total += -(float(row[labels[i, t]]) - math.log(sum(math.exp(float(v)) for v in row)))
        expected.append(total)
    torch.testing.assert_close(completion_nll(logits, labels), torch.tensor(expected, dtype=torch.float64))


class WordTokenizer:
    """A whitespace tokenizer written here (ids by first appearance), so the encoding is checked
    against words, not against another tokenizer."""

    eos_token_id, pad_token_id = 1, 0

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[self.vocab.setdefault(w, len(self.vocab) + 2) for w in t.split()] for t in texts]}


def test_prompt_and_padding_are_masked_and_over_long_examples_keep_lead_cue_and_completion():
    tok = WordTokenizer()
    long_prompt = " ".join(f"w{i}" for i in range(40)) + " Headline:"
    data, truncated, prompts = encode_pairs(["a b c Headline:", long_prompt], ["x y", "p q r"], tok, max_length=20)
    v = tok.vocab
    ids, mask = data.input_ids, data.attention_mask
    assert ids[0, :7].tolist() == [v["a"], v["b"], v["c"], v["Headline:"], v["x"], v["y"], 1]
    assert mask[0].tolist() == [1] * 7 + [0] * 13 and ids[0, 7:].tolist() == [0] * 13
    assert data.labels[0].tolist() == [IGNORE] * 4 + [v["x"], v["y"], 1] + [IGNORE] * 13
    assert truncated == 1 and int(mask[1].sum()) == 20
    kept = ids[1, :16].tolist()   # 20 tokens − the completion's 4 (3 words + end of sequence)
    tail = [v[f"w{i}"] for i in range(40 - MIN_PROMPT_TOKENS + 1, 40)] + [v["Headline:"]]
    assert kept == [v[f"w{i}"] for i in range(16 - MIN_PROMPT_TOKENS)] + tail   # the lead, then the cue
    assert data.labels[1].tolist() == [IGNORE] * 16 + [v["p"], v["q"], v["r"], 1]
    assert prompts[1] == kept


def test_user_prompt_completion_data_is_read_and_missing_fields_are_refused_in_one_line(tmp_path):
    rows = [{"source": f"table row {i} name value", "target": f"sentence {i}"} for i in range(20)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    word_tokenizer([r["source"] + " " + r["target"] for r in rows], str(tmp_path / "tok"))
    splits = text_pairs(data_dir=str(path), prompt_field="source", completion_field="target",
                        tokenizer=str(tmp_path / "tok"), max_length=16, test_size=0.25)
    assert (len(splits.train), len(splits.test), splits.task, splits.truncated) == (15, 5, "generation",
                                                                                      {"train": 0, "test": 0})
    assert set(splits.generations.references) < {r["target"] for r in rows}
    assert len(set(splits.generations.references)) == 5
    with pytest.raises(UserError, match=r"has no field\(s\) prompt, completion \(its fields: source, target\); set prompt_field"):
        text_pairs(data_dir=str(path), tokenizer=str(tmp_path / "tok"))


def test_a_model_without_a_causal_lm_head_and_mismatched_tasks_are_refused_in_one_line():
    with pytest.raises(UserError, match="a distilbert model has no causal-LM head"):
        create_model("hf:distilbert", num_classes=0, input_shape=(SEQ,), task="generation", weights="random",
                     vocab_size=VOCAB)
    with pytest.raises(UserError, match="'bbc_headlines' is a generation task .* got 'cnn'"):
        Trainer(TrainConfig(dataset="bbc_headlines", model="cnn"))
    with pytest.raises(UserError, match="'smollm2-135m' is a causal language model.*'digits' is a classification"):
        Trainer(TrainConfig(dataset="digits", model="smollm2-135m"))


def test_the_trainer_reports_nll_perplexity_truncation_and_generation_scores(tmp_path):
    """One private epoch of a tiny random Llama on 40 real headlines: the reported NLL per token
    and perplexity equal a computation here, and greedy generation is scored."""
    from dptune.trainables.data.generation import generation_splits, headline_pairs

    prompts, headlines = headline_pairs()
    tok = str(tmp_path / "tok")
    word_tokenizer(prompts[:40] + headlines[:40], tok)
    data = generation_splits("bbc_headlines", (prompts[:32], headlines[:32]), (prompts[32:40], headlines[32:40]),
                             tokenizer=tok, max_length=24)
    cfg = TrainConfig(dataset="bbc_headlines", model="hf:llama", weights="random", epsilon=8.0, batch_size=8,
                      epochs=1, learning_rate=0.01, optimizer="adam", max_new_tokens=4, device="cpu",
                      model_options={**SMALL["llama"], "tokenizer": tok})
    trainer = Trainer(cfg, data)
    metrics = trainer.run_epoch()
    assert trainer.done and metrics["truncated_train_examples"] == 32 and metrics["truncated_test_examples"] == 8
    x, y = data.test.input_ids, data.test.labels
    with torch.no_grad():
        trainer.model.eval()
        logits = trainer.model(input_ids=x, attention_mask=data.test.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    target = y[:, 1:]
    picked = logp.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1)[target != IGNORE]
    assert metrics["test_nll"] == pytest.approx(float(-picked.mean()), rel=1e-5)
    assert metrics["test_perplexity"] == pytest.approx(math.exp(metrics["test_nll"]), rel=1e-9)
    assert metrics["generated_examples"] == 8 and 0 <= metrics["test_rougeL"] <= 1 and 0 <= metrics["test_bleu"] <= 1
    assert "test_accuracy" not in metrics and metrics["epsilon_spent"] <= 8.0


def test_micro_batches_randomized_clipping_and_rmt_denoising_run_on_a_causal_lm():
    """Micro-batching leaves the clipped sum unchanged; Hutchinson's norms are unbiased estimates of
    the exact ones (k = 4096 probes: within 10%); RMT denoising post-processes the LoRA factors."""
    torch.manual_seed(0)
    model = small_lm("llama", "full")
    x, y = lm_batch(2)
    whole = DPEngine(model, completion_nll, clip_bound=0.5, noise_multiplier=0.0, expected_batch_size=1.0)
    micro = DPEngine(model, completion_nll, clip_bound=0.5, noise_multiplier=0.0, expected_batch_size=1.0,
                     max_physical_batch_size=1)
    (s_whole, n_whole), (s_micro, n_micro) = whole.clipped_sum(x, y), micro.clipped_sum(x, y)
    torch.testing.assert_close(n_micro, n_whole, rtol=1e-10, atol=0)
    for name in s_whole:
        torch.testing.assert_close(s_micro[name], s_whole[name], rtol=1e-9, atol=1e-12)
    estimated = DPEngine(model, completion_nll, clip_bound=0.5, noise_multiplier=0.0, expected_batch_size=1.0,
                         norm_estimator="hutchinson", sketch_k=4096, probes=torch.Generator().manual_seed(3))
    _, n_hutch = estimated.clipped_sum(x, y)
    assert ((n_hutch - n_whole).abs() / n_whole).max() < 0.1
    lora = small_lm("llama", "lora")
    engine = DPEngine(lora, completion_nll, clip_bound=1.0, noise_multiplier=1.0, expected_batch_size=4.0,
                      denoise="rmt", generator=torch.Generator().manual_seed(4))
    stats = engine.private_gradient(x, y)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lora.parameters() if p.requires_grad)
    assert len(stats["norms"]) == 4
