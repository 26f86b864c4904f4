"""JSON Lines corpora: one object (text under a field, optional id) or one JSON string per line.

Without an id field named, the field ``id`` is taken when the first line's object has one (then every line
needs it); otherwise rows are numbered. ``on_id_field`` is told which field the ids came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from layerscope.data.corpus_lines import list_names
from layerscope.errors import InputError

AUTO_ID_FIELD = "id"


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def jsonl_rows(
    lines: Iterator[tuple[int, str]], name: str, field: str, id_field: str | None,
    on_id_field: Callable[[str], None] | None = None, auto_id: bool = True,
) -> Iterator[tuple[str, str | None, int]]:
    first, auto_taken = True, False
    for lineno, line in lines:
        where = f"{name} line {lineno}"
        if not line.strip():
            raise InputError(
                f"{where} is blank; every line of a JSON Lines file must hold one JSON "
                'object (write {"' + field + '": ""} for an empty text, or remove the line)'
            )
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{where} is not valid JSON ({exc.msg} at column {exc.colno}); each line "
                "must be one complete JSON object"
            ) from exc
        except RecursionError as exc:
            raise InputError(f"{where} is nested too deeply to read as JSON") from exc
        except ValueError as exc:  # e.g. an integer too long to convert
            raise InputError(f"{where} is not valid JSON ({exc})") from exc
        rid: str | None = None
        if first:
            first = False
            if id_field is None and auto_id and isinstance(obj, dict) and AUTO_ID_FIELD in obj \
                    and field != AUTO_ID_FIELD:
                id_field, auto_taken = AUTO_ID_FIELD, True
            if id_field is not None and on_id_field is not None:
                on_id_field(id_field)
        if isinstance(obj, str):
            if id_field is not None:
                raise InputError(
                    f"{where} is a bare JSON string, so it has no id field {id_field!r}; "
                    "write each line as an object with the text and the id"
                )
            text = obj
        elif isinstance(obj, dict):
            if field not in obj:
                raise InputError(
                    f"{where} has no field {field!r} (its fields: {list_names(obj)}); "
                    "choose the text field with --text-field"
                )
            text = obj[field]
            if not isinstance(text, str):
                fix = ' (write "" for an empty text)' if text is None else ""
                raise InputError(
                    f"{where}: field {field!r} is {_kind(text)}, not a string; every "
                    f"text must be a JSON string{fix}"
                )
            if id_field is not None:
                if id_field not in obj:
                    raise InputError(
                        f"{where} has no id field {id_field!r} (its fields: "
                        f"{list_names(obj)}); every line needs an id"
                        + ("; the first line has one, so ids are read from that field"
                           if auto_taken else ", or leave the id field unset")
                    )
                value = obj[id_field]
                if isinstance(value, bool) or not isinstance(value, (str, int)):
                    raise InputError(
                        f"{where}: id field {id_field!r} is {_kind(value)}; ids must be "
                        "strings or integers"
                    )
                rid = str(value)
                if not rid:
                    raise InputError(
                        f"{where}: id field {id_field!r} is an empty string; give every line an id"
                    )
        else:
            raise InputError(
                f"{where} is {_kind(obj)}, not a JSON object or string; write each line "
                f'as {{"{field}": "..."}}'
            )
        if "\\u" in line:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InputError(
                    f"{where}: the text holds a lone surrogate escape "
                    f"(\\u{ord(text[exc.start]):04x}) that is not a character; fix the "
                    "escape or drop it"
                ) from exc
        yield text, rid, lineno
