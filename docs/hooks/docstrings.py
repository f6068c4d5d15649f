"""A Griffe extension for the API pages: docstrings written for ``help()``, Sphinx and doctest read as Markdown.

The docstrings stay plain text in the source, readable in a terminal; on the site:

- a doctest (``>>>`` lines and what they print) becomes a fenced ``pycon`` block, so that ``x["a"][0]`` is code and
  not a Markdown link;
- a Sphinx role (``:func:`~jaxstow.save```) becomes a link to the entry it names, resolved in the docstring's scope as
  Python would and named by the path users reach it by (plain code, ``save``, where the site has no such entry, or
  where only a private name reaches it);
- a guide named by its path (``See docs/checkpointing.md#preemption``) becomes a link to that page of the site, titled
  as the page is;
- parameters documented together (``storage_options, transfer, cache_dir: ...``) get one entry each;
- an attribute documented by ``#:`` comments above it (as Sphinx reads them) has them as its docstring, and an
  attribute set in a method (``self.metadata = ...``) shows no value: how ``__init__`` computes it is no part of the API.
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from typing import Any

import griffe

DOCS = Path(__file__).resolve().parents[1]
_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):`(~?)([^`]+)`")
_GUIDE = re.compile(r"\bdocs/([\w-]+)\.md(#[\w-]+)?")
_SECTION = re.compile(r"^\s*(?:Args|Arguments|Parameters|Attributes|Keyword Args|Other Parameters):\s*$")
_GROUPED = re.compile(r"^(\s+)(\*{0,2}\w+(?:, \*{0,2}\w+)+):(\s.*)?$")
_TITLE = re.compile(r"^# +(.+?) *$", re.M)


@functools.cache
def guide_title(name: str) -> str:
    """The title of the guide ``docs/<name>.md``: its first heading, without code marks."""
    page = DOCS / f"{name}.md"
    if not page.is_file():
        raise ValueError(f"a docstring names docs/{name}.md, which does not exist: name a page of docs/")
    found = _TITLE.search(page.read_text())
    return found[1].replace("`", "") if found else name


def _guide_link(found: re.Match[str]) -> str:
    # The API pages are api/<module>.md: a guide is one folder up, and Markdown links between pages name their files.
    return f"[{guide_title(found[1])}](../{found[1]}.md{found[2] or ''})"


def public_paths(pkg: griffe.Module) -> dict[str, str]:
    """The path users reach each object by, from its path where it is defined: a public module's own objects and the
    names its ``__all__`` exports (the shortest, where several modules export one object)."""
    found: dict[str, str] = {}
    todo = [pkg]
    while todo:
        module = todo.pop()
        exports = {str(name) for name in module.exports or ()}
        for name, member in module.members.items():
            if name.startswith("_") or (member.is_alias and name not in exports):
                continue
            try:
                target = member.final_target if member.is_alias else member
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            path = f"{module.path}.{name}"
            if len(path) < len(found.get(target.path, path + "_")):
                found[target.path] = path
            if target.is_module and not member.is_alias:
                todo.append(target)
    return found


def public(path: str, paths: dict[str, str]) -> str | None:
    """``path`` as users reach it (``jaxstow._read.reader.Reader.read``: ``jaxstow.Reader.read``); ``None`` for an
    object they cannot reach without a private name."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        if (head := ".".join(parts[:cut])) in paths:
            return ".".join([paths[head], *parts[cut:]])
    return None if any(part.startswith("_") for part in parts) else path


def resolve(scope: griffe.Object | None, name: str) -> str | None:
    """The full path of ``name`` (``Reader``, ``Reader.load``, ``jaxstow.save``) as Python would look it up in
    ``scope``, its enclosing class and module; ``None`` where none of them has it."""
    head, _, rest = name.partition(".")
    obj: griffe.Object | None = scope
    while obj is not None:
        if obj.is_module and head == obj.package.name:
            return name
        try:
            path = _member_path(obj, head)
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
        if path is not None:
            return f"{path}.{rest}" if rest else path
        obj = obj.parent
    return None


def _member_path(obj: griffe.Object, name: str) -> str | None:
    if obj.is_class:  # its own members and those it inherits, under its own path
        return f"{obj.path}.{name}" if name in obj.all_members else None
    if name not in obj.members:
        return None
    found = obj.members[name].final_target if obj.members[name].is_alias else obj.members[name]
    imported = obj.imports.get(name) if obj.is_module else None
    if found.is_module and imported is not None and imported != found.path:
        # ``from jaxstow.io.no_save import no_save``: at run time the package's name is the function, not the module.
        return imported
    return found.path


def comment_docstring(obj: griffe.Object) -> str | None:
    """The ``#:`` comment lines right above an attribute's assignment, as its docstring."""
    if not obj.is_attribute or obj.docstring is not None or obj.lineno is None:
        return None
    try:
        lines = obj.lines_collection[obj.filepath]  # type: ignore[index]
    except (KeyError, ValueError):
        return None
    index, found = obj.lineno - 2, []
    while index >= 0 and lines[index].strip().startswith("#:"):
        found.insert(0, lines[index].strip()[2:].strip())
        index -= 1
    return " ".join(found) or None


def _link_role(scope: griffe.Object | None, paths: dict[str, str]) -> Any:
    def link(found: re.Match[str]) -> str:
        name = found[2]
        text = f"<code>{html.escape(name.rsplit('.', 1)[-1] if found[1] else name)}</code>"
        resolved = resolve(scope, name)
        target = None if resolved is None else public(resolved, paths)
        # An optional reference is a link where the site renders its target, and plain code where it does not.
        return text if target is None else f'<autoref identifier="{target}" optional>{text}</autoref>'

    return link


def _split_grouped(lines: list[str]) -> list[str]:
    """``a, b: text`` in an Args or Attributes section as ``a: text`` and ``b: text`` (continuations repeated)."""
    out: list[str] = []
    in_section = False
    index = 0
    while index < len(lines):
        line = lines[index]
        in_section = bool(_SECTION.match(line)) or (in_section and (not line.strip() or line[:1].isspace()))
        grouped = _GROUPED.match(line) if in_section else None
        if grouped is None:
            out.append(line)
            index += 1
            continue
        indent, names, text = grouped[1], grouped[2].split(", "), grouped[3] or ""
        index += 1
        continued = []
        while index < len(lines) and lines[index].startswith(indent + " ") and lines[index].strip():
            continued.append(lines[index])
            index += 1
        for name in names:
            out.extend([f"{indent}{name}:{text}", *continued])
    return out


def markdown(text: str, scope: griffe.Object | None = None, paths: dict[str, str] | None = None) -> str:
    """A docstring's text as Markdown: doctests fenced, Sphinx roles (to the public paths in ``paths``) and guide
    paths as links, grouped parameters split."""
    lines, out, index = _split_grouped(text.splitlines()), [], 0
    link_role = _link_role(scope, paths or {})
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            while index < len(lines) and lines[index].strip() and lines[index].startswith(indent):
                out.append(lines[index])
                index += 1
            out.append(f"{indent}```")
            continue
        out.append(_GUIDE.sub(_guide_link, _ROLE.sub(link_role, line)))
        index += 1
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Rewrites the docstring of every object of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        paths = public_paths(pkg)
        seen: set[str] = set()
        todo: list[griffe.Object | griffe.Alias] = [pkg]
        while todo:
            obj = todo.pop()
            if obj.is_alias or obj.path in seen:
                continue
            seen.add(obj.path)
            if (comment := comment_docstring(obj)) is not None:
                obj.docstring = griffe.Docstring(comment, lineno=obj.lineno, parent=obj)
            if obj.is_attribute and "instance-attribute" in obj.labels:
                obj.value = None
            if obj.docstring is not None:
                obj.docstring.value = markdown(obj.docstring.value, obj, paths)
            todo.extend(obj.members.values())
