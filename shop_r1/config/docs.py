"""Every key's documentation, read from beside its field: `shop-r1 config show --doc [KEY]`.

A field's doc is the docstring under it in its section's module (the schema is the documentation: nothing here is
written twice); its type and default come from the dataclass, its range from the field's bound (`bounded`).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from shop_r1.config.core import RANGES, Config
from shop_r1.config.fields import ConfigError


@dataclass(frozen=True)
class KeyDoc:
    """One key of the config, as `config show --doc` prints it."""

    key: str
    """The dotted key (`rl.lr`)."""
    section: str
    """The top-level section it belongs to (`rl`; "" for the top-level keys run_dir, storage_uri, seed)."""
    type: str
    """The field's type: int, float, bool, str, or `one of a, b` for a choice."""
    default: str
    """The default as YAML would write it."""
    range: str
    """The allowed numbers (`> 0`, `in [0, 1]`); "" where the type says it all."""
    doc: str
    """The docstring under the field, dedented."""

    def render(self) -> str:
        bound = f"  (range {self.range})" if self.range else ""
        body = "\n".join(f"    {line}".rstrip() for line in self.doc.splitlines()) or "    (no doc)"
        return f"{self.key}: {self.type} = {self.default}{bound}\n{body}"


def field_docstrings(cls: type) -> dict[str, str]:
    """{field name: its docstring} of a config dataclass, read from its module's source (attribute docstrings are
    not kept at run time)."""
    source = Path(inspect.getfile(sys.modules[cls.__module__])).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return {a.target.id: inspect.cleandoc(b.value.value) for a, b in zip(node.body, node.body[1:])
                    if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
                    and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                    and isinstance(b.value.value, str)}
    raise LookupError(f"{cls.__name__}: no class of that name in {cls.__module__}")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(str(v) for v in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _yaml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def key_docs(cls: type = Config, prefix: str = "") -> list[KeyDoc]:
    """Every key of the config, in the order of the dataclasses' fields (a nested section's keys where it is)."""
    hints, docs = typing.get_type_hints(cls), field_docstrings(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if dataclasses.is_dataclass(hints[f.name]):
            out += key_docs(hints[f.name], key + ".")
            continue
        allowed = RANGES.get(key)
        out.append(KeyDoc(key=key, section=key.split(".")[0] if "." in key else "", type=_type_name(hints[f.name]),
                             default=_yaml_value(f.default), range=str(allowed) if allowed else "",
                             doc=docs.get(f.name, "")))
    return out


def render_docs(key: str | None = None) -> str:
    """One key's doc; with a section's name (`rl`, `reward.self_certainty`) its keys; with None every key, grouped
    by section. An unknown key is a `ConfigError` with the nearest key (did you mean)."""
    every = key_docs()
    if key is None:
        out, section = [], None
        for d in every:
            if d.section != section:
                section = d.section
                out.append(f"[{section or 'top level'}]")
            out.append(d.render())
        return "\n".join(out)
    chosen = [d for d in every if d.key == key or d.key.startswith(key + ".")]
    if not chosen:
        raise ConfigError(_unknown(key, [d.key for d in every]))
    return "\n".join(d.render() for d in chosen)


def _unknown(key: str, keys: list[str]) -> str:
    """`load_config`'s words for an unknown key: the nearest key of its section, and the section's keys."""
    section, _, name = key.rpartition(".")
    prefix = section + "." if section else ""
    known = sorted({k[len(prefix):].split(".")[0] for k in keys if k.startswith(prefix)})
    if not known:  # the section itself is unknown: say so of its first unknown part
        return _unknown(section, keys)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {prefix}{close[0]}? " if close else ""
    return f"{key}: unknown config key ({hint}known in this section: {known})"
