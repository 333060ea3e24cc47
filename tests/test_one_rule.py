"""Each rule of the batch-size schedule has one home, and everyone imports it from there.

q = B/N and T = ⌈E·N/B⌉ live in ``dptune.privacy.schedule``; the minimum-step and σ√T plateau
rules and their defaults (``MIN_STEPS``, ``PLATEAU_TOL``) in ``dptune.search_spaces.batches``.
These checks read the source, so a second copy anywhere in dptune fails them.
"""
from __future__ import annotations

import ast
from pathlib import Path

import dptune
from dptune.privacy.schedule import num_steps, sample_rate
from dptune.search_spaces.batches import MIN_STEPS, PLATEAU_TOL, sample_rate_and_steps

ROOT = Path(dptune.__file__).parent
SCHEDULE = "privacy/schedule.py"
RULES = "search_spaces/batches.py"
RULE_NAMES = {"min_steps", "plateau_tol", "MIN_STEPS", "PLATEAU_TOL"}


def sources() -> dict[str, ast.AST]:
    return {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text()) for p in sorted(ROOT.rglob("*.py"))}


def names_in(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


def leaf_name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def test_the_schedule():
    assert sample_rate(64, 1000) == 0.064 and num_steps(2.5, 1000, 64) == 40       # ⌈39.06⌉
    assert sample_rate_and_steps(64, 1000, 2.5) == (0.064, 40)


def test_steps_are_counted_only_in_the_schedule():
    """No ``ceil(epochs · N / B)`` outside dptune/privacy/schedule.py."""
    copies = []
    for path, tree in sources().items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and leaf_name(node.func) == "ceil" and node.args
                    and isinstance(node.args[0], ast.BinOp) and isinstance(node.args[0].op, ast.Div)
                    and any("epoch" in n for n in names_in(node.args[0].left))
                    and leaf_name(node.args[0].right) is not None):
                copies.append((path, node.lineno))
    assert [c for c in copies if c[0] != SCHEDULE] == []
    assert [c[0] for c in copies] == [SCHEDULE]


def test_the_sample_rate_is_computed_only_in_the_schedule():
    """No ``batch_size / dataset_size`` (or ``b / N``, ``cfg.batch_size / num_examples``) elsewhere."""
    batch, size = {"batch_size", "b", "B"}, {"dataset_size", "num_examples", "n", "N", "n_train"}
    copies = [(path, node.lineno) for path, tree in sources().items() for node in ast.walk(tree)
              if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
              and leaf_name(node.left) in batch and leaf_name(node.right) in size]
    assert [c for c in copies if c[0] != SCHEDULE] == []


def test_pruning_defaults_are_defined_once():
    """MIN_STEPS and PLATEAU_TOL are the only literal defaults of min_steps / plateau_tol (a None
    default, resolved at run time, e.g. from a sweep's saved plan, is not one)."""
    literal = []
    for path, tree in sources().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pairs = list(zip(a.args[len(a.args) - len(a.defaults):], a.defaults)) + \
                    [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                literal += [(path, node.lineno, arg.arg) for arg, d in pairs  # None: resolved at run time
                            if arg.arg in RULE_NAMES and isinstance(d, ast.Constant) and d.value is not None]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant):
                if leaf_name(node.target) in RULE_NAMES:
                    literal.append((path, node.lineno, leaf_name(node.target)))
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                literal += [(path, node.lineno, leaf_name(t)) for t in node.targets if leaf_name(t) in RULE_NAMES]
    assert sorted((p, n) for p, _, n in literal) == [(RULES, "MIN_STEPS"), (RULES, "PLATEAU_TOL")], literal
    assert (MIN_STEPS, PLATEAU_TOL) == (20, 0.05)


def is_none_check(node: ast.AST) -> bool:
    """``x is None`` / ``x is not None``: resolving an unset option, not applying a rule."""
    return (isinstance(node, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
            and all(isinstance(c, ast.Constant) and c.value is None for c in node.comparators))


def test_the_pruning_rules_are_applied_only_in_batches():
    """Only search_spaces/batches.py compares with min_steps or scales by plateau_tol: the planner
    and the analysis's noise curves call its functions. (analysis/figures.py only draws the band
    and the floor of a curve already pruned; it decides nothing.)"""
    uses = []
    for path, tree in sources().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Compare, ast.BinOp)) and names_in(node) & RULE_NAMES \
                    and not is_none_check(node):
                uses.append((path, node.lineno))
    assert {p for p, _ in uses} <= {RULES, "analysis/figures.py"}, [u for u in uses if u[0] != RULES]
    assert RULES in {p for p, _ in uses}
