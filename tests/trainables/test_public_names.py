"""Issue 49: ``create_model`` and ``load_dataset`` are public names of ``dptune.trainables`` (docs/architecture.md),
and notebook code that imported them from ``trainables.models`` / ``trainables.data`` keeps working
after they moved into each package's ``catalog``; importing a light submodule still pulls in no torch."""
import subprocess
import sys

from sklearn.datasets import load_digits


def test_the_catalogs_functions_are_importable_where_design_md_and_older_notebooks_name_them():
    from dptune.trainables import create_model, load_dataset
    from dptune.trainables.data import load_dataset as from_data
    from dptune.trainables.data.catalog import load_dataset as catalog_data
    from dptune.trainables.models import create_model as from_models
    from dptune.trainables.models.catalog import create_model as catalog_model

    assert create_model is from_models is catalog_model and load_dataset is from_data is catalog_data
    splits = load_dataset("digits", seed=0)
    images = load_digits().images
    assert len(splits.train) + len(splits.test) == len(images)   # scikit-learn's 1,797 digits, split
    model = create_model("mlp", num_classes=10, input_shape=(1, 8, 8))
    x, _ = splits.train[0]
    assert model(x.unsqueeze(0)).shape == (1, 10)


def test_a_light_submodule_and_an_unknown_name_stay_light():
    code = ("import sys, dptune.trainables.config, dptune.trainables.models, dptune.trainables.data\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "import dptune.trainables.models as m\n"
            "try:\n    m.nothing\nexcept AttributeError as e:\n    assert 'nothing' in str(e)\nelse:\n    raise SystemExit(1)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
