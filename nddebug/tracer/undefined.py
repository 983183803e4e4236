"""Outputs a kernel leaves undefined under some attributes (``data/undefined_outputs.toml``):
Svd's u and v without compute_uv, the eigenvectors of SelfAdjointEigV2 and Eig without
compute_v. They hold stale memory, different in every call: digesting them would name the op
a source of a difference no program sees. The tracer leaves them undigested and says so in
the op's note. The same table holds outputs that are never data, whatever the attributes: an
iterator's string handle is the name of a resource, unique in every process and call.

This module loads the table strictly (a broken table fails the suite, not a user's trace)
and answers which outputs of an op, with its attributes, are undefined.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from nddebug.tracer import ops

SCHEMA = 1
_FIELDS = {"op", "outputs", "when", "source", "measured"}
_OPTIONAL = {"reason"}


@dataclass(frozen=True)
class Undefined:
    """The outputs ``outputs`` of ``op`` are undefined when every attribute in ``when`` has
    the value given."""

    op: str
    outputs: tuple[str, ...]
    when: tuple[tuple[str, Any], ...]
    source: str
    measured: str
    # Why they are not compared, where it is not stale memory (a resource's name).
    reason: str = ""


def parse(text: str, origin: str = "<string>") -> dict[str, Undefined]:
    """The entries of a table by op type, checked: a ValueError names the entry and field."""
    data = tomllib.loads(text)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{origin}: schema must be {SCHEMA}, not {data.get('schema')!r}")
    found: dict[str, Undefined] = {}
    for i, entry in enumerate(data.get("output", [])):
        where = f"{origin}: output #{i + 1} ({entry.get('op', '?')})"
        if not _FIELDS <= set(entry) <= _FIELDS | _OPTIONAL:
            raise ValueError(
                f"{where}: unknown fields {sorted(set(entry) - _FIELDS - _OPTIONAL)}, "
                f"missing {sorted(_FIELDS - set(entry))}"
            )
        outputs, when = entry["outputs"], entry["when"]
        if (
            not isinstance(outputs, list)
            or not outputs
            or not all(isinstance(o, str) for o in outputs)
        ):
            raise ValueError(f"{where}: outputs must be a non-empty list of output names")
        reason = entry.get("reason", "")
        if not isinstance(when, dict) or not isinstance(reason, str) or not (when or reason):
            raise ValueError(
                f"{where}: when must give at least one attribute value (an output that is "
                "never data, with no condition, says why in reason, a string)"
            )
        if entry["op"] in found:
            raise ValueError(f"{where}: a second entry for {entry['op']}")
        found[entry["op"]] = Undefined(
            op=str(entry["op"]),
            outputs=tuple(outputs),
            when=tuple(sorted(when.items())),
            source=str(entry["source"]),
            measured=str(entry["measured"]),
            reason=reason,
        )
    return found


@functools.cache
def table() -> dict[str, Undefined]:
    """The entries of ``data/undefined_outputs.toml`` by op type."""
    path = resources.files("nddebug") / "data" / "undefined_outputs.toml"
    return parse(path.read_text(encoding="utf-8"), "undefined_outputs.toml")


def undefined_outputs(op_type: str, attrs: Any) -> tuple[tuple[int, ...], str]:
    """The positions of ``op_type``'s outputs left undefined with these attributes, and the
    note that says so ((), "" when all are defined)."""
    entry = table().get(op_type)
    if entry is None:
        return (), ""
    for name, want in entry.when:
        if ops.attr_value(ops.attr(attrs, name)) != want:
            return (), ""
    op_def = ops.op_def(op_type)
    names = [a.name for a in op_def.output_arg] if op_def is not None else []
    at = tuple(names.index(o) for o in entry.outputs if o in names)
    if entry.reason:
        return at, f"outputs {', '.join(entry.outputs)} not compared: {entry.reason}"
    conditions = ", ".join(f"{k}={v}" for k, v in entry.when)
    return at, (
        f"outputs {', '.join(entry.outputs)} not compared: {op_type} leaves them undefined "
        f"with {conditions} (stale memory, different in every call)"
    )
