"""Templates of declared figures (report/figures.py): ``str.format`` strings of ours, filled with values from
results.json, each value escaped for its medium by the caller's ``escape``."""

from __future__ import annotations

import re
import string
from typing import Any

_NAME = re.compile(r"[A-Za-z_][\w@]*(\.[\w@]+)*")  # a field, or a dotted path into nested ones: chance.acc@1


def lookup(values: dict[str, Any], name: str, default: Any = "undefined") -> Any:
    """``values[name]``, a dotted ``name`` walking nested dicts; ``default`` where a part is missing."""
    if not _NAME.fullmatch(name):
        return default
    value: Any = values
    for part in name.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]  # headline.0: an item of a list
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return default
    return value


def fill(template: str, values: dict[str, Any], escape, literal=str) -> str:
    """``template`` (ours) over ``values`` (from results, each escaped by ``escape``): names only, formats
    such as ``{x:.3f}`` or ``{n:,}`` applied to numbers; a format a value cannot take shows the value as is.
    ``literal``: what the template's own text goes through (a medium where its characters mean markup, such as
    Rich's square brackets on the console, escapes them; Markdown templates keep theirs)."""
    out = []
    for text, name, spec, _ in string.Formatter().parse(template):
        out.append(literal(text))
        if name is None:
            continue
        value = lookup(values, name)
        if isinstance(value, Raw):
            out.append(value)
            continue
        if isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        elif value is None:
            value = "undefined"
        try:
            shown = format(value, spec or "") if isinstance(value, (int, float)) and not isinstance(value, bool) \
                else str(value)
        except (ValueError, TypeError):
            shown = str(value)
        if shown.startswith("-") and not shown.strip("+-0.%"):  # a figure that rounds to zero: no minus
            shown = shown[1:]
        out.append(escape(shown))
    return "".join(out)


class Raw(str):
    """Text already escaped for its medium (put into a template as it is)."""
