"""The models: the catalog (:mod:`.catalog`, ``create_model``), models trained from scratch, pretrained
image (timm) and text (transformers) backbones, what DP fine-tuning trains of them (``peft``), and
the shared frozen computation of a head-only run."""
