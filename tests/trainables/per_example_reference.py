"""The independent reference the engine tests compare against: one autograd backward per example."""
import torch
from torch import nn

from dptune.trainables.engine.batching import model_outputs

LOSS = nn.CrossEntropyLoss(reduction="none")


def clipped_sum_loop(model: nn.Module, inputs, targets: torch.Tensor, clip: float, loss_fn=LOSS):
    """(Σ_i min(1, C/n_i) g_i per trainable parameter, n_i), one example at a time."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    sums = {n: torch.zeros_like(p) for n, p in params.items()}
    norms = []
    for i in range(len(targets)):
        x = {k: v[i:i + 1] for k, v in inputs.items()} if isinstance(inputs, dict) else inputs[i:i + 1]
        loss = loss_fn(model_outputs(model, x), targets[i:i + 1]).sum()
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params.values())]
        n = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        for name, g in zip(params, grads):
            sums[name] += min(1.0, clip / float(n)) * g
        norms.append(n)
    return sums, torch.stack(norms)
