"""Where a run's random numbers come from: two modes, named in the spec, the store and the report.

- ``reproducible`` (research; **not for release**): every stream is derived from the run's seed
  through numpy's ``SeedSequence`` with the stream's own id (``spawn_key``), so no two streams of
  any two seeds coincide (the noise of seed s is not the batches of seed s+1); a run can be
  replayed and resumed bit for bit; anyone holding the seed (the spec, the store's ``seed`` column)
  can regenerate its batches and its noise, so its model is not private.
- ``secure`` (release): a 256-bit secret from the operating system (``secrets``) keys ChaCha20 (the
  ``cryptography`` package: OpenSSL's implementation; torchcsprng, Opacus's choice, is no longer
  maintained), one keystream per stream (the stream id is the nonce). Gaussian noise is drawn in
  float64 by Box–Muller from those bits, with the floating-point-attack mitigation of Opacus's
  secure mode (Holohan & Braghin 2021: the first draw of a call discarded, each value the sum of
  four draws halved). The secret lives in this process's memory only: no checkpoint, store, log or
  Ray state holds it, so a resumed secure run continues with fresh secret randomness (its result
  differs from an uninterrupted run's; its privacy does not).

Streams (:data:`STREAMS`): ``init`` (model initialisation, dropout), ``sampler`` (Poisson
membership), ``noise`` (the Gaussian noise), ``probes`` (randomised estimators' probes: each step
seeds the per-(step, layer) generators with 62 bits from it), ``score`` (private selection's score
noise). Poisson membership compares 62-bit integers with ⌊q·2⁶²⌋, so the realised rate never
exceeds the accounted q (a float ``rand < q`` rounds q up).
"""
from __future__ import annotations

import math
import secrets
from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np
import torch

#: The streams of a run and their ids (the SeedSequence spawn key, the ChaCha20 nonce).
STREAMS = {"init": 1, "sampler": 2, "noise": 3, "probes": 4, "score": 5}
#: Poisson membership and probe seeds are 62-bit integers.
BITS = 62


class Stream(ABC):
    """One stream of random numbers (see the module docstring)."""

    secure = False

    @abstractmethod
    def integers(self, n: int) -> torch.Tensor:
        """``n`` independent uniform integers in [0, 2⁶²) (int64, CPU)."""

    @abstractmethod
    def normal(self, shape: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Standard normal values of ``shape``."""

    def seed(self) -> int:
        """One uniform 62-bit integer (a seed for a torch generator)."""
        return int(self.integers(1)[0])

    def state(self) -> dict:
        """What a checkpoint holds of the stream (nothing of a secure one)."""
        return {}

    def load(self, state: dict) -> None:
        """Continue from a checkpoint's state."""


class SeededStream(Stream):
    """A reproducible stream: torch generators seeded from ``SeedSequence(seed, spawn_key=(id,))``
    (a CPU one for integers, one on ``device`` for the noise)."""

    def __init__(self, seed: int, stream: str, device: torch.device) -> None:
        derived = int(np.random.SeedSequence(seed, spawn_key=(STREAMS[stream],)).generate_state(1, np.uint64)[0])
        self.cpu = torch.Generator().manual_seed(derived)
        self.device = torch.Generator(device=device).manual_seed(derived)

    def integers(self, n: int) -> torch.Tensor:
        return torch.randint(0, 1 << BITS, (n,), generator=self.cpu, dtype=torch.int64)

    def normal(self, shape: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.randn(tuple(shape), generator=self.device, dtype=dtype, device=self.device.device).to(device)

    def state(self) -> dict:
        return {"cpu": self.cpu.get_state(), "device": self.device.get_state()}

    def load(self, state: dict) -> None:
        self.cpu.set_state(state["cpu"])
        self.device.set_state(state["device"])


class SecureStream(Stream):
    """A secure stream: the ChaCha20 keystream of ``key`` with this stream's nonce."""

    secure = True

    def __init__(self, key: bytes, stream: str) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        nonce = bytes(4) + STREAMS[stream].to_bytes(12, "little")   # a 32-bit block counter from 0, then the id
        self._cipher = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()

    def _words(self, n: int) -> np.ndarray:
        """``n`` uniform 64-bit words of the keystream."""
        return np.frombuffer(self._cipher.update(bytes(8 * n)), dtype=np.uint64)

    def integers(self, n: int) -> torch.Tensor:
        return torch.from_numpy((self._words(n) >> np.uint64(64 - BITS)).astype(np.int64))

    def _gaussians(self, n: int) -> torch.Tensor:
        """``n`` standard normals in float64, by Box–Muller from 53-bit uniforms in (0, 1]."""
        pairs = (n + 1) // 2
        u = torch.from_numpy(((self._words(2 * pairs) >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53)
        radius, angle = torch.sqrt(-2.0 * torch.log(u[:pairs])), (2.0 * math.pi) * u[pairs:]
        return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]

    def normal(self, shape: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        n = math.prod(shape)
        self._gaussians(1)                                      # the first draw of a call is discarded …
        z = self._gaussians(4 * n).view(4, n).sum(0) / 2.0      # … and each value is four draws, summed, halved
        return z.view(tuple(shape)).to(device=device, dtype=dtype)


def new_secret() -> bytes:
    """A fresh 256-bit secret from the operating system."""
    return secrets.token_bytes(32)


def stream(mode: str, name: str, *, seed: int, secret: bytes | None, device: torch.device) -> Stream:
    """The stream ``name`` of a run in ``mode`` (``secret``: the run's key, secure mode only)."""
    if mode == "secure":
        if secret is None:
            raise ValueError("a secure stream needs the run's secret")
        return SecureStream(secret, name)
    return SeededStream(seed, name, device)


def membership(stream: Stream, num_examples: int, sample_rate: float) -> torch.Tensor:
    """The indices of one Poisson batch: each example joins with probability ⌊q·2⁶²⌋/2⁶² ≤ q."""
    if sample_rate >= 1.0:
        return torch.arange(num_examples)
    threshold = math.floor(sample_rate * 2.0 ** BITS)   # exact: a power-of-two scaling of a float
    return (stream.integers(num_examples) < threshold).nonzero(as_tuple=True)[0]
