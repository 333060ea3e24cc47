"""`dptune export` refuses what is not a private release before it reads any checkpoint: a trial
run with reproducible randomness (or stored before the mode existed), a non-private baseline, an
unfinished trial, a store with no released model."""
import pytest

from dptune.errors import NotFound, UserError
from dptune.platform.views.export import export_release
from dptune.platform.store.results_store import ResultsStore


def stored(tmp_path, **row) -> str:
    store = tmp_path / "exp" / "store"
    ResultsStore(str(store)).write_trial({"trial_id": "t1", "cell": "digits/mlp/eps=2", "status": "finished",
                                          "epsilon": 2.0, "private": True, "randomness": "secure", **row})
    return str(tmp_path / "exp")


@pytest.mark.parametrize("row,refusal", [
    ({"randomness": "reproducible"}, "reproducible randomness"),
    ({"randomness": None}, "reproducible randomness"),
    ({"epsilon": float("inf"), "private": False}, "non-private baseline"),
    ({"status": "error"}, "not finished"),
    ({"selection_k": 3, "selected": False}, "was not selected")])
def test_export_refuses_what_is_not_a_private_release(tmp_path, row, refusal):
    with pytest.raises(UserError, match=refusal):
        export_release(stored(tmp_path, **row), str(tmp_path / "out"), trial_id="t1")
    assert not (tmp_path / "out").exists()


def test_export_without_a_release_or_with_an_unknown_trial_says_so(tmp_path):
    root = stored(tmp_path)
    with pytest.raises(UserError, match="no released model"):
        export_release(root, str(tmp_path / "out"))
    with pytest.raises(NotFound, match="no trial 'nope'"):
        export_release(root, str(tmp_path / "out"), trial_id="nope")


def test_a_pack_member_exports_the_weights_of_its_configuration_trained_alone(tmp_path):
    """Issue 47: `dptune export --trial <pack>-m<k>` ended "no trial folder": a member's weights are
    its slice of its pack's checkpoint. The export equals the member's configuration trained alone
    (reproducible randomness, so that the lone run is the member's trajectory; the store row says
    secure, which is all export reads of the mode)."""
    import torch
    from safetensors.torch import load_file

    from dptune.platform.sweep.tune_adapter import STATE_FILE
    from dptune.platform.store.results_store import to_json
    from dptune.schema import TrainConfig
    from dptune.trainables.pack_training import PackTrainer
    from dptune.trainables.training import Trainer

    cfgs = [TrainConfig(dataset="digits", model="mlp", model_options={"hidden": 16}, epochs=1, batch_size=64,
                        device="cpu", clip_bound=c, learning_rate=lr, epsilon=eps)
            for c, lr, eps in ((0.5, 0.2, 2.0), (1.0, 0.1, 4.0))]
    pack = PackTrainer(cfgs)
    pack.fit()
    folder = tmp_path / "exp" / "dp_trainable_abc123_00000_0_2026" / "checkpoint_000001"
    folder.mkdir(parents=True)
    torch.save({"pack": pack.state_dict()}, folder / STATE_FILE)
    root = stored(tmp_path, trial_id="abc123-m1", epsilon_spent=4.0, delta=1e-5, noise_multiplier=1.0, steps=23,
                  sample_rate=0.05, config_json=to_json(cfgs[1].to_dict()))
    (written,) = export_release(root, str(tmp_path / "out"), trial_id="abc123-m1")
    exported = load_file(f"{written}/model.safetensors")
    alone = Trainer(cfgs[1])
    alone.fit()
    expected = alone.trainable_state()
    assert exported.keys() == expected.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(exported[name], weight, rtol=1e-4, atol=1e-5, msg=name)
    with pytest.raises(NotFound, match="no member 5"):
        export_release(stored(tmp_path, trial_id="abc123-m5"), str(tmp_path / "out5"), trial_id="abc123-m5")
