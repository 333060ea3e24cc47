"""Small language-model data the tests build themselves: a word-level tokenizer trained here on the
texts it will encode (tens of tokens, so tiny random causal LMs stay tiny)."""


def word_tokenizer(texts: list[str], path: str, vocab_size: int = 50) -> str:
    """Train a whitespace word-level tokenizer (``<pad>``, ``<unk>``, ``</s>`` and the most frequent
    words) on ``texts`` and save it as a transformers tokenizer at ``path``; returns ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.decoder = decoders.WordPiece()
    raw.train_from_iterator(texts, trainers.WordLevelTrainer(vocab_size=vocab_size,
                                                             special_tokens=["<pad>", "<unk>", "</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", unk_token="<unk>", eos_token="</s>") \
        .save_pretrained(path)
    return path
