"""dptune.analysis reads the store through its public reader and uses privacy: no trainables,
no search spaces, no Ray (DESIGN.md, Layout)."""
import ast
from pathlib import Path

import dptune.analysis

ALLOWED_DPTUNE = {"dptune.privacy", "dptune.platform.store", "dptune.analysis"}
FORBIDDEN_TOP = {"torch", "ray"}


def imports(path: Path) -> set[str]:
    """Absolute module names imported by a file of dptune.analysis (relative imports resolved)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ["dptune", "analysis"][: 2 - node.level + 1] if node.level else []
            names.add(".".join(base + ([node.module] if node.module else [])))
    return names


def test_analysis_imports_only_privacy_and_the_store_reader():
    files = sorted(Path(dptune.analysis.__file__).parent.glob("*.py"))
    assert len(files) >= 7
    for path in files:
        for name in imports(path):
            if name.startswith("dptune"):
                assert any(name == a or name.startswith(a + ".") for a in ALLOWED_DPTUNE), (path.name, name)
            assert name.split(".")[0] not in FORBIDDEN_TOP, (path.name, name)
