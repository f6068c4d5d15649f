"""A Griffe extension for the API pages: docstrings written for Sphinx and doctest read as Markdown.

A doctest (``>>>`` lines and what they print) becomes a fenced ``pycon`` block, so that ``x["a"][0]`` is code and
not a Markdown link; a Sphinx role (``:func:`~jaxstow.save```) becomes code, ``save``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):`(~?)([^`]+)`")


def _role(found: re.Match[str]) -> str:
    target = found[2]
    return f"`{target.rsplit('.', 1)[-1] if found[1] else target}`"


def markdown(text: str) -> str:
    """A docstring's text with its doctests fenced and its Sphinx roles as code."""
    lines, out, index = text.splitlines(), [], 0
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
        out.append(_ROLE.sub(_role, line))
        index += 1
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Rewrites the docstring of every object of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[str] = set()
        todo: list[griffe.Object | griffe.Alias] = [pkg]
        while todo:
            obj = todo.pop()
            if obj.is_alias or obj.path in seen:
                continue
            seen.add(obj.path)
            if obj.docstring is not None:
                obj.docstring.value = markdown(obj.docstring.value)
            todo.extend(obj.members.values())
