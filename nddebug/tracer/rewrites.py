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

SCHEMA = 1
WHERE = ("any", "cpu", "onednn", "gpu")
OPTIMIZERS = ("arithmetic", "constant folding", "remapper")
_FIELDS = {
    "name",
    "optimizer",
    "producers",
    "consumers",
    "pairs",
    "starts",
    "input",
    "where",
    "bits",
    "source",
}
_OPTIONAL = {"producers", "consumers", "pairs", "starts", "input"}


@dataclass(frozen=True)
class Rewrite:
    """One rewrite: each of ``pairs`` is a producer whose output a consumer reads (at input
    ``input``, or any). A table entry gives either ``producers`` and ``consumers`` (every
    producer with every consumer) or the ``pairs`` themselves, where not every combination
    is a pattern grappler rewrites.

    ``starts`` are the pairs that may begin the pattern, where the producer reads its input
    from outside it (all pairs unless the entry says). Any other pair is part of the pattern
    only where its producer already is: Mish's Tanh -> Mul only after a Softplus -> Tanh, so
    a Tanh that reads anything else is recorded as it is, not lumped with its consumer."""

    name: str
    optimizer: str
    pairs: frozenset[tuple[str, str]]
    starts: frozenset[tuple[str, str]]
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
        starts = entry.get("starts", pairs)
        if (
            not isinstance(starts, list)
            or not starts
            or not all(isinstance(p, list) and [*p] in pairs for p in starts)
        ):
            raise ValueError(f"{where}: starts must be a non-empty list of its pairs")
        position = entry.get("input")
        if position is not None and (not isinstance(position, int) or position < 0):
            raise ValueError(f"{where}: input must be a position (0, 1, ...)")
        found.append(
            Rewrite(
                name=str(entry["name"]),
                optimizer=entry["optimizer"],
                pairs=frozenset((p, c) for p, c in pairs),
                starts=frozenset((p, c) for p, c in starts),
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


#: For one (producer, consumer) pair: (rewrite name, input position or None, is a start).
_Use = tuple[str, int | None, bool]


@functools.cache
def _index(where: frozenset[str]) -> dict[tuple[str, str], tuple[_Use, ...]]:
    pairs: dict[tuple[str, str], list[_Use]] = {}
    for r in table():
        if r.where & where:
            for pair in r.pairs:
                pairs.setdefault(pair, []).append((r.name, r.input, pair in r.starts))
    return {pair: tuple(uses) for pair, uses in pairs.items()}


@functools.cache
def _producers(where: frozenset[str], inside: frozenset[str]) -> frozenset[str]:
    return frozenset(
        p
        for (p, _), uses in _index(where).items()
        if any(start or name in inside for name, _, start in uses)
    )


def may_fuse(op_type: str, device: str, inside: frozenset[str] = frozenset()) -> bool:
    """Whether some rewrite may take this op's output as its single-consumer intermediate:
    one it may begin, or one whose pattern it is already part of (``inside``: the rewrites
    by which its inputs fused into it, see :func:`fuses`)."""
    return op_type in _producers(_applies(device), inside)


def fuses(
    producer: str,
    consumer: str,
    position: int,
    device: str,
    inside: frozenset[str] = frozenset(),
) -> frozenset[str]:
    """The rewrites in which ``consumer`` reading ``producer``'s output at input ``position``
    is a pattern grappler rewrites when that output has no other consumer (empty: none).
    ``inside`` are the rewrites the producer is already part of: a pair that cannot begin
    its pattern counts only there."""
    return frozenset(
        name
        for name, at, start in _index(_applies(device)).get((producer, consumer), ())
        if (at is None or at == position) and (start or name in inside)
    )


def consumes(consumer: str, position: int, device: str) -> frozenset[str]:
    """The rewrites in which ``consumer``, reading some op's output at input ``position``, is
    a pattern's reader (empty: none): what an op reading a function's argument may be
    rewritten in once the call is inlined, whatever the caller makes the argument with."""
    return frozenset(
        name
        for (_, c), uses in _index(_applies(device)).items()
        if c == consumer
        for name, at, _ in uses
        if at is None or at == position
    )
