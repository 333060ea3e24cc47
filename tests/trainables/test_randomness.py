"""Issue 22: where a run's random numbers come from. Reproducible streams are independent of each
other and of other seeds; secure runs draw from a secret no file holds; Poisson membership never
exceeds the accounted rate; the secure Gaussian is a standard normal."""
import io
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dptune.trainables.engine import randomness
from dptune.trainables.config import TrainConfig
from dptune.trainables.engine.noise import GaussianNoise
from dptune.trainables.engine.randomness import BITS, STREAMS, SecureStream, SeededStream, membership
from dptune.trainables.training import Trainer

CPU = torch.device("cpu")


def tiny(**options) -> TrainConfig:
    return TrainConfig(dataset="digits", model="mlp", epsilon=4.0, epochs=1, batch_size=128, learning_rate=1.0,
                       model_options={"hidden": 16}, device="cpu", **options)


def trained(cfg: TrainConfig) -> torch.Tensor:
    trainer = Trainer(cfg)
    trainer.run_epoch()
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()])


def test_no_two_streams_of_seeds_0_to_99_coincide():
    """Each (seed, stream) starts differently from every other: the noise of seed s is not the
    batches of seed s + 1 (today's streams were seed, seed + 1, seed + 2)."""
    starts = {}
    for seed in range(100):
        for name in STREAMS:
            first = tuple(SeededStream(seed, name, CPU).integers(4).tolist())
            assert first not in starts, (seed, name, starts.get(first))
            starts[first] = (seed, name)
    assert len(starts) == 100 * len(STREAMS)


def test_a_reproducible_run_is_replayed_and_a_secure_one_is_not():
    assert torch.equal(trained(tiny()), trained(tiny()))
    assert not torch.equal(trained(tiny(seed=1)), trained(tiny()))
    assert not torch.equal(trained(tiny(randomness="secure")), trained(tiny(randomness="secure")))


def test_the_secret_is_written_nowhere(monkeypatch, capsys):
    """A secure run's checkpoint, config and output hold neither its key nor its hex: its noise
    cannot be regenerated from anything it writes."""
    keys = []

    def recorded() -> bytes:
        keys.append(randomness.secrets.token_bytes(32))
        return keys[-1]

    monkeypatch.setattr("dptune.trainables.training.new_secret", recorded)
    trainer = Trainer(tiny(randomness="secure"))
    trainer.run_epoch()
    (key,) = keys
    buf = io.BytesIO()
    torch.save(trainer.state_dict(), buf)
    written = buf.getvalue() + repr(trainer.cfg.to_dict()).encode() + capsys.readouterr().out.encode()
    assert key not in written and key.hex().encode() not in written
    assert trainer.state_dict()["streams"] == {name: {} for name in STREAMS}
    # resumed, it goes on with fresh secret streams (nothing of the old key to restore)
    again = Trainer(tiny(randomness="secure"))
    again.load_state_dict(trainer.state_dict())
    assert len(keys) == 2 and keys[1] != key


def test_membership_never_exceeds_the_accounted_rate():
    for q in (1 / 3, 0.1, 0.05, 2.0 ** -30, 1 - 2.0 ** -40, 0.123456789):
        assert math.floor(q * 2.0 ** BITS) / 2.0 ** BITS <= q           # the threshold's rate
    # a rate whose float32 rounding is above it: `rand < q` in float32 would include more often
    q = 0.1
    assert float(torch.tensor(q, dtype=torch.float32)) > q
    for source in (SeededStream(0, "sampler", CPU), SecureStream(randomness.new_secret(), "sampler")):
        n, draws = 2000, 200
        hits = sum(len(membership(source, n, q)) for _ in range(draws))
        low, high = stats.binom.interval(0.999, n * draws, q)
        assert low <= hits <= high
    assert torch.equal(membership(SeededStream(0, "sampler", CPU), 7, 1.0), torch.arange(7))


def test_the_secure_gaussian_is_standard_normal():
    """Box–Muller on ChaCha20 bits, first draw discarded, four summed and halved: N(0, 1)."""
    z = SecureStream(randomness.new_secret(), "noise").normal((200_000,), dtype=torch.float64, device=CPU)
    assert abs(float(z.mean())) < 4 / math.sqrt(len(z)) and float(z.std()) == pytest.approx(1.0, rel=0.01)
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    a = SecureStream(randomness.new_secret(), "noise").normal((1000,), dtype=torch.float64, device=CPU)
    assert abs(stats.pearsonr(a.numpy()[:-1], a.numpy()[1:])[0]) < 0.12   # no dependence between neighbours


def test_integers_are_uniform_on_62_bits():
    ints = SecureStream(randomness.new_secret(), "sampler").integers(100_000).numpy()
    assert ints.min() >= 0 and ints.max() < 2 ** BITS
    counts = np.bincount((ints >> (BITS - 4)).astype(int), minlength=16)   # the top 4 bits
    assert stats.chisquare(counts).pvalue > 1e-3


def test_noise_is_drawn_in_at_least_float32():
    like = torch.zeros(1000, dtype=torch.bfloat16)
    for source in (SeededStream(0, "noise", CPU), SecureStream(randomness.new_secret(), "noise"),
                   torch.Generator().manual_seed(0), None):
        xi = GaussianNoise(1.0, source).standard_normal(like)
        assert xi.dtype == torch.float32 and len(torch.unique(xi)) > 990   # bfloat16 has 256 values in [1, 2)


#: What a secure run imports, checked against the plain install's requirements in a fresh interpreter.
SECURE_IMPORTS = """
import sys, torch
before = set(sys.modules)
from dptune.trainables.engine.randomness import stream
s = stream("secure", "noise", seed=0, secret=b"k" * 32, device=torch.device("cpu"))
s.normal((4,), dtype=torch.float32, device=torch.device("cpu")), s.integers(4)
print(" ".join(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
"""


def _base_requirements() -> set[str]:
    """The distributions a plain ``pip install dptune`` brings: [project.dependencies] and what they
    require, recursively, without any extra of dptune's (read from the installed packages' metadata)."""
    import importlib.metadata as metadata
    import re
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    todo, seen = [Requirement(d) for d in pyproject["project"]["dependencies"]], set()
    while todo:
        req = todo.pop()
        if norm(req.name) in seen:
            continue
        seen.add(norm(req.name))
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in map(Requirement, requires):   # its own extras only where the requirement names them
            if line.marker is None or any(line.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(line)
    return seen


def test_secure_randomness_needs_nothing_beyond_the_plain_install():
    """Issue 47: `pip install -e .` then `--randomness secure` ended in ModuleNotFoundError
    (cryptography came only with the dev extra). Every distribution a secure draw imports is one the
    plain install requires (checked in a fresh interpreter, since CI installs the dev extra)."""
    import importlib.metadata as metadata
    import re
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SECURE_IMPORTS], capture_output=True, text=True, check=True).stdout
    owners = metadata.packages_distributions()
    imported = {re.sub(r"[-_.]+", "-", dist).lower() for module in out.split() for dist in owners.get(module, [])}
    assert "cryptography" in imported   # the test sees what it is about
    missing = imported - _base_requirements() - {"dptune"}
    assert not missing, f"secure randomness imports {sorted(missing)}, which `pip install dptune` does not bring"
