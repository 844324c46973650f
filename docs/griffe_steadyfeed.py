"""A griffe extension for the API reference (``mkdocs.yml``: ``extensions``): it makes
steadyfeed's docstrings read well as Markdown without changing them.

* a field declared ``name: T = option(default, doc="...")`` (``steadyfeed.config``) gets
  its ``doc`` as its docstring and ``default`` as its value, so each option is documented
  where it is declared, once;
* reST roles (``:class:`~steadyfeed.Loader```) become code spans (``Loader``);
* a run of ``>>>`` lines becomes a ``pycon`` block (Markdown would read ``>`` as a quote);
* a paragraph ending in ``::`` ends in ``:`` (its indented block is code in Markdown too).
"""

from __future__ import annotations

import ast
import re

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`~?\.?([^`]+)`")


def _role(match: re.Match) -> str:
    target = match.group(1)
    return f"``{target.rsplit('.', 1)[-1] if match.group(0).find('~') >= 0 else target}``"


def markdown(text: str) -> str:
    """``text`` (a docstring in steadyfeed's reST-flavoured style) as Markdown."""
    text = _ROLE.sub(_role, text)
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
                block.append(lines[i][len(indent) :])
                i += 1
            if out and out[-1].strip():
                out.append("")
            out += [indent + "```pycon", *(indent + b for b in block), indent + "```", ""]
            continue
        if line.rstrip().endswith("::") and not line.strip() == "::":
            line = line.rstrip()[:-1]
        out.append(line)
        i += 1
    return "\n".join(out)


class SteadyfeedDocstrings(griffe.Extension):
    def on_attribute_instance(self, *, node, attr, agent, **kwargs) -> None:
        value = getattr(node, "value", None)
        if not (isinstance(value, ast.Call) and getattr(value.func, "id", None) == "option"):
            return
        doc = next(
            (k.value.value for k in value.keywords if k.arg == "doc" and isinstance(k.value, ast.Constant)), None
        )
        if doc is None:  # an implicitly concatenated string is still one Constant; anything else: leave it
            return
        attr.docstring = griffe.Docstring(doc, parent=attr)
        attr.value = ast.unparse(value.args[0]) if value.args else None

    def on_package(self, *, pkg, loader, **kwargs) -> None:
        seen: set[int] = set()

        def visit(obj) -> None:
            if id(obj) in seen or obj.is_alias:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = markdown(obj.docstring.value)
            for member in obj.members.values():
                visit(member)

        visit(pkg)
