"""Every import in ``src/gear_rl`` stays within docs/design.md's package table (§1), and the
packages form no cycle. The table is the one home of the allowed imports: this test reads it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "gear_rl"
DESIGN = ROOT / "docs" / "design.md"


def _table() -> dict[str, set[str]]:
    """``{unit: allowed units}`` from the design's package table."""
    allowed: dict[str, set[str]] = {}
    for line in DESIGN.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `gear_rl\.(\w+)` \|.*\| (.+) \|$", line)
        if match:
            imports = match.group(2).strip()
            allowed[match.group(1)] = (set() if imports == "nothing"
                                       else set(re.findall(r"`(\w+)`", imports)))
    return allowed


def _unit(path: Path) -> str:
    return path.relative_to(SOURCE).parts[0].removesuffix(".py")


def _imports(path: Path, unit: str) -> set[str]:
    """The project units other than ``unit`` that ``path`` imports, at the top or inside
    functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "gear_rl":
                names = [f"gear_rl.{alias.name}" for alias in node.names]
        found.update(name.split(".")[1] for name in names
                     if name.startswith("gear_rl.") and name.split(".")[1] != unit)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        if _unit(path) != "__init__":
            graph.setdefault(_unit(path), set()).update(_imports(path, _unit(path)))
    return graph


def _disallowed(graph: dict[str, set[str]], table: dict[str, set[str]]) -> dict[str, list]:
    return {unit: sorted(targets - table.get(unit, set())) for unit, targets in graph.items()
            if targets - table.get(unit, set())}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        if unit in path:
            return [*path[path.index(unit):], unit]
        if unit in done:
            return None
        path.append(unit)
        for target in sorted(graph.get(unit, ())):
            if (found := visit(target)) is not None:
                return found
        path.pop()
        done.add(unit)
        return None

    for unit in sorted(graph):
        if (found := visit(unit)) is not None:
            return found
    return None


def test_the_table_lists_every_unit() -> None:
    assert set(_table()) == set(_graph())


def test_every_import_is_allowed_by_the_table() -> None:
    extra = _disallowed(_graph(), _table())
    assert not extra, f"imports the design's package table does not allow: {extra}"


def test_the_units_form_no_cycle() -> None:
    assert _cycle(_graph()) is None


def test_the_checks_see_a_disallowed_import_and_a_cycle(tmp_path) -> None:
    """The checks can fail: ``credit`` importing ``train`` (inside a function) is refused by the
    table, and with ``train`` importing ``credit`` it is a cycle."""
    for unit, code in {"credit": "def f():\n    from gear_rl.train.x import y\n",
                       "train": "import gear_rl.credit.gear\n"}.items():
        (tmp_path / unit).mkdir()
        (tmp_path / unit / "__init__.py").write_text(code)
    graph = {unit: _imports(tmp_path / unit / "__init__.py", unit) for unit in ("credit", "train")}
    assert graph == {"credit": {"train"}, "train": {"credit"}}
    assert _disallowed(graph, _table()) == {"credit": ["train"]}
    assert _cycle(graph) == ["credit", "train", "credit"]
