"""The one registry helper: names in registration order, a one-line error listing them, no silent
replacement, and the registries of dptune built on it."""
import subprocess
import sys

import pytest

from dptune.registry import Registry, UnknownName, check_options


def make() -> Registry:
    reg = Registry("clip_fn")

    @reg.register("flat")
    def flat(norms, clip_bound):
        return "flat"

    reg.register("auto_s", lambda norms, clip_bound: "auto_s")
    return reg


def test_register_as_decorator_or_call_and_read_back():
    reg = make()
    assert reg.names() == ("flat", "auto_s") and list(reg) == ["flat", "auto_s"] and len(reg) == 2
    assert reg.get("flat")(None, 1.0) == "flat" and reg["auto_s"](None, 1.0) == "auto_s"
    assert "flat" in reg and "flot" not in reg and 3 not in reg
    assert [name for name, _ in reg.items()] == ["flat", "auto_s"]


def test_an_unknown_name_is_one_error_naming_the_field_and_every_registered_name():
    reg = make()
    with pytest.raises(ValueError) as info:
        reg.get("flot")
    assert str(info.value) == "clip_fn must be one of flat, auto_s; got 'flot'"
    with pytest.raises(KeyError):  # reg[name] fails as a dict's would
        reg["flot"]
    with pytest.raises(UnknownName, match="got \\['flat'\\]"):  # not a name at all
        reg.get(["flat"])


def test_a_taken_name_is_refused_and_the_same_entry_again_is_not_an_error():
    reg = make()
    first = reg.get("flat")
    with pytest.raises(ValueError, match="clip_fn 'flat' is already registered"):
        reg.register("flat", lambda norms, clip_bound: "other")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("flat")(lambda norms, clip_bound: "other")
    assert reg.register("flat", first) is first and reg.get("flat") is first and len(reg) == 2


def test_a_family_answers_every_prefixed_name():
    reg = Registry("model")
    reg.register("cnn", object())

    @reg.register_family("timm")
    def timm_model(name, **options):
        return name, options

    assert reg.get("timm:vit_x")(depth=2) == ("vit_x", {"depth": 2})
    assert "timm:vit_x" in reg and "timm:" not in reg and "hf:bert" not in reg
    assert list(reg) == ["cnn"] and reg.families() == ("timm",)
    with pytest.raises(ValueError, match="model must be one of cnn, timm:<name>; got 'hf:bert'"):
        reg.get("hf:bert")
    with pytest.raises(ValueError, match="already registered"):
        reg.register_family("timm", lambda name: None)


def test_a_copy_is_independent():
    reg = make()
    other = reg.copy()
    other.register("new", print)
    assert "new" in other and "new" not in reg


def test_check_options_names_what_the_function_takes():
    def loader(*, seed=0, test_size=0.2):
        return None

    check_options("dataset", "digits", loader, {"test_size": 0.1}, implicit=("seed",))
    with pytest.raises(ValueError, match="dataset 'digits' does not take option\\(s\\) tst_size; it takes: test_size"):
        check_options("dataset", "digits", loader, {"tst_size": 0.1}, implicit=("seed",))


def test_dptune_registries_use_it_and_name_their_field():
    from dptune.privacy.mechanisms import MECHANISMS
    from dptune.privacy.validation import NORM_ESTIMATORS
    from dptune.search_spaces.spec import CHECKS, SECTIONS
    from dptune.trainables.data.catalog import DATASETS
    from dptune.trainables.models.catalog import INPUT_SPECS, MODELS

    kinds = {reg.kind for reg in (MECHANISMS, SECTIONS, CHECKS, DATASETS, MODELS, INPUT_SPECS)
             if isinstance(reg, Registry)}
    assert {"norm_estimator", "spec section", "spec check", "dataset", "model"} <= kinds
    assert NORM_ESTIMATORS is MECHANISMS  # the accountant's names are its registry, not a copy


def test_the_registry_module_needs_only_the_standard_library():
    code = "import sys, dptune.registry; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "{'torch', 'numpy', 'ray', 'scipy'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
