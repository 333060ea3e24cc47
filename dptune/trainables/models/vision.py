"""Pretrained image backbones from timm, fine-tuned under DP with FiLM (default), LoRA, head or full.

The backbones of "On optimal hyperparameters for DP deep transfer learning" (ViT-Base and ViT-Tiny,
ImageNet-21k AugReg) are registered by name (in ``models``); any other timm model is
``timm:<name>``. Weights come from the hub (or the HF cache when the hub is unreachable), from a
local checkpoint (``weights=PATH``: a ``.safetensors``/``.pth``/``.bin`` file or a directory holding
``model.safetensors``), or are random (``weights="random"``, for tests and throughput). timm's own
pretrained config says how inputs must be prepared (resolution, mean/std, crop, interpolation);
:func:`vision_data_options` hands that to the image dataset loaders.
"""
from __future__ import annotations

from pathlib import Path

from torch import nn

from ...errors import UserError
from .finetuning import LoraSettings, apply_peft
from ..hub import ResourceNotFound, hub_access, unavailable

#: Linear layers that get LoRA adapters when none are named (timm ViT attention).
DEFAULT_LORA_TARGETS = ("qkv",)
#: Checkpoint files looked for in a weights directory (a timm hub snapshot holds the first).
CHECKPOINT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pth")


def _pretrained_cfg(name: str) -> dict:
    """timm's pretrained config of ``name`` (a bare architecture gets its default weights' tag)."""
    import timm
    from timm.models import get_pretrained_cfg

    if not timm.is_model(name):
        raise UserError(f"timm has no model {name!r} (list them with timm.list_models())")
    try:
        return get_pretrained_cfg(name).to_dict()
    except RuntimeError as exc:  # an unknown pretrained tag
        raise UserError(f"timm model {name!r}: {exc}") from None


def _checkpoint(name: str, weights: str | None, cfg: dict) -> Path:
    """The local checkpoint file to load: ``weights`` itself, a file inside it, or the hub's."""
    how = (f"pass weights=PATH (dptune train --weights PATH): a checkpoint file or a directory holding "
           f"{' or '.join(CHECKPOINT_FILES)}; or weights='random'")
    if weights is not None:
        path = Path(weights).expanduser()
        if path.is_dir():
            for candidate in CHECKPOINT_FILES:
                if (path / candidate).is_file():
                    return path / candidate
            raise ResourceNotFound(f"model {name!r}: no checkpoint in {path} "
                                   f"(looked for {', '.join(CHECKPOINT_FILES)})")
        if path.is_file():
            return path
        raise ResourceNotFound(f"model {name!r}: weights path {path} does not exist; {how}")
    repo = cfg.get("hf_hub_id")
    if not repo:
        raise ResourceNotFound(f"model {name!r} has no weights on the Hugging Face hub; {how}")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    with hub_access():
        for filename in ([cfg["hf_hub_filename"]] if cfg.get("hf_hub_filename") else CHECKPOINT_FILES[:2]):
            try:
                return Path(hf_hub_download(repo, filename))
            except (EntryNotFoundError, OSError):  # not cached, offline, no such repo or file
                continue
    raise unavailable("model", name, f"the weights ({repo})", how)


def create_timm_model(name: str, *, num_classes: int, input_shape: tuple[int, ...], peft: str = "film",
                      weights: str | None = None, attention: str = "eager", lora_rank: int = 8,
                      lora_alpha: float = 16.0, lora_dropout: float = 0.0, lora_targets: tuple[str, ...] | None = None,
                      **overrides: object) -> nn.Module:
    """A timm model with a new ``num_classes`` head, prepared for DP fine-tuning with ``peft``.

    ``overrides`` go to ``timm.create_model`` (e.g. ``depth=2, embed_dim=32`` for a small random
    model). ``attention``: "eager" (explicit softmax attention, which ``vmap`` batches, so the
    per-sample gradient engine runs it at full speed) or "sdpa" (``scaled_dot_product_attention``:
    faster without ``vmap``, but its CPU kernel and the fused kernels' backward have no ``vmap``
    batching rule, so per-sample gradients loop over examples).
    """
    import timm

    if attention not in ("eager", "sdpa"):
        raise UserError(f"attention must be eager or sdpa; got {attention!r}")
    cfg = _pretrained_cfg(name)
    kwargs = dict(overrides)
    if cfg.get("fixed_input_size") and tuple(input_shape[1:]) != tuple(cfg["input_size"][1:]):
        kwargs.setdefault("img_size", tuple(input_shape[1:]))
    if input_shape[0] != 3:
        kwargs.setdefault("in_chans", input_shape[0])
    if weights == "random":
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    else:
        path = _checkpoint(name, weights, cfg)
        try:
            model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(path)},
                                      num_classes=num_classes, **kwargs)
        except RuntimeError as exc:  # state-dict mismatch: another architecture's checkpoint
            raise UserError(f"weights {path} do not fit timm model {name!r}: {str(exc).splitlines()[0]}") from None
    for module in model.modules():
        if hasattr(module, "fused_attn"):  # timm's switch between the two attention paths
            module.fused_attn = attention == "sdpa"
    classifier = model.pretrained_cfg.get("classifier") or "head"
    heads = [classifier] if isinstance(classifier, str) else list(classifier)
    lora = LoraSettings(lora_rank, lora_alpha, lora_dropout, tuple(lora_targets or DEFAULT_LORA_TARGETS))
    model = apply_peft(model, peft, head=heads, lora=lora)
    return model.train()


def vision_data_options(name: str, **model_options: object) -> dict:
    """How images must be prepared for this backbone: size, mean/std, crop and interpolation from
    timm's pretrained config (``img_size`` in the model options overrides the size)."""
    cfg = _pretrained_cfg(name)
    size = model_options.get("img_size") or cfg["input_size"][-1]
    size = size[-1] if isinstance(size, (tuple, list)) else size
    return {"image_size": int(size), "mean": tuple(cfg["mean"]), "std": tuple(cfg["std"]),
            "crop_pct": float(cfg.get("crop_pct") or 1.0), "interpolation": cfg.get("interpolation") or "bicubic"}

