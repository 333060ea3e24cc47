"""What a run learns and how it is scored: classification or generation (prompt → completion).

A task gives the trainer three things: the **per-example loss** the DP engine clips (the privacy
unit is one example: one image, one text, one prompt/completion sequence), the **evaluation** of a
split (the metrics :mod:`dptune.schema.metrics` declares, each with its direction), and the groups
the per-sample norm statistics are kept by (classes, or one group). Generation also scores greedy
completions of the test prompts at the end of training with maintained libraries: ROUGE-L
(``rouge-score``) and BLEU (``sacrebleu``).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import UserError
from .data.generation import IGNORE
from .data.splits import DatasetSplits, Generations, take
from .engine.batching import model_outputs, to_device


def completion_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example NLL of the completion, **summed** over its tokens ([b]): token t+1 is predicted
    from the logits at t; masked labels (prompt, padding: -100) count nothing."""
    logits, targets = logits[:, :-1], labels[:, 1:]
    if logits.dtype in (torch.float16, torch.bfloat16):   # the softmax in full precision
        logits = logits.float()
    nll = nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE, reduction="none")
    return nll.sum(-1)


class Classification:
    """Cross-entropy per example; test accuracy, mean loss and per-class accuracy."""

    name = "classification"

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.loss = nn.CrossEntropyLoss(reduction="none")

    @staticmethod
    def groups(targets: torch.Tensor) -> torch.Tensor:
        return targets

    @torch.no_grad()
    def evaluate(self, model: nn.Module, dataset: torch.utils.data.Dataset, device: torch.device, prefix: str,
                 batch_size: int = 1024) -> dict:
        model.eval()
        correct = torch.zeros(self.num_classes)
        total = torch.zeros(self.num_classes)
        loss_sum = 0.0
        for start in range(0, len(dataset), batch_size):
            x, y = take(dataset, torch.arange(start, min(start + batch_size, len(dataset))))
            x, y = to_device(x, device), y.to(device)
            logits = model_outputs(model, x)
            loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
            hit = (logits.argmax(-1) == y).float().cpu()
            total += torch.bincount(y.cpu(), minlength=self.num_classes).float()
            correct += torch.bincount(y.cpu(), weights=hit, minlength=self.num_classes)
        model.train()
        n = float(total.sum())
        out = {f"{prefix}_accuracy": float(correct.sum()) / n, f"{prefix}_loss": loss_sum / n}
        if prefix == "test":
            out["per_class_accuracy"] = (correct / total.clamp_min(1)).tolist()
        return out


class Generation:
    """The completion's summed NLL per example; per token NLL and perplexity of a split; greedy
    generation on the test prompts scored with ROUGE-L and BLEU."""

    name = "generation"
    loss = staticmethod(completion_nll)

    @staticmethod
    def groups(targets: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(targets), dtype=torch.long)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, dataset: torch.utils.data.Dataset, device: torch.device, prefix: str,
                 batch_size: int = 32) -> dict:
        model.eval()
        nll, tokens = 0.0, 0
        for start in range(0, len(dataset), batch_size):
            x, y = take(dataset, torch.arange(start, min(start + batch_size, len(dataset))))
            x, y = to_device(x, device), y.to(device)
            nll += float(completion_nll(model_outputs(model, x), y).sum())
            tokens += int((y[:, 1:] != IGNORE).sum())
        model.train()
        per_token = nll / max(tokens, 1)
        return {f"{prefix}_nll": per_token, f"{prefix}_perplexity": math.exp(min(per_token, 700.0))}

    @torch.no_grad()
    def generate(self, model: nn.Module, generations: Generations, device: torch.device, *, examples: int | None,
                 max_new_tokens: int, batch_size: int = 16) -> dict:
        """Greedy completions of the first ``examples`` test prompts (all: None), scored against the
        references: ROUGE-L F1 (mean, ``rouge-score``) and corpus BLEU (``sacrebleu``), in [0, 1]."""
        try:
            import sacrebleu
            from rouge_score import rouge_scorer
        except ImportError:
            raise UserError("generation metrics need rouge-score and sacrebleu: pip install 'dptune[lm]'") from None
        tok = generations.tokenizer
        count = len(generations.prompts) if examples is None else min(examples, len(generations.prompts))
        outputs: list[str] = []
        model.eval()
        for start in range(0, count, batch_size):
            prompts = generations.prompts[start:start + batch_size]
            width = max(map(len, prompts))
            ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(prompts):   # left-padded: every prompt ends where generation starts
                ids[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
            outputs += tok.batch_decode(out[:, width:], skip_special_tokens=True)
        model.train()
        references = [r.strip() for r in generations.references[:count]]
        outputs = [o.strip().split("\n")[0] for o in outputs]
        scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
        rouge = [scorer.score(r, o)["rougeL"].fmeasure for r, o in zip(references, outputs)]
        bleu = sacrebleu.corpus_bleu(outputs, [references]).score / 100
        return {"test_rougeL": float(sum(rouge) / max(len(rouge), 1)), "test_bleu": float(bleu),
                "generated_examples": count}


def task_of(data: DatasetSplits) -> "Task":
    """The task of a dataset's splits."""
    return Generation() if data.task == "generation" else Classification(data.num_classes)


Task = Classification | Generation
