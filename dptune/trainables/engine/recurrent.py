"""``nn.RNN``, ``nn.LSTM`` and ``nn.GRU`` written with plain tensor operations, so that
``torch.func.vmap`` can take per-example gradients through them (the fused kernels have no batching
rule): the same equations, gate order and parameter names as PyTorch's modules, several layers,
both directions, LSTM projections, and sequences of different lengths (the padded form of a
``PackedSequence``: an example's state stops changing after its last step, its outputs there are
zero, as ``pad_packed_sequence`` gives them).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn


#: ``linear(x, weight name, bias name or None)``: how a step applies one of the module's linear maps.
Linear = Callable[[torch.Tensor, str, Optional[str]], torch.Tensor]


def _cell(mode: str, x: torch.Tensor, h: torch.Tensor, c: Optional[torch.Tensor], suffix: str, names: set,
          linear: Linear) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One step of one layer and direction: the new (h, c) from input x [b, d] and state h [b, H]."""
    def bias(kind: str) -> Optional[str]:
        return f"bias_{kind}{suffix}" if f"bias_{kind}{suffix}" in names else None

    gi = linear(x, f"weight_ih{suffix}", bias("ih"))
    gh = linear(h, f"weight_hh{suffix}", bias("hh"))
    if mode == "LSTM":
        i, f, g, o = (gi + gh).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (linear(h, f"weight_hr{suffix}", None) if f"weight_hr{suffix}" in names else h), c
    if mode == "GRU":
        ir, iz, inn = gi.chunk(3, dim=-1)
        hr, hz, hn = gh.chunk(3, dim=-1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(inn + r * hn)
        return (1 - z) * n + z * h, None
    pre = gi + gh
    return (torch.tanh(pre) if mode == "RNN_TANH" else torch.relu(pre)), None


def rnn_forward(module: nn.RNNBase, params: dict[str, torch.Tensor], x: torch.Tensor,
                hx: object = None, lengths: Optional[torch.Tensor] = None,
                linear: Optional[Linear] = None) -> tuple[torch.Tensor, object]:
    """``module``'s forward on batch-first ``x`` [b, T, d] with ``params`` (its parameter names):
    (output [b, T, dirs·H_out], h_n [layers·dirs, b, H_out] or, for an LSTM, (h_n, c_n)).

    ``lengths`` [b] (None: all T) marks each example's valid steps; ``hx`` as the module takes it;
    ``linear`` applies each linear map (default: ``F.linear`` with ``params``; the replay rule taps
    them). Dropout between layers is refused in training mode by the caller (it cannot be replayed)."""
    names = {n for n, _ in module.named_parameters()}
    if linear is None:
        def linear(v: torch.Tensor, weight: str, bias: Optional[str]) -> torch.Tensor:
            return F.linear(v, params[weight], params[bias] if bias else None)
    mode, layers, dirs = module.mode, module.num_layers, 2 if module.bidirectional else 1
    b, T = x.shape[0], x.shape[1]
    h_out = module.proj_size or module.hidden_size
    if hx is None:
        h0 = x.new_zeros(layers * dirs, b, h_out)
        c0 = x.new_zeros(layers * dirs, b, module.hidden_size) if mode == "LSTM" else None
    else:
        h0, c0 = hx if mode == "LSTM" else (hx, None)
    valid = None if lengths is None else (torch.arange(T, device=x.device)[None, :] < lengths[:, None])  # [b, T]
    layer_input, h_n, c_n = x, [], []
    for layer in range(layers):
        outputs = []
        for direction in range(dirs):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            k = layer * dirs + direction
            h, c = h0[k], (c0[k] if c0 is not None else None)
            steps = range(T - 1, -1, -1) if direction else range(T)
            out = [None] * T
            for t in steps:
                h_new, c_new = _cell(mode, layer_input[:, t], h, c, suffix, names, linear)
                if valid is not None:
                    m = valid[:, t, None].to(h.dtype)
                    h_new = m * h_new + (1 - m) * h
                    c_new = m * c_new + (1 - m) * c if c is not None else None
                    out[t] = m * h_new
                else:
                    out[t] = h_new
                h, c = h_new, c_new
            outputs.append(torch.stack(out, dim=1))  # [b, T, H_out]
            h_n.append(h)
            c_n.append(c)
        layer_input = torch.cat(outputs, dim=2) if dirs == 2 else outputs[0]
    hidden = torch.stack(h_n)
    return layer_input, ((hidden, torch.stack(c_n)) if mode == "LSTM" else hidden)
