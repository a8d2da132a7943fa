"""Build helpers for the documentation site (mkdocs.yml); not part of the installed package.

Two jobs:

* mkdocs hooks: the site's home page is the repository's README.md (outside ``docs/``), its links to
  ``docs/*.md`` rewritten to the guide pages and its link to CHANGELOG.md to that page.
* `LayerPackages`, a griffe extension: ``boards/``, ``pipeline/`` and ``training/`` install as
  ``pinstorm.boards``, ``pinstorm.pipeline`` and ``pinstorm.training`` (``[tool.setuptools.package-dir]``),
  a mapping griffe's static finder does not follow. When griffe visits ``pinstorm/__init__.py`` this adds
  the three layers (every module of each folder) under it, read statically: nothing is imported, so
  building the reference needs neither TensorFlow nor torch.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("boards", "pipeline", "training")
_EXTRA_PAGES = {"index.md": "README.md", "changelog.md": "CHANGELOG.md"}


# -- mkdocs hooks ------------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, source in _EXTRA_PAGES.items():
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(ROOT / source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "index.md":
        markdown = re.sub(r"\]\(docs/", "](", markdown)
        markdown = markdown.replace("](CHANGELOG.md)", "](changelog.md)")
    return markdown


# -- griffe extension --------------------------------------------------------------------------------


def _layer_folder(name: str) -> Path | None:
    """Where ``pinstorm.<name>`` lives: the installed mapping (editable or not), else the checkout."""
    try:
        spec = importlib.util.find_spec(f"pinstorm.{name}")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        return Path(spec.origin).parent
    folder = ROOT / name
    return folder if (folder / "__init__.py").is_file() else None


try:
    import griffe
except ImportError:  # mkdocs hooks alone (griffe is only needed by the API reference)
    griffe = None  # type: ignore[assignment]


if griffe is not None:

    class LayerPackages(griffe.Extension):
        """Mount the layer folders as ``pinstorm.boards``, ``pinstorm.pipeline``, ``pinstorm.training``."""

        def on_module_members(self, *, node: ast.AST | griffe.ObjectNode, mod: griffe.Module,
                              agent: griffe.Visitor | griffe.Inspector, **kwargs: Any) -> None:
            if mod.path != "pinstorm" or not isinstance(agent, griffe.Visitor):
                return
            for name in LAYERS:
                folder = _layer_folder(name)
                if folder is None or name in mod.members:
                    continue
                layer = self._visit(name, folder / "__init__.py", mod, agent)
                self._mount(folder, layer, agent)
                mod.set_member(name, layer)

        def _mount(self, folder: Path, package: griffe.Module, agent: griffe.Visitor) -> None:
            """The modules and subpackages (``boards/backends``, ``boards/safety``) of `folder` under `package`.
            As griffe's loader does, a submodule takes the place of a same-named import in the package
            (pipeline's `convert`): the reference names such objects by their module."""
            for path in sorted(folder.glob("*.py")):
                if path.name != "__init__.py":
                    package.set_member(path.stem, self._visit(path.stem, path, package, agent))
            for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file()):
                subpackage = self._visit(sub.name, sub / "__init__.py", package, agent)
                self._mount(sub, subpackage, agent)
                package.set_member(sub.name, subpackage)

        @staticmethod
        def _visit(name: str, path: Path, parent: griffe.Module, agent: griffe.Visitor) -> griffe.Module:
            code = path.read_text(encoding="utf-8-sig")
            agent.lines_collection[path] = code.splitlines(keepends=False)
            return griffe.visit(
                name,
                filepath=path,
                code=code,
                parent=parent,
                extensions=agent.extensions,
                docstring_parser=agent.docstring_parser,
                docstring_options=agent.docstring_options,
                lines_collection=agent.lines_collection,
                modules_collection=agent.modules_collection,
            )
