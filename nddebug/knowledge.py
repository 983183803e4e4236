"""The table of known non-deterministic TensorFlow ops, loaded from data/culprits.toml.

The knowledge lives in a data file so it can be corrected without touching code. This
module loads it, checks it strictly (a broken table should fail the test suite, not a
user's debugging session) and answers "what do we know about this op on this device?".
It must not import TensorFlow: reports are also rendered where TensorFlow is absent.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas

__all__ = [
    "COLUMNS",
    "DEVICES",
    "KINDS",
    "PASSES",
    "UNDER_DETERMINISM",
    "Culprit",
    "GpuMeasurement",
    "advice",
    "culprits",
    "device_kind",
    "known_ops",
    "lookup",
]

SCHEMA_VERSION = 2
DEVICES = ("GPU", "CPU", "any")
PASSES = ("forward", "backward", "both")
KINDS = (
    "numerical",
    "random",
    "input pipeline",
    "control flow",
    "other",
    "collective",
    "race",
    "unordered updates",
    "seeded stream",
    "seeded pass",
    "compiled stream",
)
#: Kinds of sources that are not one op: calls nddebug cannot see inside, and work that other
#: threads did. [advice] has a text for each, besides the culprit kinds.
OPAQUE_KINDS = ("XLA cluster", "uninstrumented function", "TF1 loop", "other threads")
UNDER_DETERMINISM = ("fixed", "raises", "host", "unaffected", "n/a")

#: Columns of known_ops(), in order.
COLUMNS = (
    "op_type",
    "api",
    "device",
    "pass",
    "kind",
    "mechanism",
    "under_determinism",
    "fixed_in",
    "fix",
    "measured",
    "measured_gpu",
    "condition",
    "sources_disagree",
    "sources",
)

_ENUMS: dict[str, tuple[str, ...]] = {
    "device": DEVICES,
    "pass": PASSES,
    "kind": KINDS,
    "under_determinism": UNDER_DETERMINISM,
}
_REQUIRED_TEXT = ("api", "mechanism", "fixed_in", "fix")
_REQUIRED = frozenset({"op_types", "sources", *_ENUMS, *_REQUIRED_TEXT})
_OPTIONAL_TEXT = ("measured", "topic", "condition", "sources_disagree")
_OPTIONAL = frozenset(
    {
        *_OPTIONAL_TEXT,
        "measured_gpu",
        "integer_outputs_exact",
        "deterministic_kernel",
        "advances_generator",
    }
)
_TOP_LEVEL = frozenset({"schema_version", "sources", "measurements", "advice", "culprit"})
#: Fields of a [measurements.NAME] table: the setup a GPU measurement was made on.
_SETUP_FIELDS = ("device", "tf", "cudnn", "cuda", "method")
#: Fields of an entry's measured_gpu = {on = NAME, result = "..."}.
_MEASURED_GPU_FIELDS = frozenset({"on", "result"})
# TF op type names: CamelCase identifiers, internal ones start with "_" (e.g. _XlaRun).
_OP_TYPE = re.compile(r"_?[A-Z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class GpuMeasurement:
    """What was measured on a real GPU for an entry, and on which setup: knowledge that was
    measured, not only cited, can be re-measured when the setup changes."""

    device: str  # the GPU, e.g. "NVIDIA H100 80GB HBM3"
    tf: str  # TensorFlow version
    cudnn: str
    cuda: str
    method: str  # how: the command, repeats, where the raw rows are
    result: str  # what the measurement showed for this entry's op types

    def __str__(self) -> str:
        return f"{self.device}, TF {self.tf}, cuDNN {self.cudnn}: {self.result}"


@dataclass(frozen=True)
class Culprit:
    """One row of the table: an op family on one device, or a source outside kernels."""

    op_types: tuple[str, ...]
    api: str
    device: str
    pass_: str
    kind: str
    mechanism: str
    under_determinism: str
    fixed_in: str
    fix: str
    measured: str
    sources: tuple[str, ...]  # resolved citations, not keys
    topic: str = ""
    #: The measurement on a real GPU that backs (or corrects) this entry, if any.
    measured_gpu: GpuMeasurement | None = None
    #: When the entry holds, if not always (e.g. "is_training=False" for fused batch norm).
    condition: str = ""
    #: Where sources (documents, TF's tests, our measurements) disagree, and how.
    sources_disagree: str = ""
    #: The variation is the order of additions (or products) into the outputs, so an
    #: execution whose outputs are all integers or booleans is exact in any order: counts of
    #: an unweighted tf.math.bincount (a ragged reduce_mean's row lengths) do not vary.
    integer_outputs_exact: bool = False
    #: The kernel is deterministic: what varies is the state it reads (a lookup table built
    #: in another order), so a census of the op on fixed state measures it deterministic.
    deterministic_kernel: bool = False
    #: The op advances a tf.random.Generator's state (an int64 variable, its resource input):
    #: what it draws depends on where the generator is, and a step that draws from one
    #: moves it on (check() puts such generators back: tracer.unheld).
    advances_generator: bool = False

    @property
    def label(self) -> str:
        """A short name for messages: the topic, else the op types."""
        return self.topic or ", ".join(self.op_types)


def _describe(index: int, entry: Any) -> str:
    """Name an entry in error messages the way a human finds it in the file."""
    where = f"[[culprit]] #{index + 1}"
    if isinstance(entry, dict):
        if entry.get("op_types"):
            return f"{where} (op_types={entry['op_types']!r})"
        if entry.get("topic"):
            return f"{where} (topic={entry['topic']!r})"
    return where


def _parse(text: str, origin: str = "<string>") -> tuple[Culprit, ...]:
    """Parse and validate a culprit table's TOML text; ValueError on any problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{origin}: not valid TOML: {exc}") from exc

    unknown = sorted(set(data) - _TOP_LEVEL)
    if unknown:
        raise ValueError(
            f"{origin}: unknown top-level key(s) {unknown}; allowed: {sorted(_TOP_LEVEL)}"
        )
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{origin}: schema_version is {data.get('schema_version')!r}, "
            f"this nddebug reads {SCHEMA_VERSION}"
        )
    sources = data.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise ValueError(f"{origin}: a non-empty [sources] table is required")
    for key, citation in sources.items():
        if not isinstance(citation, str) or not citation.strip():
            raise ValueError(f"{origin}: [sources] {key!r} must be a non-empty string")
    setups = _check_measurements(data.get("measurements", {}), origin)
    if "advice" in data:
        _check_advice(data["advice"], origin)
    entries = data.get("culprit")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{origin}: no [[culprit]] entries")

    result = tuple(_entry(i, entry, sources, setups, origin) for i, entry in enumerate(entries))

    # Two entries for the same op on the same device would make lookup() ambiguous.
    seen: dict[tuple[str, str], str] = {}
    for i, culprit in enumerate(result):
        for op_type in culprit.op_types:
            key = (op_type, culprit.device)
            if key in seen:
                raise ValueError(
                    f"{origin}: {_describe(i, entries[i])}: op type {op_type!r} on device "
                    f"{culprit.device!r} is already listed by {seen[key]}"
                )
            seen[key] = _describe(i, entries[i])
    return result


def _check_measurements(tables: Any, origin: str) -> dict[str, dict[str, str]]:
    """[measurements.NAME]: the GPU setups that entries' measured_gpu refer to."""
    if not isinstance(tables, dict):
        raise ValueError(f"{origin}: [measurements] must be a table of named setups")  # noqa: TRY004
    for name, setup in tables.items():
        where = f"{origin}: [measurements.{name}]"
        if not isinstance(setup, dict):
            raise ValueError(f"{where}: must be a table with {list(_SETUP_FIELDS)}")  # noqa: TRY004
        unknown = sorted(set(setup) - set(_SETUP_FIELDS))
        missing = [k for k in _SETUP_FIELDS if k not in setup]
        if unknown or missing:
            raise ValueError(
                f"{where}: needs exactly the keys {list(_SETUP_FIELDS)}; "
                f"missing {missing}, unknown {unknown}"
            )
        for key, value in setup.items():
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{where}: {key!r} must be a non-empty string")
    return tables


def _measured_gpu(
    value: Any, device: str, setups: dict[str, dict[str, str]], where: str
) -> GpuMeasurement:
    """measured_gpu = {on = "<a [measurements] name>", result = "..."}, on a GPU/any entry."""
    if not isinstance(value, dict) or set(value) != _MEASURED_GPU_FIELDS:
        raise ValueError(
            f"{where}: measured_gpu must be an inline table with exactly the keys "
            f'{sorted(_MEASURED_GPU_FIELDS)}, e.g. {{on = "h100_tf221", result = "..."}}'
        )
    if device == "CPU":
        raise ValueError(f"{where}: measured_gpu on a CPU entry; GPU findings need a GPU entry")
    if not isinstance(value["result"], str) or not value["result"].strip():
        raise ValueError(f"{where}: measured_gpu.result must be a non-empty string")
    if value["on"] not in setups:
        raise ValueError(
            f"{where}: measured_gpu.on = {value['on']!r} is not a [measurements] name "
            f"(known: {sorted(setups)})"
        )
    return GpuMeasurement(result=value["result"], **setups[value["on"]])


def _entry(
    index: int,
    entry: Any,
    sources: dict[str, str],
    setups: dict[str, dict[str, str]],
    origin: str,
) -> Culprit:
    """Validate one [[culprit]] table and turn it into a Culprit."""
    where = f"{origin}: {_describe(index, entry)}"
    # A wrong type in the data file is still a broken data file: one exception type
    # (ValueError) for every problem keeps callers simple, hence the TRY004 exemptions.
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a table")  # noqa: TRY004
    unknown = sorted(set(entry) - _REQUIRED - _OPTIONAL)
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {unknown}; allowed: {sorted(_REQUIRED | _OPTIONAL)}"
        )
    missing = sorted(_REQUIRED - set(entry))
    if missing:
        raise ValueError(f"{where}: missing required key(s) {missing}")

    for key in (*_ENUMS, *_REQUIRED_TEXT, *(k for k in _OPTIONAL_TEXT if k in entry)):
        if not isinstance(entry[key], str):
            got = type(entry[key]).__name__
            raise ValueError(f"{where}: {key!r} must be a string, got {got}")  # noqa: TRY004
    for key in _REQUIRED_TEXT:
        if not entry[key].strip():
            raise ValueError(f"{where}: {key!r} must not be empty")
    for key, allowed in _ENUMS.items():
        if entry[key] not in allowed:
            raise ValueError(f"{where}: {key} = {entry[key]!r} is not one of {list(allowed)}")

    op_types = entry["op_types"]
    if not isinstance(op_types, list) or not all(isinstance(op, str) for op in op_types):
        raise ValueError(f"{where}: 'op_types' must be a list of strings")
    for op_type in op_types:
        if not _OP_TYPE.fullmatch(op_type):
            raise ValueError(
                f"{where}: {op_type!r} does not look like a TF op type name (e.g. 'BiasAddGrad')"
            )
    duplicates = sorted({op for op in op_types if op_types.count(op) > 1})
    if duplicates:
        raise ValueError(f"{where}: op type(s) {duplicates} listed twice")
    topic = entry.get("topic", "")
    if not op_types and not topic.strip():
        raise ValueError(f"{where}: an entry with op_types = [] needs a 'topic'")

    keys = entry["sources"]
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{where}: 'sources' must be a non-empty list of keys into [sources]")
    unknown_sources = [k for k in keys if k not in sources]
    if unknown_sources:
        raise ValueError(
            f"{where}: unknown source key(s) {unknown_sources}; add them to [sources] first"
        )

    exact = entry.get("integer_outputs_exact", False)
    kernel = entry.get("deterministic_kernel", False)
    generator = entry.get("advances_generator", False)
    for name, value in (
        ("integer_outputs_exact", exact),
        ("deterministic_kernel", kernel),
        ("advances_generator", generator),
    ):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {name} must be true or false")  # noqa: TRY004
    measured_gpu = None
    if "measured_gpu" in entry:
        measured_gpu = _measured_gpu(entry["measured_gpu"], entry["device"], setups, where)

    return Culprit(
        op_types=tuple(op_types),
        api=entry["api"],
        device=entry["device"],
        pass_=entry["pass"],
        kind=entry["kind"],
        mechanism=entry["mechanism"],
        under_determinism=entry["under_determinism"],
        fixed_in=entry["fixed_in"],
        fix=entry["fix"],
        measured=entry.get("measured", ""),
        sources=tuple(sources[k] for k in keys),
        topic=topic,
        measured_gpu=measured_gpu,
        condition=entry.get("condition", ""),
        sources_disagree=entry.get("sources_disagree", ""),
        integer_outputs_exact=exact,
        deterministic_kernel=kernel,
        advances_generator=generator,
    )


def _check_advice(advice: Any, origin: str) -> None:
    """[advice] has one actionable text per kind, for culprits that are not in the table."""
    if not isinstance(advice, dict):
        raise ValueError(  # noqa: TRY004 - a broken data file is one kind of error
            f"{origin}: an [advice] table (one text per kind) is required"
        )
    kinds = KINDS + OPAQUE_KINDS
    missing = sorted(set(kinds) - set(advice))
    unknown = sorted(set(advice) - set(kinds))
    if missing or unknown:
        raise ValueError(
            f"{origin}: [advice] must have exactly the kinds {sorted(kinds)}; "
            f"missing {missing}, unknown {unknown}"
        )
    for kind, text in advice.items():
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{origin}: [advice] {kind!r} must be a non-empty string")


@functools.cache
def _advice() -> dict[str, str]:
    resource = resources.files("nddebug") / "data" / "culprits.toml"
    return dict(tomllib.loads(resource.read_text(encoding="utf-8"))["advice"])


def advice(kind: str) -> str:
    """What to do about a culprit of this kind that the table does not list."""
    culprits()  # validates the file, [advice] included
    return _advice().get(kind, _advice()["other"])


def _load(path: str | Path) -> tuple[Culprit, ...]:
    """Load and validate a culprit table from a file (the shipped one, or a test's)."""
    path = Path(path)
    return _parse(path.read_text(encoding="utf-8"), origin=str(path))


@functools.cache
def culprits() -> tuple[Culprit, ...]:
    """The shipped table, in file order; parsed once per process."""
    resource = resources.files("nddebug") / "data" / "culprits.toml"
    return _parse(resource.read_text(encoding="utf-8"), origin="nddebug/data/culprits.toml")


#: The entry of sums grappler's memory optimizer adds in arrival order (tracer.optimized_sums).
ACCUMULATED_TOPIC = "grappler memory optimizer: sums accumulated in arrival order"


def by_topic(topic: str) -> Culprit | None:
    """The entry of a source that is not one op type, by its ``topic``."""
    return next((c for c in culprits() if c.topic == topic), None)


@functools.cache
def _by_op_type() -> dict[str, tuple[Culprit, ...]]:
    index: dict[str, list[Culprit]] = {}
    for culprit in culprits():
        for op_type in culprit.op_types:
            index.setdefault(op_type, []).append(culprit)
    return {op_type: tuple(found) for op_type, found in index.items()}


def _text(value: str | bytes | None) -> str:
    # Eager op callbacks can hand over op types and device names as bytes.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value or ""


def device_kind(device: str | bytes | None) -> str:
    """Reduce a TF device string to "GPU", "CPU", "TPU" or "" (unknown / unplaced).

    Accepts full names ("/job:localhost/replica:0/task:0/device:GPU:0"), short ones
    ("GPU:0", "CPU"), legacy lower-case ones ("/gpu:0") and XLA_GPU/XLA_CPU devices.
    """
    for part in reversed(_text(device).strip().split("/")):
        part = part.strip()
        lowered = part.lower()
        if not part or lowered.startswith(("job:", "replica:", "task:")):
            continue
        for prefix in ("device:", "physical_device:"):
            if lowered.startswith(prefix):
                part = part[len(prefix) :]
                break
        name = part.split(":", 1)[0].upper().removeprefix("XLA_")
        return name if name in ("GPU", "CPU", "TPU") else ""
    return ""


def lookup(op_type: str | bytes, device: str | bytes | None = None) -> Culprit | None:
    """What the table knows about an op type, preferring the entry for the op's device.

    Order: the entry for the device kind (GPU/CPU), then an "any" entry, then an entry
    for another device: a GPU-only culprit seen on CPU is still worth telling about.
    None when the op type is not listed.
    """
    found = _by_op_type().get(_text(op_type))
    if not found:
        return None
    kind = device_kind(device)
    for wanted in (kind, "any"):
        for culprit in found:
            if culprit.device == wanted:
                return culprit
    return found[0]


def advances_generator(op_type: str | bytes) -> bool:
    """Whether the op draws from a tf.random.Generator and moves its state on (the table's
    ``advances_generator``)."""
    return any(c.advances_generator for c in _by_op_type().get(_text(op_type), ()))


def known_ops() -> pandas.DataFrame:
    """The table as a DataFrame, one row per (entry, op type).

    Topic-only entries (no op types) get one row with op_type "".
    """
    import pandas  # lazily: importing the knowledge must stay cheap

    rows = []
    for culprit in culprits():
        values = {
            "api": culprit.api,
            "device": culprit.device,
            "pass": culprit.pass_,
            "kind": culprit.kind,
            "mechanism": culprit.mechanism,
            "under_determinism": culprit.under_determinism,
            "fixed_in": culprit.fixed_in,
            "fix": culprit.fix,
            "measured": culprit.measured,
            "measured_gpu": str(culprit.measured_gpu or ""),
            "condition": culprit.condition,
            "sources_disagree": culprit.sources_disagree,
            "sources": "; ".join(culprit.sources),
        }
        for op_type in culprit.op_types or ("",):
            rows.append({"op_type": op_type, **values})
    return pandas.DataFrame(rows, columns=list(COLUMNS))
