"""Shared frozen computation for ``peft: head``: the backbone runs once per input, not once per step.

When only the new head trains, everything below it is a fixed function of the input. Its outputs
(the *features*) are computed once, in eval mode (no dropout on a frozen network, as a linear probe
does), for every example of every split, kept on disk under ``$DPTUNE_CACHE_DIR/features`` and in
memory, and shared by every trial that asks for the same backbone and data. A trial then trains the
head on the features: its per-step cost is the head's.

The key is a hash of everything the features depend on: the frozen weights themselves (so a
random-initialised backbone with another seed, another checkpoint or another model option is
another entry), the model class and the cut, the library versions, device type and dtype, and the
inputs of every split (token ids and masks, tensors, or a datasets fingerprint with the transform):
a change of any of them computes again. Inputs that cannot be fingerprinted (planted audit
examples) are computed in memory for that trial only.

Where the cut lies is per family (``FEATURE_CUTS``): HF sequence classifiers whose head reads the
first token (BERT, DistilBERT, RoBERTa, …) cut at the base model's output, keeping its first
position and its pooled output; timm models cut at ``forward_head(pre_logits=True)``. A cut is
used only if no parameter below it trains and if, on the first examples, the head on the features
gives the model's own logits (eval mode); otherwise the trial runs uncached, with a warning saying
why.
"""
from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

from .engine.batching import Inputs, model_outputs, to_device
from .data.splits import DatasetSplits, labels_of, take
from .data.tensor_cache import cached_tensors

#: Examples per forward pass of the frozen backbone.
FEATURE_BATCH = 64
#: Bump when the way features are computed changes, so stale disk entries are never reused.
FEATURES_VERSION = "features-1"
#: Examples the first-batch check compares (model logits against head-on-features logits).
CHECK_EXAMPLES = 4
#: Feature sets a process keeps in memory (oldest dropped first): a sweep's trials interleave their
#: seeds, each with its own split, hence its own features.
MEMORY_KEPT = 8

_memory: dict[str, dict[str, torch.Tensor]] = {}


@dataclass
class FeatureCut:
    """Where a model splits into a frozen part and a trained head: ``frozen`` (the modules below the
    cut), ``features(inputs)`` (what the frozen part outputs; call it in eval mode), ``make_head()``
    (a module from features to logits holding every trainable parameter; it may take the frozen part
    out of the model) and ``restore()`` (undo that). ``above``: a module inside ``frozen`` that is
    above the cut (the head, where ``frozen`` is the whole model)."""

    name: str
    frozen: nn.Module
    features: Callable[[Inputs], torch.Tensor]
    make_head: Callable[[], nn.Module]
    restore: Callable[[], None] = lambda: None
    above: nn.Module | None = None


class _BaseOutput(nn.Module):
    """Stands in for an HF base model inside the head: returns the cached first position and pooled
    output of the current batch as the base model's output."""

    def __init__(self) -> None:
        super().__init__()
        self.current: torch.Tensor | None = None

    def forward(self, *args: object, **kwargs: object) -> object:
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        return BaseModelOutputWithPooling(last_hidden_state=self.current[:, :1], pooler_output=self.current[:, 1])


class HFHead(nn.Module):
    """An HF sequence classifier with its base model replaced by cached features ``[b, 2, H]``
    (first position, pooled output): the classifier's own forward runs on them unchanged."""

    def __init__(self, model: nn.Module, base_name: str) -> None:
        super().__init__()
        self.base = _BaseOutput()
        setattr(model, base_name, self.base)   # the frozen base leaves the model (and its memory)
        self.model = model

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        self.base.current = features
        try:
            return model_outputs(self.model, {})
        finally:
            self.base.current = None


def _hf_features(base: nn.Module) -> Callable[[Inputs], torch.Tensor]:
    def features(inputs: Inputs) -> torch.Tensor:
        out = base(**inputs)
        first = out.last_hidden_state[:, 0]
        pooled = getattr(out, "pooler_output", None)
        return torch.stack([first, first if pooled is None else pooled], dim=1)

    return features


def _hf_cut(model: nn.Module) -> FeatureCut | None:
    base_name = getattr(model, "base_model_prefix", None)
    base = getattr(model, base_name, None) if base_name else None
    if base is None or not hasattr(getattr(model, "config", None), "model_type"):
        return None
    return FeatureCut(f"hf:{base_name}", base, _hf_features(base), lambda: HFHead(model, base_name),
                      lambda: setattr(model, base_name, base))


class TimmHead(nn.Module):
    """A timm model's classifier on its pre-logits features."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(features)


def _timm_cut(model: nn.Module) -> FeatureCut | None:
    if not all(hasattr(model, a) for a in ("forward_features", "forward_head", "get_classifier")):
        return None

    def features(inputs: Inputs) -> torch.Tensor:
        return model.forward_head(model.forward_features(inputs), pre_logits=True)

    classifier = model.get_classifier()
    return FeatureCut("timm:pre_logits", model, features, lambda: TimmHead(classifier), above=classifier)


#: How each model family is cut, tried in order (the first that applies).
FEATURE_CUTS: tuple[Callable[[nn.Module], FeatureCut | None], ...] = (_hf_cut, _timm_cut)


def _digest(h: "hashlib._Hash", tensor: torch.Tensor) -> None:
    t = tensor.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def input_fingerprint(dataset: Dataset) -> str | None:
    """A digest of a split's inputs and labels, or None when they cannot be read cheaply."""
    h = hashlib.blake2b(digest_size=20)
    if isinstance(dataset, TensorDataset):
        for t in dataset.tensors:
            _digest(h, t)
    elif isinstance(dataset, Subset):
        parent = input_fingerprint(dataset.dataset)
        if parent is None:
            return None
        h.update(parent.encode())
        _digest(h, torch.as_tensor(dataset.indices))
    elif hasattr(dataset, "input_ids") and hasattr(dataset, "attention_mask"):   # tokenised text
        for t in (dataset.input_ids, dataset.attention_mask, labels_of(dataset)):
            _digest(h, t)
    elif getattr(getattr(dataset, "rows", None), "_fingerprint", None):   # HF datasets images
        h.update(f"{dataset.rows._fingerprint}|{dataset.image_column}|{dataset.transform!r}".encode())
        _digest(h, labels_of(dataset))
    else:
        return None
    return h.hexdigest()


def feature_key(cut: FeatureCut, model: nn.Module, splits: dict[str, Dataset], device: torch.device) -> str | None:
    """The cache key of ``cut``'s features on ``splits`` (None: some split has no fingerprint)."""
    import transformers

    prints = {name: input_fingerprint(ds) for name, ds in splits.items()}
    if any(p is None for p in prints.values()):
        return None
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{FEATURES_VERSION}|{type(model).__qualname__}|{cut.name}|{torch.__version__}|"
             f"{transformers.__version__}|{device.type}|{sorted(prints.items())}".encode())
    for name, tensor in sorted(cut.frozen.state_dict().items()):
        h.update(name.encode())
        _digest(h, tensor)
    return h.hexdigest()


@torch.inference_mode()
def compute_features(cut: FeatureCut, dataset: Dataset, device: torch.device) -> torch.Tensor:
    """The frozen part's outputs for every example of ``dataset``, in order (eval mode)."""
    parts = []
    cut.frozen.eval()
    try:
        for start in range(0, len(dataset), FEATURE_BATCH):
            x, _ = take(dataset, torch.arange(start, min(start + FEATURE_BATCH, len(dataset))))
            parts.append(cut.features(to_device(x, device)).float().cpu())
    finally:
        cut.frozen.train()
    return torch.cat(parts)


def cached_features(cut: FeatureCut, model: nn.Module, splits: dict[str, Dataset],
                    device: torch.device) -> tuple[dict[str, torch.Tensor], str]:
    """Every split's features and where they came from: "memory", "disk", or "computed". One
    process computes a key at a time on a machine (a file lock); the others wait and read it."""
    key = feature_key(cut, model, splits, device)

    def compute() -> dict[str, torch.Tensor]:
        return {name: compute_features(cut, ds, device) for name, ds in splits.items()}

    if key is None:
        return compute(), "computed"
    if key in _memory:
        return _memory[key], "memory"
    features, source = cached_tensors("features", key, compute, lambda stored: set(stored) == set(splits))
    while len(_memory) >= MEMORY_KEPT:
        _memory.pop(next(iter(_memory)))
    _memory[key] = features
    return features, source


def find_cut(model: nn.Module) -> tuple[FeatureCut | None, str]:
    """The cut of ``model`` below its trained head, or None and why there is none."""
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    for make in FEATURE_CUTS:
        cut = make(model)
        if cut is None:
            continue
        above = {id(p) for p in cut.above.parameters()} if cut.above is not None else set()
        frozen = {id(p) for p in cut.frozen.parameters()} - above
        if frozen & trained:
            return None, f"a parameter below the {cut.name} cut trains"
        return cut, ""
    return None, f"no feature cut is known for {type(model).__name__}"


def _logits(module: nn.Module, x: Inputs) -> torch.Tensor:
    """``module``'s logits in eval mode (no dropout), as float32."""
    module.eval()
    try:
        with torch.inference_mode():
            return model_outputs(module, x).float().cpu()
    finally:
        module.train()


def head_on_features(model: nn.Module, data: DatasetSplits,
                     device: torch.device) -> tuple[nn.Module, DatasetSplits, str] | None:
    """``peft: head``: (the head, the splits as features, where they came from), or None with a
    warning when ``model`` cannot be cut (the trial then runs the whole model every step). The
    features are checked against the model: on the first training examples the head on them must
    give the model's own logits."""
    cut, why = find_cut(model)
    if cut is not None:
        count = min(CHECK_EXAMPLES, len(data.train))
        x, _ = take(data.train, torch.arange(count))
        want = _logits(model, to_device(x, device))
        splits = {name: ds for name, ds in (("train", data.train), ("validation", data.validation),
                                            ("test", data.test)) if ds is not None}
        features, source = cached_features(cut, model, splits, device)
        head = cut.make_head().to(device)
        got = _logits(head, features["train"][:count].to(device))
        if want.shape != got.shape or not torch.allclose(want, got, rtol=1e-4, atol=1e-5):
            cut.restore()
            cut, why = None, f"the head on {cut.name} features does not give the model's logits"
    if cut is None:
        warnings.warn(f"peft head: frozen features not cached ({why}); the whole model runs every step",
                      stacklevel=2)
        return None
    as_tensors = {name: TensorDataset(features[name], labels_of(ds)) for name, ds in splits.items()}
    return head, replace(data, input_shape=tuple(features["train"].shape[1:]), **as_tensors), source
