"""The import graph of pinstorm, read from the source: no import cycle between modules, and data flowing
boards -> pipeline -> training only (boards imports neither pipeline nor training; pipeline does not
import training).

Every ``import`` and ``from ... import`` counts, also those inside functions: a cycle broken only by
deferring an import to call time is still a cycle in the design. Where the layers live comes from
pyproject's ``[tool.setuptools.package-dir]`` (``pinstorm.boards`` is the ``boards/`` folder, ...).
Edges: ``import a.b`` and ``from a.b import name`` depend on module ``a.b``, or on ``a.b.name`` when
that is a module (``from . import registry``); importing a package depends on its ``__init__``.
Imports made by ``importlib`` at run time (the lazy layer exports) are not seen, on purpose.
"""

from __future__ import annotations

import ast
try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("pinstorm.boards", "pinstorm.pipeline", "pinstorm.training")   # in the only direction data flows


def package_dirs(root: Path) -> dict[str, Path]:
    """``{"pinstorm": root/"pinstorm", "pinstorm.boards": root/"boards", ...}`` as pyproject installs them."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return {package: root / folder for package, folder in config["tool"]["setuptools"]["package-dir"].items()}


def modules(dirs: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Every module name -> (its file, whether it is a package ``__init__``)."""
    found = {}
    for package, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):   # subpackages too (boards/backends, boards/safety)
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = (path, path.stem == "__init__")
    return found


def import_graph(dirs: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the pinstorm modules it imports (anywhere in its source)."""
    known = modules(dirs)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in known.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = []
                for alias in node.names:
                    if f"{source}.{alias.name}" in known:          # from . import registry: the submodule
                        targets.append(f"{source}.{alias.name}")
                    else:                                           # from .board import Board: the module
                        targets.append(source)
            else:
                continue
            # only pinstorm's own modules; one that does not exist (yet) is no edge
            edges.update(target for target in targets if target in known and target != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def layer_of(module: str) -> int | None:
    for rank, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return rank
    return None


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a lower layer into a higher one (boards -> pipeline, pipeline -> training, ...)."""
    wrong = []
    for module, targets in sorted(graph.items()):
        rank = layer_of(module)
        for target in sorted(targets):
            other = layer_of(target)
            if rank is not None and other is not None and other > rank:
                wrong.append(f"{module} imports {target}")
    return wrong


def _describe(found: list[list[str]], graph: dict[str, set[str]]) -> str:
    return "; ".join(" <-> ".join(c) + " (" + ", ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) + ")"
                     for c in found)


def test_no_import_cycle_between_pinstorm_modules():
    graph = import_graph(package_dirs(ROOT))
    found = cycles(graph)
    assert not found, f"import cycles: {_describe(found, graph)}"


def test_data_flows_boards_to_pipeline_to_training_only():
    graph = import_graph(package_dirs(ROOT))
    assert not back_arrows(graph), back_arrows(graph)


def test_every_module_has_its_row_in_the_architecture_guide():
    """docs/architecture.md lists each module with its one idea: a module added without its row is found."""
    guide = (ROOT / "docs" / "architecture.md").read_text()
    files = [path for path, is_package in modules(package_dirs(ROOT)).values() if not is_package]
    assert len(files) > 40
    missing = [str(p.relative_to(ROOT)) for p in files if f"| `{p.relative_to(ROOT).as_posix()}` |" not in guide]
    assert not missing, f"modules without a row in docs/architecture.md: {missing}"


def test_the_graph_covers_every_layer_and_imports_inside_functions():
    """Guards the checks above against seeing nothing: modules of each layer are found, function-level
    imports (training imports boards and pipeline only inside functions) are edges."""
    graph = import_graph(package_dirs(ROOT))
    for layer in LAYERS:
        assert sum(layer_of(m) == LAYERS.index(layer) for m in graph) >= 3, layer
    assert "pinstorm.boards" in graph["pinstorm.training.experiments"]          # `from pinstorm import boards`
    assert "pinstorm.pipeline" in graph["pinstorm.training.profiling"]
    assert "pinstorm.training.keras_env" in graph["pinstorm.training.fit"]        # `from .keras_env import ...`


@pytest.fixture
def toy(tmp_path):
    """A package laid out as pyproject maps pinstorm: a top package and one folder per layer."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"pinstorm" = "pinstorm"\n'
                                             '"pinstorm.boards" = "boards"\n"pinstorm.pipeline" = "pipeline"\n'
                                             '"pinstorm.training" = "training"\n')
    for folder in ("pinstorm", "boards", "pipeline", "training"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    return tmp_path


def test_a_cycle_through_a_function_level_import_is_found(toy):
    (toy / "boards" / "api.py").write_text("from .board import Board\n")
    (toy / "boards" / "board.py").write_text("class Board:\n    def pin(self):\n        from . import api\n")
    (toy / "boards" / "cache.py").write_text("import pinstorm.boards.board\n")
    graph = import_graph(package_dirs(toy))
    assert cycles(graph) == [["pinstorm.boards.api", "pinstorm.boards.board"]]


def test_a_back_arrow_between_layers_is_found(toy):
    (toy / "pipeline" / "reader.py").write_text("def read():\n    from pinstorm.training import fit\n")
    (toy / "training" / "fit.py").write_text("from pinstorm import pipeline\nfrom ..boards import api\n")
    (toy / "boards" / "api.py").write_text("")
    graph = import_graph(package_dirs(toy))
    assert graph["pinstorm.training.fit"] == {"pinstorm.pipeline", "pinstorm.boards.api"}
    assert back_arrows(graph) == ["pinstorm.pipeline.reader imports pinstorm.training.fit"]


LAYER_ERRORS = {"pinstorm.boards": "BoardError", "pinstorm.pipeline": "PipelineError",
                "pinstorm.training": "TrainingError"}


def exception_classes(dirs: dict[str, Path]) -> dict[str, tuple[str, list[str]]]:
    """Every class defined in pinstorm's source, read with ast (no optional extra is imported): its name ->
    (its module, the names of its bases)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for module, (path, _) in modules(dirs).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "?"
                         for b in node.bases]
                found[node.name] = (module, bases)
    return found


def ancestors(name: str, classes: dict[str, tuple[str, list[str]]]) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for base in classes.get(todo.pop(), ("", []))[1]:
            if base not in seen:
                seen.add(base)
                todo.append(base)
    return seen


def test_every_deliberate_error_subclasses_its_layers_base():
    """pinstorm.errors promises that each error a layer raises on purpose is a `PinstormError`: under
    `BoardError`, `PipelineError` or `TrainingError` by layer, with the built-in class users caught before
    kept as a second base. Private control-flow exceptions (`_Name`) and warnings are not errors."""
    import builtins

    builtin_errors = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    classes = exception_classes(package_dirs(ROOT))
    wrong, counted = [], 0
    for name, (module, _) in sorted(classes.items()):
        family = ancestors(name, classes)
        layer = next((layer for layer in LAYER_ERRORS if module.startswith(layer + ".")), None)
        if layer is None or name.startswith("_") or not family & (builtin_errors | {"PinstormError"}):
            continue
        if family & {"Warning", "UserWarning", "DeprecationWarning", "RuntimeWarning"}:
            continue
        counted += 1
        if name != LAYER_ERRORS[layer] and LAYER_ERRORS[layer] not in family:
            wrong.append(f"{module}.{name} (bases {sorted(family)})")
    assert counted > 40, counted   # the walk sees the errors of every layer
    assert not wrong, f"errors outside their layer's base: {wrong}"


def test_training_uses_the_pipelines_public_api_only():
    """Training imports `pinstorm.pipeline` (its `__all__`: readers, `locate`, `open_part`,
    `read_row_group`, `shard_row_groups`, ...), never a pipeline module: the pipeline's insides can change
    without breaking training."""
    graph = import_graph(package_dirs(ROOT))
    inside = [f"{module} imports {target}" for module, targets in sorted(graph.items())
              if module.startswith("pinstorm.training") for target in sorted(targets)
              if target.startswith("pinstorm.pipeline.")]
    assert not inside, inside
    assert any("pinstorm.pipeline" in targets for m, targets in graph.items() if m.startswith("pinstorm.training"))


def test_imports_between_layers_sit_at_the_top_of_modules():
    """Where one layer uses another shows at the top of the module, not inside a function; a lazy import
    is allowed only where an optional extra makes it necessary, and its line says so (a comment naming
    the extra)."""
    hidden = []
    for name, (path, _) in modules(package_dirs(ROOT)).items():
        rank = layer_of(name)
        if rank is None:
            continue
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.col_offset == 0:
                continue
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if not node.level else [])
            if isinstance(node, ast.ImportFrom) and node.module == "pinstorm":
                targets = [f"pinstorm.{a.name}" for a in node.names]
            others = [t for t in targets if layer_of(t) is not None and layer_of(t) != rank]
            if others and "extra" not in lines[node.lineno - 1]:
                hidden.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {others} inside a function")
    assert not hidden, hidden
