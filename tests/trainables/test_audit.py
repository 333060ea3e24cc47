"""`dptune audit` as the engine's regression test (issue 22): one training run with canaries gives
a lower bound on ε that stays below the accountant's ε for the engine as it is (exact, Hutchinson,
Hutch++, the two-pass fallback) and rises above it for deliberately broken engines (too little
noise, clipping at 10·C, one noise draw reused). The canaries themselves are checked against a
hand computation: a gradient canary adds C along its own tag and nothing elsewhere, and planting
them keeps N (so q, T and σ are the trial's)."""
import numpy as np
import pytest
import torch

from dptune.trainables.audit.run import AuditResult, AuditTrainer, audit_config, run_audit
from dptune.trainables.audit.canaries import TAG_OFFSET, plant
from dptune.trainables.config import TrainConfig
from dptune.trainables.data.catalog import load_dataset

EPSILON = 1.0


def trial(**options) -> TrainConfig:
    settings = dict(dataset="digits", model="mlp", model_options={"hidden": 16}, epsilon=EPSILON, epochs=5,
                    batch_size=128, learning_rate=0.5, device="cpu")
    return TrainConfig(**{**settings, **options})


def audited(cfg: TrainConfig, **options) -> AuditResult:
    result = run_audit(cfg, inputs=0, **options)
    assert result.epsilon == pytest.approx(EPSILON, rel=1e-3)   # the audit ran at the trial's σ, q, T
    return result


def two_passes(trainer) -> None:
    trainer.engine.norms.max_kept_bytes = 0   # every batch takes the two-backward fallback


@pytest.mark.parametrize("options,seed", [({}, 0), ({}, 1), ({"norm_estimator": "hutchinson", "sketch_k": 16}, 0),
                                          ({"norm_estimator": "hutchpp", "sketch_k": 16}, 0)],
                         ids=["exact-0", "exact-1", "hutchinson", "hutchpp"])
def test_the_engine_as_it_is_stays_below_the_accountant(options, seed):
    result = audited(trial(**options), seed=seed)
    assert result.lower_bound < result.epsilon and not result.violated


def test_the_two_pass_fallback_stays_below_the_accountant():
    modes = []
    result = audited(trial(), adjust=lambda t: (two_passes(t), modes.append(t.engine.norms)))
    assert modes[0].mode == "two backward passes"
    assert result.lower_bound < result.epsilon


@pytest.mark.parametrize("broken", ["noise_div10", "clip_10x", "reused_noise"])
def test_a_broken_engine_is_caught(broken):
    result = audited(trial(), broken=broken)
    assert result.lower_bound > result.epsilon and result.violated


def test_a_gradient_canary_adds_c_along_its_own_tag_and_nothing_else():
    cfg = audit_config(trial(clip_bound=0.5, noise_multiplier=0.0, batch_size=4))
    data, canaries = plant(load_dataset("digits", seed=0), gradient=6, inputs=0, seed=2)
    trainer = AuditTrainer(cfg, data, canaries)
    n = len(trainer.data.train)
    row = n - 1   # the last included canary: the included ones follow the real examples, in canary order
    tag = int(np.flatnonzero(canaries.included)[-1])
    x, y = trainer.data.train[row]
    trainer.engine.private_gradient(x[None], y[None])
    g = trainer.model.tags.weight.grad[:, 0]
    expected = torch.zeros(6)
    expected[tag] = -cfg.clip_bound / (cfg.batch_size * cfg.clip_bound)   # −C·e_tag / (B·C)
    torch.testing.assert_close(g, expected, rtol=1e-4, atol=1e-9)
    # real examples reach no tag (their tag logits sit TAG_OFFSET below), and the tags start there
    trainer.engine.private_gradient(*(t[:8] for t in trainer.data.train.tensors))
    assert trainer.model.tags.weight.grad.abs().max() < 1e-6 / cfg.batch_size
    assert torch.allclose(trainer.model.scale * trainer.model.tags.weight, torch.tensor(-TAG_OFFSET))


def test_planting_keeps_n_and_includes_about_half():
    data = load_dataset("digits", seed=0)
    planted, canaries = plant(data, gradient=400, inputs=100, seed=5)
    assert len(planted.train) == len(data.train)
    assert 200 < canaries.included.sum() < 300   # Bin(500, ½): 250 ± 5.6σ
    labels = planted.train.tensors[1]
    assert int((labels >= data.num_classes).sum()) == canaries.included[:400].sum()
    wrong = canaries.labels[400:]
    true = data.test.tensors[1][torch.as_tensor(canaries.test_rows[400:])].numpy()
    assert (wrong != true).all() and (wrong < data.num_classes).all()


#: Another member of the audited configuration's pack: C, η and ε differ.
PACK_MATE = dict(clip_bound=0.5, learning_rate=0.2, epsilon=4.0)


@pytest.mark.parametrize("where", ["bf16", "pack member"])
def test_the_engine_stays_below_and_a_broken_one_is_caught_in_bf16_and_in_a_pack(where):
    """Issue 47: the audit's broken-engine check on the new paths: autocast bf16 (norms, factors,
    sums and noise stay float32) and a member of a pack trained by the packed engine."""
    options = {"pack_with": [trial(**PACK_MATE)]} if where == "pack member" else {}
    cfg = trial(precision="bf16") if where == "bf16" else trial()
    assert not audited(cfg, **options).violated
    for broken in ("noise_div10", "clip_10x"):
        result = audited(cfg, broken=broken, **options)
        assert result.lower_bound > result.epsilon and result.violated, broken
