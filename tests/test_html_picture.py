"""The HTML report's picture of the divergence along execution order: its SVG says what the
analysis found (checked by parsing it), and a real browser draws it (checked on a screenshot,
when chromium is installed)."""

from __future__ import annotations

import math
import os
import re
import shutil
import struct
import subprocess
import tempfile
import xml.etree.ElementTree as ET
import zlib

import numpy as np
import pytest
import tensorflow as tf

import nddebug
from nddebug.examples.detection import make_step
from nddebug.render import html

SVG = "{http://www.w3.org/2000/svg}"
LOOP_ITERATIONS = 300  # 7 op executions each: thousands of executions, so the picture bins


pytestmark = pytest.mark.usefixtures("cpu_facts")  # the CPU's crop race as the one source


@pytest.fixture(scope="module")
def crop_report() -> nddebug.Report:
    """The real CropAndResizeGradImage culprit (see test_culprit_crop_and_resize.py for why
    three repeats cannot agree by chance)."""
    step, args, state = make_step()
    return nddebug.check(step, *args, repeats=3, state=state)


@pytest.fixture(scope="module")
def loop_report() -> nddebug.Report:
    """A long while loop whose unseeded noise enters the result only in its second half,
    checked without magnitudes: dense, and every magnitude unknown."""
    n = LOOP_ITERATIONS

    @tf.function
    def loop(x):
        def body(i, acc):
            noise = tf.random.uniform([4])  # unseeded, stateful: differs in every run
            return i + 1, acc * 0.5 + tf.where(i > n // 2, noise, tf.zeros([4]))

        return tf.while_loop(lambda i, a: i < n, body, [0, x])[1]

    return nddebug.check(loop, tf.zeros([4]), repeats=2, quantify=False)


def _svg(report: nddebug.Report) -> ET.Element:
    match = re.search(r"<svg .*?</svg>", report._repr_html_(), re.S)
    assert match, "the report has no picture"
    return ET.fromstring(match.group(0))


def _marks(svg: ET.Element) -> list[ET.Element]:
    return [e for e in svg.iter() if e.get("class", "").startswith("mark ")]


def _mark_xy(mark: ET.Element) -> tuple[float, float]:
    if mark.tag == SVG + "circle":
        return float(mark.get("cx")), float(mark.get("cy"))
    points = [tuple(map(float, p.split(","))) for p in mark.get("points").split()]
    xs, ys = zip(*points, strict=True)
    return (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2


def test_one_mark_per_divergent_execution_and_the_source_annotated(crop_report) -> None:
    svg = _svg(crop_report)
    findings = crop_report.comparison.findings
    executions = crop_report.summary["op_executions_per_run"]
    assert executions <= html._MAX_SLOTS  # small enough to draw every execution

    marks = _marks(svg)
    assert len(marks) == sum(f.divergent_executions for f in findings)
    assert all(m.get("data-n") == "1" for m in marks)
    roles = [m.get("class").split()[1] for m in marks]
    assert roles.count("source") == 1 and roles.count("propagated") == len(marks) - 1
    # Nothing before the source diverged: the forward pass is identical, the spread is after.
    source_x = next(_mark_xy(m)[0] for m in marks if "source" in m.get("class"))
    assert all(_mark_xy(m)[0] > source_x for m in marks if "propagated" in m.get("class"))

    note = next(e for e in svg.iter() if e.get("class") == "first-source")
    assert "CropAndResizeGradImage" in note.text and "starts here" in note.text
    # The band of all executions: one cell per execution, the divergent ones coloured.
    band = next(e for e in svg.iter() if e.get("class") == "ops")
    cells = [e for e in band if e.tag == SVG + "rect"]
    coloured = [e for e in cells if "divergent" in e.get("class", "")]
    assert len(cells) - len(coloured) == executions
    assert len(coloured) == len(marks)
    assert [e.get("fill") for e in coloured if "source" in e.get("class")] == [
        html.ROLE_COLOURS["source"]
    ]


def test_magnitudes_on_a_log_scale(crop_report) -> None:
    svg = _svg(crop_report)
    ticks = {
        int(g.get("data-decade")): float(next(iter(g)).get("y1"))
        for g in svg.iter()
        if g.get("class") == "ytick"
    }
    decades = sorted(ticks)
    assert decades[0] == 0 and len(decades) >= 3
    # Equal distances per decade: the axis is logarithmic.
    per_decade = (ticks[decades[0]] - ticks[decades[-1]]) / (decades[-1] - decades[0])
    for k in decades:
        assert ticks[k] == pytest.approx(ticks[0] - k * per_decade, abs=0.2)
    source = crop_report.sources.iloc[0]
    assert decades[-1] >= math.log10(source["max_ulp"])  # the axis reaches the largest value
    mark = next(m for m in _marks(svg) if "source" in m.get("class"))
    expected_y = ticks[0] - math.log10(source["max_ulp"]) * per_decade
    assert _mark_xy(mark)[1] == pytest.approx(expected_y, abs=0.2)
    # (Propagated ops may land in the "unknown" band: a 1-ULP difference times a learning rate
    # can round away in the two capture runs, so their magnitude is not always known.)


def test_dense_run_is_binned_and_unknown_magnitudes_get_their_band(loop_report) -> None:
    executions = loop_report.summary["op_executions_per_run"]
    assert executions >= 7 * LOOP_ITERATIONS
    svg = _svg(loop_report)
    marks = _marks(svg)
    # Binned: a mark stands for several executions, and they add up to all divergent ones.
    assert len(marks) <= 3 * html._BINS
    assert sum(int(m.get("data-n")) for m in marks) == sum(
        f.divergent_executions for f in loop_report.comparison.findings
    )
    assert max(int(m.get("data-n")) for m in marks) > 1
    band = next(e for e in svg.iter() if e.get("class") == "unknown")
    top, bottom = float(band.get("y")), float(band.get("y")) + float(band.get("height"))
    assert all(top < _mark_xy(m)[1] < bottom for m in marks)
    text = "".join(svg.itertext())
    assert "RandomUniform" in text and "binned" in text
    # The noise enters the result only in the second half: the first half of the band shows
    # only the noise op itself (one execution in eight), the second half nearly everything.
    cells = [e for e in svg.iter() if "divergent" in e.get("class", "")]
    half = (html._X0 + html._X1) / 2
    early = [float(e.get("fill-opacity")) for e in cells if float(e.get("x")) < half - 20]
    late = [float(e.get("fill-opacity")) for e in cells if float(e.get("x")) > half + 20]
    assert early and late and max(early) < min(late)


def test_reproducible_report_says_so_in_one_line() -> None:
    w = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))

    @tf.function
    def step(x):
        return tf.reduce_sum(tf.matmul(x, w))

    report = nddebug.check(step, tf.ones([2, 3]), repeats=2)
    assert report.ok
    page = html.page(report)
    n = report.summary["op_executions_per_run"]
    assert f"All {n} op executions were bitwise identical in all 2 runs." in page
    assert "<svg" not in page


# ---------------------------------------------------------------------------------- browser
def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _screenshot(browser: str, page: str, width: int = 1000, height: int = 600) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        html_path, png_path = os.path.join(tmp, "report.html"), os.path.join(tmp, "shot.png")
        with open(html_path, "w", encoding="utf-8") as f:
            f.write(page)
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={os.path.join(tmp, 'profile')}",
                f"--screenshot={png_path}",
                f"--window-size={width},{height}",
                "file://" + html_path,
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
        with open(png_path, "rb") as f:
            return _decode_png(f.read())


def _decode_png(data: bytes) -> np.ndarray:
    """A minimal PNG reader (8-bit RGB/RGBA, not interlaced): enough for a browser screenshot,
    without an imaging library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(idat)
    rows: list[bytes] = []
    prev = bytes(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]
        if kind == 0:
            row = line
        elif kind == 2:  # Up
            row = bytes((a + b) & 255 for a, b in zip(line, prev, strict=True))
        else:  # Sub, Average, Paeth: each byte depends on the one to its left
            out = bytearray(line)
            for i in range(stride):
                a = out[i - bpp] if i >= bpp else 0
                if kind == 1:
                    pred = a
                elif kind == 3:
                    pred = (a + prev[i]) >> 1
                else:
                    b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                out[i] = (out[i] + pred) & 255
            row = bytes(out)
        rows.append(row)
        prev = row
    pixels = np.frombuffer(b"".join(rows), np.uint8).reshape(height, width, bpp)
    return pixels[:, :, :3]


def _has_colour(pixels: np.ndarray, hex_colour: str, tolerance: int = 8) -> int:
    target = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(pixels.astype(int) - target).max(axis=2) <= tolerance).sum())


def test_a_browser_draws_the_picture(crop_report) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium or chrome binary on this machine")
    pixels = _screenshot(browser, html.page(crop_report))
    assert pixels.shape[:2] == (600, 1000)
    not_white = (pixels < 240).any(axis=2)
    assert not_white.mean() > 0.02, "the page is blank"
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20
    # The source's colour: its mark and its cell in the band of executions (about 20x14 px).
    assert _has_colour(pixels, html.ROLE_COLOURS["source"]) >= 150
    assert _has_colour(pixels, html.ROLE_COLOURS["propagated"]) >= 150
