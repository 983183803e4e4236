"""Tests for nddebug.knowledge against the shipped table (no mocks)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from nddebug import knowledge
from nddebug.knowledge import (
    COLUMNS,
    Culprit,
    _load,
    _parse,
    culprits,
    device_kind,
    known_ops,
    lookup,
)

# Every op type named in the op-level table of the reference notes.
REFERENCE_OPS = [
    "BiasAddGrad",
    "Conv2DBackpropFilter",
    "Conv2DBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter",
    "MaxPoolGrad",
    "MaxPoolGradV2",
    "MaxPool3DGrad",
    "ResizeBilinearGrad",
    "ResizeNearestNeighborGrad",
    "CropAndResizeGradImage",
    "CropAndResizeGradBoxes",
    "Bincount",
    "DenseBincount",
    "SegmentSum",
    "SegmentProd",
    "UnsortedSegmentSum",
    "UnsortedSegmentProd",
    "ScatterNd",
    "ScatterNdAdd",
    "ScatterNdSub",
    "ScatterNdUpdate",
    "ResourceScatterNdUpdate",
    "TensorScatterAdd",
    "TensorScatterSub",
    "TensorScatterUpdate",
    "ResourceScatterAdd",
    "ResourceScatterSub",
    "ResourceScatterMul",
    "ResourceScatterDiv",
    "ResourceScatterUpdate",
    "ResourceScatterMin",
    "ResourceScatterMax",
    "SparseTensorDenseMatMul",
    "SoftmaxCrossEntropyWithLogits",
    "SparseSoftmaxCrossEntropyWithLogits",
    "FusedBatchNormGradV3",
    "AdjustContrast",
    "AdjustContrastv2",
    "CTCLossV2",
    "DebugNumericSummaryV2",
    "FakeQuantWithMinMaxVarsGradient",
    "XlaLaunch",
]

RANDOM_OPS = [
    "RandomUniform",
    "RandomUniformInt",
    "RandomStandardNormal",
    "TruncatedNormal",
    "ParameterizedTruncatedNormal",
    "RandomGamma",
    "RandomPoisson",
    "RandomPoissonV2",
    "Multinomial",
    "RandomShuffle",
    "RandomCrop",
    "StatefulUniform",
    "StatefulUniformInt",
    "StatefulUniformFullInt",
    "StatefulStandardNormalV2",
    "StatefulTruncatedNormal",
    "RngSkip",
    "RngReadAndSkip",
]

INPUT_PIPELINE_OPS = [
    "IteratorGetNext",
    "IteratorGetNextSync",
    "IteratorGetNextAsOptional",
    "OptionalGetValue",
]

DATA_FILE = resources.files("nddebug") / "data" / "culprits.toml"


def _raw_table() -> dict:
    return tomllib.loads(DATA_FILE.read_text(encoding="utf-8"))


def test_shipped_table_loads_and_validates() -> None:
    table = culprits()
    assert table and all(isinstance(c, Culprit) for c in table)
    assert culprits() is table  # parsed once
    for c in table:
        assert c.fix.strip() and c.mechanism.strip() and c.api.strip()
        assert c.sources, c.label
        assert c.op_types or c.topic


def test_every_source_key_is_used() -> None:
    # An unused citation usually means an entry lost its reference by mistake.
    raw = _raw_table()
    used = {key for entry in raw["culprit"] for key in entry["sources"]}
    assert set(raw["sources"]) == used


@pytest.mark.parametrize("op_type", REFERENCE_OPS + RANDOM_OPS + INPUT_PIPELINE_OPS)
def test_listed_op_is_found(op_type: str) -> None:
    assert lookup(op_type) is not None
    assert lookup(op_type, "/job:localhost/replica:0/task:0/device:CPU:0") is not None


def test_random_ops_are_random_everywhere() -> None:
    for op_type in RANDOM_OPS:
        found = lookup(op_type, "CPU")
        assert found is not None and found.kind == "random" and found.device == "any", op_type
        assert "seed" in found.fix
    assert lookup("RandomUniform", "CPU").kind == "random"
    assert lookup("RandomUniform").under_determinism == "raises"


def test_input_pipeline_ops() -> None:
    for op_type in INPUT_PIPELINE_OPS:
        found = lookup(op_type, "GPU:0")
        assert found is not None and found.kind == "input pipeline" and found.device == "any"
        assert "deterministic = True" in found.fix and "seed" in found.fix


def test_lookup_prefers_the_entry_for_the_device() -> None:
    cpu = lookup("CropAndResizeGradImage", "/device:CPU:0")
    gpu = lookup("CropAndResizeGradImage", "GPU:0")
    assert cpu is not None and cpu.device == "CPU" and cpu.under_determinism == "fixed"
    assert gpu is not None and gpu.device == "GPU" and gpu.under_determinism == "raises"
    assert cpu is not gpu
    # Only a GPU entry exists: a CPU lookup still returns it (knowledge, not a verdict).
    boxes = lookup("CropAndResizeGradBoxes", "/device:CPU:0")
    assert boxes is not None and boxes.device == "GPU"
    assert lookup("BiasAddGrad", "CPU").device == "GPU"
    # Unknown device kinds fall back to "any", then the first entry.
    assert lookup("RandomUniform", "/device:TPU:0").device == "any"


def test_lookup_accepts_bytes_from_eager_callbacks() -> None:
    assert (
        lookup(b"CropAndResizeGradImage", b"/job:localhost/replica:0/task:0/device:CPU:0").device
        == "CPU"
    )


def test_unlisted_ops_are_none() -> None:
    assert lookup("MatMul") is None
    assert lookup("MatMul", "GPU:0") is None
    assert lookup("") is None
    assert lookup("biasaddgrad") is None  # op types are case-sensitive


def test_topic_entries_never_match_a_lookup() -> None:
    topics = [c for c in culprits() if not c.op_types]
    assert {
        "TF1 graphs / Session thread order",
        "multi-threaded CPU work",
        "distributed training",
    } <= {c.topic for c in topics}
    for c in topics:
        assert lookup(c.topic) is None


@pytest.mark.parametrize(
    ("device", "kind"),
    [
        ("/job:localhost/replica:0/task:0/device:GPU:0", "GPU"),
        ("/job:worker/replica:0/task:1/device:CPU:0", "CPU"),
        ("/device:TPU:3", "TPU"),
        ("GPU:0", "GPU"),
        ("gpu:1", "GPU"),
        ("/gpu:0", "GPU"),
        ("/cpu:0", "CPU"),
        ("CPU", "CPU"),
        ("/physical_device:GPU:0", "GPU"),
        ("/job:localhost/replica:0/task:0/device:XLA_GPU:0", "GPU"),
        (b"/job:localhost/replica:0/task:0/device:CPU:0", "CPU"),
        ("/job:localhost/replica:0/task:0", ""),
        ("/device:TPU_SYSTEM:0", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_device_kind(device: str | bytes | None, kind: str) -> None:
    assert device_kind(device) == kind


GOOD_ENTRY = """
schema_version = 2
[sources]
a = "somewhere"
[measurements.h100]
device = "H100"
tf = "2.21.0"
cudnn = "9.19"
cuda = "12.9"
method = "census"
[[culprit]]
op_types = ["BiasAddGrad"]
api = "tf.nn.bias_add"
device = "GPU"
pass = "backward"
kind = "numerical"
mechanism = "atomics"
under_determinism = "fixed"
fixed_in = "TF 2.8"
fix = "call enable_op_determinism()"
sources = ["a"]
"""


def test_parse_accepts_a_minimal_table() -> None:
    (entry,) = _parse(GOOD_ENTRY)
    assert (
        entry.op_types == ("BiasAddGrad",)
        and entry.sources == ("somewhere",)
        and entry.measured == ""
    )


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('sources = ["a"]', 'sources = ["nope"]', "unknown source key(s) ['nope']"),
        ('sources = ["a"]', "sources = []", "'sources' must be a non-empty list"),
        (
            'device = "GPU"',
            'device = "gpu"',
            "device = 'gpu' is not one of ['GPU', 'CPU', 'any']",
        ),
        ('pass = "backward"', 'pass = "back"', "pass = 'back' is not one of"),
        ('kind = "numerical"', 'kind = "numeric"', "kind = 'numeric' is not one of"),
        (
            'under_determinism = "fixed"',
            'under_determinism = "yes"',
            "under_determinism = 'yes' is not one of",
        ),
        (
            'fix = "call enable_op_determinism()"\n',
            "",
            "missing required key(s) ['fix']",
        ),
        (
            'fix = "call enable_op_determinism()"',
            'fix = "  "',
            "'fix' must not be empty",
        ),
        (
            'api = "tf.nn.bias_add"',
            'api = "tf.nn.bias_add"\nseverity = "high"',
            "unknown key(s) ['severity']",
        ),
        ('op_types = ["BiasAddGrad"]', "op_types = []", "needs a 'topic'"),
        (
            'op_types = ["BiasAddGrad"]',
            'op_types = ["bias add grad"]',
            "does not look like a TF op type",
        ),
        (
            'op_types = ["BiasAddGrad"]',
            'op_types = ["BiasAddGrad", "BiasAddGrad"]',
            "listed twice",
        ),
        (
            'op_types = ["BiasAddGrad"]',
            'op_types = "BiasAddGrad"',
            "must be a list of strings",
        ),
        ('fixed_in = "TF 2.8"', "fixed_in = 2.8", "'fixed_in' must be a string"),
        ("schema_version = 2", "schema_version = 1", "schema_version is 1"),
        (
            "schema_version = 2",
            "schema_version = 2\nextra = 3",
            "unknown top-level key(s) ['extra']",
        ),
        ('a = "somewhere"', 'a = ""', "[sources] 'a' must be a non-empty string"),
        (
            'sources = ["a"]',
            'measured_gpu = {on = "h200", result = "ND"}\nsources = ["a"]',
            "measured_gpu.on = 'h200' is not a [measurements] name (known: ['h100'])",
        ),
        (
            'sources = ["a"]',
            'measured_gpu = {on = "h100"}\nsources = ["a"]',
            "measured_gpu must be an inline table with exactly the keys ['on', 'result']",
        ),
        (
            'sources = ["a"]',
            'measured_gpu = "H100: ND"\nsources = ["a"]',
            "measured_gpu must be an inline table",
        ),
        (
            'sources = ["a"]',
            'measured_gpu = {on = "h100", result = " "}\nsources = ["a"]',
            "measured_gpu.result must be a non-empty string",
        ),
        (
            'device = "GPU"',
            'device = "CPU"\nmeasured_gpu = {on = "h100", result = "ND"}',
            "measured_gpu on a CPU entry",
        ),
        ('cudnn = "9.19"\n', "", "[measurements.h100]: needs exactly the keys"),
        ('cudnn = "9.19"', "cudnn = 9.19", "[measurements.h100]: 'cudnn' must be a non-empty"),
        ('sources = ["a"]', 'condition = 1\nsources = ["a"]', "'condition' must be a string"),
        ("[[culprit]]", "[[culprit]", "not valid TOML"),
    ],
)
def test_parse_rejects_broken_tables(old: str, new: str, message: str) -> None:
    broken = GOOD_ENTRY.replace(old, new, 1)
    assert broken != GOOD_ENTRY
    with pytest.raises(ValueError) as info:
        _parse(broken)
    assert message in str(info.value)


def test_load_names_the_file_and_entry(tmp_path: Path) -> None:
    bad = tmp_path / "culprits.toml"
    bad.write_text(GOOD_ENTRY.replace('sources = ["a"]', 'sources = ["d9m_staus"]'))
    with pytest.raises(ValueError) as info:
        _load(bad)
    text = str(info.value)
    assert (
        str(bad) in text
        and "[[culprit]] #1 (op_types=['BiasAddGrad'])" in text
        and "d9m_staus" in text
    )


def test_duplicate_op_and_device_across_entries_is_rejected() -> None:
    table = GOOD_ENTRY + GOOD_ENTRY[GOOD_ENTRY.index("[[culprit]]") :]
    with pytest.raises(ValueError, match="already listed by"):
        _parse(table)
    # The same op on another device is fine: that is how CPU and GPU behaviour differ.
    two_devices = table.replace('device = "GPU"', 'device = "CPU"', 1)
    assert [c.device for c in _parse(two_devices)] == ["CPU", "GPU"]


def test_shipped_file_round_trips_through_load() -> None:
    with resources.as_file(DATA_FILE) as path:
        assert _load(path) == culprits()


def test_known_ops_dataframe() -> None:
    frame = known_ops()
    assert list(frame.columns) == list(COLUMNS)
    table = culprits()
    assert len(frame) == sum(max(len(c.op_types), 1) for c in table)
    listed = frame[frame.op_type != ""]
    assert len(listed) == sum(len(c.op_types) for c in table)
    assert not listed.duplicated(["op_type", "device"]).any()
    assert (frame.op_type == "").sum() == sum(1 for c in table if not c.op_types)
    assert set(REFERENCE_OPS + RANDOM_OPS + INPUT_PIPELINE_OPS) <= set(frame.op_type)
    row = frame[(frame.op_type == "CropAndResizeGradImage") & (frame.device == "CPU")].iloc[0]
    assert row["pass"] == "backward" and "enable_op_determinism" in row["fix"]
    assert all(isinstance(s, str) and s for s in frame.sources)


def test_knowledge_does_not_import_tensorflow() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["tensorflow"] = None  # any "import tensorflow" now raises ImportError
        import nddebug.knowledge as k
        assert k.lookup("CropAndResizeGradImage", "CPU:0").device == "CPU"
        assert len(k.known_ops()) > 0
        loaded = {name.split(".")[0] for name, mod in sys.modules.items() if mod}
        assert "tensorflow" not in loaded
        print("ok")
        """
    )
    root = Path(knowledge.__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_every_op_type_is_registered_in_tensorflow() -> None:
    # Catches typos in op names, which would otherwise silently never match.
    pytest.importorskip("tensorflow")
    from tensorflow.python.framework import op_def_registry

    names = {op for c in culprits() for op in c.op_types}
    assert [op for op in sorted(names) if op_def_registry.get(op) is None] == []


def test_measured_gpu_resolves_the_setup() -> None:
    table = GOOD_ENTRY.replace(
        'sources = ["a"]',
        'measured_gpu = {on = "h100", result = "10 of 10 distinct"}\nsources = ["a"]',
    )
    (entry,) = _parse(table)
    assert entry.measured_gpu is not None
    assert (entry.measured_gpu.device, entry.measured_gpu.tf, entry.measured_gpu.cudnn) == (
        "H100",
        "2.21.0",
        "9.19",
    )
    assert str(entry.measured_gpu) == "H100, TF 2.21.0, cuDNN 9.19: 10 of 10 distinct"


# The GPU census (NVIDIA H100, TF 2.21, cuDNN 9.19) kept in the repository.
GPU_CENSUS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "census_gpu.csv"


def _gpu_rows() -> list[dict[str, str]]:
    import csv

    with GPU_CENSUS.open(encoding="utf-8", newline="") as f:
        return [r for r in csv.DictReader(f) if r["ran_on"] == "GPU"]


def test_every_op_the_gpu_showed_non_deterministic_is_listed_for_the_gpu() -> None:
    varied = {
        r["op_type"]
        for r in _gpu_rows()
        if r["determinism"] == "off" and r["deterministic"] == "False" and r["kind"] == "numerical"
    }
    assert {"SegmentMean", "ResourceScatterNdAdd", "ResourceScatterNdSub"} <= varied
    unlisted = sorted(
        op for op in varied if (entry := lookup(op, "GPU")) is None or entry.device == "CPU"
    )
    assert unlisted == []


def test_every_gpu_entry_the_census_measured_says_what_the_gpu_showed() -> None:
    measured = {r["op_type"] for r in _gpu_rows()}
    missing = [
        c.label
        for c in culprits()
        if c.device == "GPU" and set(c.op_types) & measured and c.measured_gpu is None
    ]
    assert missing == []
    # And it names the setup, so a later GPU or TF version can be compared with it.
    gpu_entries = [c for c in culprits() if c.measured_gpu is not None]
    assert len(gpu_entries) >= 20
    for c in gpu_entries:
        assert c.measured_gpu.tf.startswith("2.21") and c.measured_gpu.cudnn == "9.19", c.label


def test_gpu_corrections_from_measurement() -> None:
    # The raw fused cross-entropy ops raise under op determinism on the GPU (the Python API
    # avoids them instead), and the knowledge base says where its sources disagree.
    xent = lookup("SoftmaxCrossEntropyWithLogits", "GPU")
    assert xent.under_determinism == "raises" and xent.sources_disagree
    assert lookup("SparseSoftmaxCrossEntropyWithLogits", "GPU") is xent
    # Fused batch-norm backprop raises only in inference mode.
    bn = lookup("FusedBatchNormGradV3", "GPU")
    assert bn.under_determinism == "raises" and "is_training=False" in bn.condition
    # Removed ops are marked as such, not as live culprits.
    for op in ("Conv3DBackpropInput", "Conv3DBackpropFilter", "AdjustContrast"):
        assert lookup(op, "GPU").under_determinism == "n/a", op
    assert lookup("StatefulStandardNormal").under_determinism == "n/a"
