"""The documentation site builds strictly, its API reference lists every public name, and the public
entry points document their parameters (Google style: ``Args:``), so `make docs` cannot silently rot.

mkdocs, mkdocstrings and griffe come with the `test` extra (the `docs` extra) on Python 3.11+; where
they are missing the tests skip, except under CI (`CI` set), where they fail. mkdocstrings needs Python
3.11, so on 3.10 (the boards-core run) they skip either way. Nothing here imports pinstorm's layers:
griffe reads the source (docs/hooks.py mounts the layer folders as ``pinstorm.<layer>``).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("boards", "pipeline", "training")

# Everything the reference renders documents each of its parameters
# (test_public_functions_document_every_parameter): every function, and every class's constructor and
# public methods (only the constructor where its directive says ``members: false``). Parameters a function
# shares with `ReaderOptions` / `FitOptions` may be documented once there instead, when the function's
# docstring names that class; a constructor's may be documented on its class (Args or Attributes).
OPTION_CLASSES = {
    "ReaderOptions": "pinstorm.pipeline.options.ReaderOptions",
    "FitOptions": "pinstorm.training.runs.FitOptions",
}


def _require_docs_tools() -> None:
    if sys.version_info < (3, 11):
        pytest.skip("mkdocstrings needs Python 3.11+ (the docs extra is not installed on this Python)")
    missing = [m for m in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "griffe")
               if importlib.util.find_spec(m.split(".")[0]) is None
               or (m == "mkdocstrings_handlers.python" and importlib.util.find_spec(m) is None)]
    if not missing:
        return
    reason = f"{', '.join(missing)} not installed (pip install -e '.[docs]')"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and the documentation site cannot be built: {reason}", pytrace=False)
    pytest.skip(reason)


def _layer_exports() -> dict[str, list[str]]:
    """Each layer's `__all__`, read from the source (training's is ``sorted(_EXPORTS)``)."""
    exports = {}
    for layer in LAYERS:
        tree = ast.parse((ROOT / layer / "__init__.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id in ("__all__", "_EXPORTS") and not isinstance(node.value, ast.Call):
                exports[layer] = list(ast.literal_eval(node.value))
    return exports


def _loader():
    import griffe

    spec = importlib.util.spec_from_file_location("pinstorm_docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    loader = griffe.GriffeLoader(allow_inspection=False, docstring_parser=griffe.Parser.google,
                                 extensions=griffe.load_extensions(hooks.LayerPackages))
    for layer in LAYERS:
        loader.load(f"pinstorm.{layer}")
    loader.resolve_aliases(implicit=True, external=False)
    return loader


def _documented(obj, section_kinds: tuple[str, ...]) -> set[str]:
    import griffe

    if obj.docstring is None:
        return set()
    names = set()
    for section in obj.docstring.parse(griffe.Parser.google, warn_missing_types=False):
        if section.kind.value in section_kinds:
            names.update(item.name for item in section.value)
    return names


def undocumented_parameters(loader, path: str) -> list[str]:
    """The parameters of the function at `path` its docstring does not document."""
    func = loader.modules_collection[path]
    func = func.final_target if func.is_alias else func
    documented = _documented(func, ("parameters", "other parameters"))
    text = func.docstring.value if func.docstring else ""
    if func.name == "__init__" and func.parent is not None and func.parent.is_class:
        documented |= _documented(func.parent, ("parameters", "other parameters", "attributes"))
        text += func.parent.docstring.value if func.parent.docstring else ""
    for name, class_path in OPTION_CLASSES.items():
        if name in text:
            documented |= _documented(loader.modules_collection[class_path], ("attributes",))
    return [p.name for p in func.parameters
            if p.name not in ("self", "cls") and p.kind.value not in ("variadic positional", "variadic keyword")
            and p.name not in documented]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    _require_docs_tools()
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def test_the_site_builds_strictly_with_an_api_reference(site):
    for guide in ("index", "boards", "cloud", "pipeline", "training", "architecture"):
        assert (site / guide / "index.html" if guide != "index" else site / "index.html").is_file(), guide
    pages = {layer: (site / "reference" / layer / "index.html").read_text(encoding="utf-8") for layer in LAYERS}
    for layer, names in {"boards": ["pin_get", "board_register", "Board"],
                         "pipeline": ["make_dataset", "make_torch_loader", "convert", "ReaderOptions"],
                         "training": ["train_torch", "spark_train", "FitOptions"]}.items():
        for name in names:
            assert f'id="pinstorm.{layer}.' in pages[layer] and re.search(rf"\b{name}\b", pages[layer]), (layer, name)
    # a documented parameter shows up in the rendered parameters table
    assert "storage_options" in pages["pipeline"] and "extract_limits" in pages["boards"]


def test_the_reference_lists_every_public_name():
    pages = {layer: (ROOT / "docs" / "reference" / f"{layer}.md").read_text(encoding="utf-8") for layer in LAYERS}
    exports = _layer_exports()
    assert set(exports) == set(LAYERS) and all(len(names) > 10 for names in exports.values())
    for layer, names in exports.items():
        listed = set(re.findall(r"^::: pinstorm\.[\w.]*\.(\w+)$", pages[layer], re.M))
        missing = sorted(set(names) - listed)
        assert not missing, f"docs/reference/{layer}.md does not list {missing}"


def reference_directives() -> list[tuple[str, bool]]:
    """The objects docs/reference/*.md documents: (path of a ``:::`` directive, whether members are shown)."""
    found = []
    for layer in LAYERS:
        text = (ROOT / "docs" / "reference" / f"{layer}.md").read_text(encoding="utf-8")
        for match in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", text, re.M):
            found.append((match.group(1), "members: false" not in match.group(2)))
    return found


def public_functions(loader) -> list[str]:
    """Every function the reference documents, and its classes' constructors and public methods."""
    paths = []
    for path, members in reference_directives():
        obj = loader.modules_collection[path]
        obj = obj.final_target if obj.is_alias else obj
        if obj.is_function:
            paths.append(obj.path)
        elif obj.is_class:
            paths.extend(m.path for name, m in obj.members.items() if not m.is_alias and m.is_function
                         and (name == "__init__" or (members and not name.startswith("_"))))
    return paths


def test_public_functions_document_every_parameter():
    _require_docs_tools()
    loader = _loader()
    paths = public_functions(loader)
    assert len(paths) > 150
    missing = {path: names for path in paths if (names := undocumented_parameters(loader, path))}
    assert not missing, f"parameters missing from the docstrings' Args sections: {missing}"
