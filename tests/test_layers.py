"""Lower floors never import upper ones (issue 38): hostio imports nothing of the project, nsys_ingest
nothing of the exporter or the CLI, the exporter nothing of the CLI; tests and tools import nothing of bench
(issue 44: shared harness code lives in tests/ and bench imports it). Read from the source (every
import statement, function-local ones too), so a lazy import cannot hide."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# package -> the project packages it must not import
FORBIDDEN = {"hostio": ("exporter", "nsys_ingest", "gpu_spatial", "dashboards"),
             "nsys_ingest": ("exporter", "gpu_spatial", "dashboards"),
             "exporter": ("gpu_spatial",),
             "gpu_trace": ("exporter", "nsys_ingest", "gpu_spatial", "dashboards", "hostio"),  # runs inside the app
             "tests": ("bench",), "tools": ("bench",)}


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_lower_floor_imports_no_upper_one(package):
    wrong = sorted(f"{path.relative_to(ROOT)}: {name}" for path in (ROOT / package).rglob("*.py")
                   for name in imported(path) if name.split(".")[0] in FORBIDDEN[package])
    assert wrong == []


def test_the_check_sees_a_function_local_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from exporter.snapshot import OK\n")
    assert imported(module) == {"exporter.snapshot"}
