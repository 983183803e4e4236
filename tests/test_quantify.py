"""The size of a divergence, raw and against the tensor's own scale, on real NumPy arrays.

Every expected value is derived by hand from the float formats: float32 has 23 fraction bits
(1 ULP at 1.0 is 2**-23 above and 2**-24 below), float16 10, bfloat16 7.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from nddebug.analysis import OpFinding
from nddebug.quantify import measure, relative, scale
from nddebug.recording import OpInfo
from nddebug.report import _sort_by_magnitude

f32 = np.float32


def test_one_ulp_at_the_largest_element_is_2_to_the_minus_23_or_24_of_it() -> None:
    a = np.array([1.0, 0.25, -0.5], f32)
    down = a.copy()
    down[0] = np.nextafter(f32(1.0), f32(0.0))  # 1 - 2**-24
    d = measure([a, down])
    assert (d.max_ulp, d.max_abs_diff, d.scale) == (1, 2.0**-24, 1.0)
    assert d.rel_diff == 2.0**-24 and d.frac_differing == pytest.approx(1 / 3)
    up = a.copy()
    up[0] = np.nextafter(f32(1.0), f32(2.0))  # 1 + 2**-23, now the larger scale
    d = measure([a, up])
    assert (d.max_ulp, d.max_abs_diff, d.scale) == (1, 2.0**-23, 1.0 + 2.0**-23)
    assert d.rel_diff == 2.0**-23 / (1.0 + 2.0**-23)


def test_a_billion_ulps_between_tiny_values_is_tiny_next_to_the_tensor_max() -> None:
    # +x and -x with bit pattern 500,000,000 = 0x1DCD6500: 500,000,000 ULPs each side of
    # zero; exponent field 0x3B = 59, fraction 0x4D6500 = 5,072,128, so x = 1.6046 * 2**-68.
    x = np.array([500_000_000], np.int32).view(f32)[0]
    assert float(x) == (1 + 5_072_128 / 2**23) * 2.0**-68
    a = np.array([1.0, x], f32)
    b = np.array([1.0, -x], f32)
    d = measure([a, b])
    assert d.max_ulp == 1_000_000_000
    assert d.max_abs_diff == 2 * float(x) and d.scale == 1.0
    assert d.rel_diff == 2 * float(x) and d.rel_diff < 1.1e-20  # the same difference, readable


def test_all_zero_tensors_and_signed_zeros() -> None:
    zeros = np.zeros(4, f32)
    negative = zeros.copy()
    negative[1] = -0.0  # bitwise different, numerically equal
    d = measure([zeros, negative])
    assert (d.frac_differing, d.max_abs_diff, d.max_ulp, d.scale, d.rel_diff) == (
        0.25,
        0.0,
        0,
        0.0,
        0.0,
    )
    tiny = zeros.copy()
    tiny[3] = np.array([1], np.int32).view(f32)[0]  # the smallest denormal, 2**-149
    d = measure([zeros, tiny])
    assert (d.max_ulp, d.max_abs_diff, d.scale, d.rel_diff) == (1, 2.0**-149, 2.0**-149, 1.0)


def test_nan_and_inf() -> None:
    nan_vs_number = measure([np.array([1.0, np.nan], f32), np.array([1.0, 2.0], f32)])
    assert nan_vs_number.max_abs_diff == math.inf and nan_vs_number.rel_diff == math.inf
    assert nan_vs_number.scale == 2.0  # the finite values only
    # NaN in both runs is the same value, whatever its payload.
    payloads = np.array([0x7FC00000, 0x7FC00001], np.uint32).view(f32)
    d = measure([np.array([1.0, payloads[0]], f32), np.array([1.0, payloads[1]], f32)])
    assert (d.frac_differing, d.max_abs_diff, d.max_ulp, d.rel_diff) == (0.5, 0.0, 0, 0.0)
    # An inf that both runs computed is no difference; the finite change is measured.
    d = measure([np.array([np.inf, 1.0], f32), np.array([np.inf, 1.5], f32)])
    assert (d.max_abs_diff, d.scale, d.rel_diff) == (0.5, 1.5, 0.5 / 1.5)
    d = measure([np.array([0.0], f32), np.array([np.inf], f32)])
    assert (d.max_abs_diff, d.scale, d.rel_diff) == (math.inf, 0.0, math.inf)


def test_integers_and_bool() -> None:
    d = measure([np.array([10, -40, 3], np.int32), np.array([10, -40, 5], np.int32)])
    assert (d.max_abs_diff, d.max_ulp, d.scale, d.rel_diff) == (2.0, 2, 40.0, 0.05)
    d = measure([np.array([True, False, False, False]), np.array([True, True, False, False])])
    assert (d.max_abs_diff, d.max_ulp, d.scale, d.rel_diff, d.frac_differing) == (
        1.0,
        1,
        1.0,
        1.0,
        0.25,
    )


def test_complex_is_measured_in_the_plane() -> None:
    a = np.array([3 + 4j, 1j], np.complex64)
    b = np.array([3 + 4j, 0.5 + 1j], np.complex64)
    d = measure([a, b])
    # |Δ| = |0.5| (not ||1j| - |0.5+1j||), against |3+4j| = 5; the real part moved from 0.0
    # to 0.5, whose float32 bit pattern 0x3F000000 is its ULP distance from zero.
    assert (d.max_abs_diff, d.scale, d.rel_diff) == (0.5, 5.0, 0.1)
    assert d.max_ulp == 0x3F000000


def test_half_precision_formats() -> None:
    bf16 = ml_dtypes.bfloat16
    a = np.array([1.0, 0.5], bf16)
    b = np.array([1.0 - 2.0**-8, 0.5], bf16)  # 1 ULP below 1.0 in bfloat16
    d = measure([a, b])
    assert (d.max_ulp, d.max_abs_diff, d.scale, d.rel_diff) == (1, 2.0**-8, 1.0, 2.0**-8)
    a = np.array([2048.0, 1.0], np.float16)
    b = np.array([2048.0, 1.0 + 2.0**-10], np.float16)  # 1 ULP at 1.0, next to 2048
    d = measure([a, b])
    assert (d.max_ulp, d.max_abs_diff, d.scale) == (1, 2.0**-10, 2048.0)
    assert d.rel_diff == 2.0**-21


def test_several_runs_take_the_largest_and_mismatches_are_not_measured() -> None:
    a = np.array([1.0, 2.0], f32)
    d = measure([a, np.array([1.0, 2.5], f32), np.array([1.5, 2.0], f32)])
    assert (d.max_abs_diff, d.scale, d.rel_diff, d.frac_differing) == (0.5, 2.5, 0.25, 0.5)
    assert measure([a, a.astype(np.float64)]) is None
    assert measure([a, a[:1]]) is None
    empty = measure([np.zeros(0, f32), np.zeros(0, f32)])
    assert (empty.max_abs_diff, empty.scale, empty.rel_diff) == (0.0, 0.0, 0.0)


def test_scale_and_relative() -> None:
    assert scale(np.array([-3.0, np.inf, np.nan, 2.0], f32)) == 3.0
    assert scale(np.array([np.nan], f32)) == 0.0 and scale(np.zeros(0, f32)) == 0.0
    assert relative(0.0, 0.0) == 0.0 and relative(1.0, 0.0) == math.inf
    assert relative(math.inf, 1.0) == math.inf and relative(1.0, 4.0) == 0.25


def _finding(key: str, role: str, seq: int, rel: float | None) -> OpFinding:
    op = OpInfo(0, key, "Op", key, "", "", "", ["float32"], [[1]], [True])
    return OpFinding(key, op, role, "numerical", seq, 1, 2, 1, 1, rel_diff=rel)


def test_sources_sort_by_relative_size_unknown_last_and_before_the_rest() -> None:
    findings = [
        _finding("small", "source", 1, 1e-7),
        _finding("unknown", "source", 2, None),
        _finding("nan", "source", 3, math.nan),
        _finding("large", "source", 4, 0.5),
        _finding("infinite", "source", 5, math.inf),
        _finding("tie", "source", 6, 1e-7),
        _finding("flow", "control flow", 0, None),
        _finding("after", "propagated", 7, 1.0),
        _finding("before", "propagated", 0, 1e-3),
    ]
    _sort_by_magnitude(findings)
    assert [f.key for f in findings] == [
        "infinite",
        "large",
        "small",
        "tie",  # ties keep execution order
        "unknown",
        "nan",
        "flow",
        "after",  # propagated ops keep the analysis's order
        "before",
    ]


def test_capture_runs_stop_once_every_source_is_measured() -> None:
    """check() takes two capture runs, and more (up to MAX_CAPTURES) only while a source's
    divergence has not recurred in them: a race that showed in the repeats may not in the
    next two runs, and its size would then be unknown."""
    import tensorflow as tf

    import nddebug
    from nddebug.check import _not_yet_measured

    w = tf.Variable(tf.ones([64, 64]))

    @tf.function
    def step() -> tf.Tensor:
        return tf.reduce_sum(tf.random.uniform([64, 64]) @ w)  # unseeded: differs every run

    report = nddebug.check(step, repeats=2, state=[w], confirm=0)
    source = report.sources.iloc[0]
    assert source["op_type"] == "RandomUniform" and source["max_ulp"] >= 1
    assert len(report.captures) == 2  # measured in the first two: no more runs
    one = report.captures[0]
    assert _not_yet_measured({source["key"]}, report.captures) == set()
    assert _not_yet_measured({source["key"]}, [one, one]) == {source["key"]}


@pytest.mark.parametrize(
    ("name", "below_two"),  # the float just below 2.0 in each 8-bit format
    [("float8_e5m2", 1.75), ("float8_e4m3fn", 1.875), ("float8_e4m3b11fnuz", 1.875)],
)
def test_one_byte_floats_are_measured_in_their_own_ulps(name: str, below_two: float) -> None:
    # float8_e5m2's NumPy kind is 'f', the others' 'V': both are floats, in one byte.
    f8 = getattr(ml_dtypes, name)
    a = np.array([2.0, -1.0], f8)
    b = np.array([below_two, -1.0], f8)
    d = measure([a, b])
    assert (d.max_ulp, d.max_abs_diff, d.scale) == (1, 2.0 - below_two, 2.0)
    # ml_dtypes' 4-bit integers are integers: the plain difference.
    i4 = measure([np.array([3, -2], ml_dtypes.int4), np.array([1, -2], ml_dtypes.int4)])
    assert (i4.max_ulp, i4.max_abs_diff) == (2, 2.0)
