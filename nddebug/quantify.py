"""How large a divergence is: max absolute difference, max ULP distance, fraction of elements,
and the same difference against the tensor's own scale (max |x|), which is what a reader can
judge: a billion ULPs between two values near zero can be nothing next to the tensor's largest
value."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_INT_OF = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


@dataclass
class Divergence:
    max_abs_diff: float
    max_ulp: int
    frac_differing: float
    scale: float = 0.0  # the largest finite |x| in the compared arrays
    rel_diff: float = 0.0  # max |Δ| / scale, per compared pair; inf if NaN/inf appeared or vanished


def _ordered(bits: np.ndarray) -> np.ndarray:
    """Map signed-integer views of float bit patterns to integers on one number line, so that
    adjacent floats differ by 1 (and -0.0 and 0.0 coincide)."""
    wide = bits.astype(np.int64)
    if bits.dtype.itemsize == 8:
        return np.where(wide < 0, np.int64(np.iinfo(np.int64).min) - wide, wide)
    magnitude = np.int64((1 << (8 * bits.dtype.itemsize - 1)) - 1)
    return np.where(wide < 0, -(wide & magnitude), wide)


def _is_float(dtype: np.dtype) -> bool:
    """NumPy's floats and ml_dtypes' (bfloat16, the float8 and float4 types), whose NumPy
    kind is 'V' for most of them; ml_dtypes' int4 and uint4 are integers."""
    if dtype.kind == "f":
        return True
    if dtype.kind != "V":
        return False
    try:
        import ml_dtypes

        ml_dtypes.finfo(dtype)
    except (ImportError, ValueError, TypeError):
        return False
    return dtype.itemsize in _INT_OF


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in units in the last place (integers: plain difference)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "c":
        a, b = a.view(a.real.dtype), b.view(b.real.dtype)
    if _is_float(a.dtype):
        signed = _INT_OF[a.dtype.itemsize]
        oa, ob = _ordered(a.view(signed)), _ordered(b.view(signed))
        return np.abs(oa.astype(np.float64) - ob.astype(np.float64)).astype(np.uint64)
    if a.dtype == np.bool_:
        return (a != b).astype(np.uint64)
    return np.abs(a.astype(np.float64) - b.astype(np.float64)).astype(np.uint64)


def scale(a: np.ndarray) -> float:
    """The tensor's own scale: its largest finite magnitude (0.0 if it has none)."""
    a = np.asarray(a)
    if a.size == 0:
        return 0.0
    magnitude = np.abs(_numeric(a))
    finite = magnitude[np.isfinite(magnitude)]
    return float(finite.max()) if finite.size else 0.0


def relative(max_abs_diff: float, tensor_scale: float) -> float:
    """max |Δ| / max |x|: 0 when nothing numeric differs (e.g. -0.0 against 0.0), inf when a
    NaN or inf appeared or vanished, or when the tensor has no finite non-zero value."""
    if max_abs_diff == 0:
        return 0.0
    if not np.isfinite(max_abs_diff) or tensor_scale == 0:
        return float("inf")
    return max_abs_diff / tensor_scale


def measure(values: list[np.ndarray]) -> Divergence | None:
    """Compare every array to the first; None if shapes or dtypes differ."""
    base = np.asarray(values[0])
    max_abs, max_ulp, frac, top, rel = 0.0, 0, 0.0, 0.0, 0.0
    base_scale = scale(base)
    for other in values[1:]:
        other = np.asarray(other)
        if other.shape != base.shape or other.dtype != base.dtype:
            return None
        if base.size == 0:
            continue
        pair_scale = max(base_scale, scale(other))
        top = max(top, pair_scale)
        differs = _bitwise_differs(base, other)
        frac = max(frac, float(differs.mean()))
        if not differs.any():
            continue
        a, b = base[differs], other[differs]
        numeric_a, numeric_b = _numeric(a), _numeric(b)
        # NaN in both runs is the same value whatever its payload; elsewhere NaN against a
        # number, or inf against anything else, is an infinite difference.
        keep = ~(np.isnan(numeric_a) & np.isnan(numeric_b))
        a, b, numeric_a, numeric_b = a[keep], b[keep], numeric_a[keep], numeric_b[keep]
        if not a.size:
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(numeric_a - numeric_b)
        pair_abs = float(np.where(np.isfinite(diff), diff, np.inf).max())
        max_abs = max(max_abs, pair_abs)
        rel = max(rel, relative(pair_abs, pair_scale))
        max_ulp = max(max_ulp, int(ulp_distance(a, b).max()))
    return Divergence(max_abs, max_ulp, frac, top, rel)


def _bitwise_differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    width = a.dtype.itemsize
    ua = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, width)
    ub = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, width)
    return (ua != ub).any(axis=1).reshape(a.shape)


def _numeric(a: np.ndarray) -> np.ndarray:
    """Values to subtract: complex128 for complex (|a - b| is then the distance in the plane),
    float64 for every real type (bool as 0/1; bfloat16 and other ml_dtypes convert too)."""
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    try:
        return a.astype(np.float64)
    except (TypeError, ValueError):
        return np.zeros(a.shape)
