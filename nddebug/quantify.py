"""How large a divergence is: max absolute difference, max ULP distance, fraction of elements."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_INT_OF = {2: np.int16, 4: np.int32, 8: np.int64}


@dataclass
class Divergence:
    max_abs_diff: float
    max_ulp: int
    frac_differing: float


def _ordered(bits: np.ndarray) -> np.ndarray:
    """Map signed-integer views of float bit patterns to integers on one number line, so that
    adjacent floats differ by 1 (and -0.0 and 0.0 coincide)."""
    wide = bits.astype(np.int64)
    if bits.dtype.itemsize == 8:
        return np.where(wide < 0, np.int64(np.iinfo(np.int64).min) - wide, wide)
    magnitude = np.int64((1 << (8 * bits.dtype.itemsize - 1)) - 1)
    return np.where(wide < 0, -(wide & magnitude), wide)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in units in the last place (integers: plain difference)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "c":
        a, b = a.view(a.real.dtype), b.view(b.real.dtype)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        signed = _INT_OF[a.dtype.itemsize]
        oa, ob = _ordered(a.view(signed)), _ordered(b.view(signed))
        return np.abs(oa.astype(np.float64) - ob.astype(np.float64)).astype(np.uint64)
    if a.dtype == np.bool_:
        return (a != b).astype(np.uint64)
    return np.abs(a.astype(np.float64) - b.astype(np.float64)).astype(np.uint64)


def measure(values: list[np.ndarray]) -> Divergence | None:
    """Compare every array to the first; None if shapes or dtypes differ."""
    base = np.asarray(values[0])
    max_abs, max_ulp, frac = 0.0, 0, 0.0
    for other in values[1:]:
        other = np.asarray(other)
        if other.shape != base.shape or other.dtype != base.dtype:
            return None
        if base.size == 0:
            continue
        differs = _bitwise_differs(base, other)
        frac = max(frac, float(differs.mean()))
        if not differs.any():
            continue
        numeric_a = _numeric(base)
        numeric_b = _numeric(other)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(numeric_a - numeric_b)
        finite = diff[np.isfinite(diff)]
        if finite.size:
            max_abs = max(max_abs, float(finite.max()))
        if np.isnan(diff).any() or np.isinf(diff).any():
            max_abs = float("inf") if not finite.size else max(max_abs, float("inf"))
        max_ulp = max(max_ulp, int(ulp_distance(base, other).max()))
    return Divergence(max_abs_diff=max_abs, max_ulp=max_ulp, frac_differing=frac)


def _bitwise_differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    width = a.dtype.itemsize
    ua = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, width)
    ub = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, width)
    return (ua != ub).any(axis=1).reshape(a.shape)


def _numeric(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "c":
        return np.abs(a.astype(np.complex128))
    if a.dtype.kind in "fiub":
        return a.astype(np.float64)
    try:
        return a.astype(np.float64)  # bfloat16 and other ml_dtypes
    except (TypeError, ValueError):
        return np.zeros(a.shape)
