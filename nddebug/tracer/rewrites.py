"""Grappler's single-consumer rewrites (``data/rewrites.toml``), as the instrumentation asks
about them: may an op's output be left undigested because its consumer would be fused with
it, or rewritten together with it, in the plain program?

A digest is one more consumer of the output it reads, and grappler rewrites some patterns
only where the intermediate has one consumer. The table says which; this module only loads
it strictly (a broken table fails the suite, not a user's trace) and answers lookups.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

SCHEMA = 1
WHERE = ("any", "cpu", "onednn", "gpu")
OPTIMIZERS = ("arithmetic", "constant folding", "remapper")
_FIELDS = {
    "name",
    "optimizer",
    "producers",
    "consumers",
    "pairs",
    "input",
    "where",
    "bits",
    "source",
}
_OPTIONAL = {"producers", "consumers", "pairs", "input"}


@dataclass(frozen=True)
class Rewrite:
    """One rewrite: each of ``pairs`` is a producer whose output a consumer reads (at input
    ``input``, or any). A table entry gives either ``producers`` and ``consumers`` (every
    producer with every consumer) or the ``pairs`` themselves, where not every combination
    is a pattern grappler rewrites."""

    name: str
    optimizer: str
    pairs: frozenset[tuple[str, str]]
    input: int | None
    where: frozenset[str]
    bits: str
    source: str


def parse(text: str, origin: str = "<string>") -> tuple[Rewrite, ...]:
    """The rewrites of a table, checked: a ValueError names the entry and the field."""
    data = tomllib.loads(text)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{origin}: schema must be {SCHEMA}, not {data.get('schema')!r}")
    found = []
    for i, entry in enumerate(data.get("rewrite", [])):
        where = f"{origin}: rewrite #{i + 1} ({entry.get('name', '?')})"
        unknown = set(entry) - _FIELDS
        missing = _FIELDS - _OPTIONAL - set(entry)
        if unknown or missing:
            raise ValueError(
                f"{where}: unknown fields {sorted(unknown)}, missing {sorted(missing)}"
            )
        if ("pairs" in entry) == ("producers" in entry or "consumers" in entry):
            raise ValueError(f"{where}: give either producers and consumers, or pairs")
        if "pairs" in entry:
            pairs = entry["pairs"]
            if (
                not isinstance(pairs, list)
                or not pairs
                or not all(isinstance(p, list) and len(p) == 2 for p in pairs)
            ):
                raise ValueError(f"{where}: pairs must be a non-empty list of [producer, consumer]")
            names = [o for p in pairs for o in p]
        else:
            for field in ("producers", "consumers"):
                if not entry.get(field):
                    raise ValueError(f"{where}: {field} must be a non-empty list of op types")
            names = [*entry["producers"], *entry["consumers"]]
            pairs = [[p, c] for p in entry["producers"] for c in entry["consumers"]]
        if not all(isinstance(o, str) and o.isidentifier() for o in names):
            raise ValueError(f"{where}: op types must be names such as 'BiasAdd'")
        places = entry["where"]
        if not isinstance(places, list) or not places or not set(places) <= set(WHERE):
            raise ValueError(f"{where}: where must be a list of {WHERE}")
        if entry["optimizer"] not in OPTIMIZERS:
            raise ValueError(f"{where}: optimizer must be one of {OPTIMIZERS}")
        position = entry.get("input")
        if position is not None and (not isinstance(position, int) or position < 0):
            raise ValueError(f"{where}: input must be a position (0, 1, ...)")
        found.append(
            Rewrite(
                name=str(entry["name"]),
                optimizer=entry["optimizer"],
                pairs=frozenset((p, c) for p, c in pairs),
                input=position,
                where=frozenset(places),
                bits=str(entry["bits"]),
                source=str(entry["source"]),
            )
        )
    return tuple(found)


@functools.cache
def table() -> tuple[Rewrite, ...]:
    """The shipped table, parsed once per process."""
    resource = resources.files("nddebug") / "data" / "rewrites.toml"
    return parse(resource.read_text(encoding="utf-8"), origin="nddebug/data/rewrites.toml")


@functools.cache
def _where_now(gpu: bool) -> frozenset[str]:
    from nddebug.environment import onednn_enabled

    if gpu:
        return frozenset({"any", "gpu"})
    return frozenset({"any", "cpu", "onednn"} if onednn_enabled() else {"any", "cpu"})


def _applies(device: str) -> frozenset[str]:
    """Which ``where`` values hold for an op placed on ``device`` ("" when unplaced: the GPU
    if there is one)."""
    from nddebug import digest as dg

    upper = device.upper()
    gpu = "GPU" in upper or (not upper and dg.gpu_present())
    return _where_now(gpu)


@functools.cache
def _index(where: frozenset[str]) -> tuple[frozenset[str], dict[tuple[str, str], set[Any]]]:
    producers: set[str] = set()
    pairs: dict[tuple[str, str], set[Any]] = {}
    for r in table():
        if not r.where & where:
            continue
        for p, c in r.pairs:
            producers.add(p)
            pairs.setdefault((p, c), set()).add(r.input)
    return frozenset(producers), pairs


def may_fuse(op_type: str, device: str) -> bool:
    """Whether some rewrite may take this op's output as its single-consumer intermediate."""
    return op_type in _index(_applies(device))[0]


def fuses(producer: str, consumer: str, position: int, device: str) -> bool:
    """Whether ``consumer`` reading ``producer``'s output at input ``position`` is a pattern
    grappler rewrites when that output has no other consumer."""
    positions = _index(_applies(device))[1].get((producer, consumer))
    return bool(positions) and (None in positions or position in positions)
