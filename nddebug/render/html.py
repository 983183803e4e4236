"""The report as self-contained HTML, for Jupyter and for saving as a page."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nddebug.render.text import RELATIVE_NOTE, cell

if TYPE_CHECKING:
    from nddebug.recording import Recording
    from nddebug.report import Report

_COLUMNS = [
    ("op_type", "op"),
    ("op_name", "name"),
    ("role", "role"),
    ("kind", "kind"),
    ("location", "created at"),
    ("runs_differing", "runs ≠"),
    ("distinct_outputs", "distinct"),
    ("max_abs_diff", "max |Δ|"),
    ("max_ulp", "max ULP"),
    ("scale", "max |x|"),
    ("rel_diff", "rel |Δ|"),
]
# Long texts: in an expandable row under the op's row, so the table stays one line per op.
_DETAILS = [
    ("explanation", "why"),
    ("known_cause", "known cause"),
    ("evidence", "evidence"),
    ("fix", "fix"),
]
_STYLE = """
<style>
.nddebug {font-family: system-ui, sans-serif; font-size: 13px}
.nddebug .verdict-ok {color: #17663a} .nddebug .verdict-bad {color: #b00020}
.nddebug table {border-collapse: collapse; margin-top: 6px}
.nddebug th, .nddebug td {border: 1px solid #ddd; padding: 3px 6px; text-align: left;
  vertical-align: top}
.nddebug tr.source td {background: #fdecea} .nddebug tr.propagated td {color: #555}
.nddebug .note {color: #666} .nddebug .first {font-weight: 600}
.nddebug tr.details td {border-top: none; color: #333; max-width: 900px}
.nddebug tr.details p {margin: 2px 0}
.nddebug figure {margin: 8px 0} .nddebug figcaption {color: #555; max-width: 900px}
</style>
"""


def page(report: Report) -> str:
    """The report as a complete, self-contained HTML document (to save or open in a browser)."""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>nddebug report</title></head>"
        f"<body>\n{render(report)}\n</body></html>\n"
    )


def render(report: Report) -> str:
    """The report as an HTML fragment: header, the picture of the divergence, the table (for
    an XLA step checked both ways, the step as compiled first)."""
    if report.as_compiled is not None:
        return (
            "<h4>The step as compiled (XLA on), as you run it</h4>\n"
            + _render(report.as_compiled)
            + "\n<h4>The same step with XLA off, to name the ops</h4>\n"
            + _render(report)
        )
    return _render(report)


def _render(report: Report) -> str:
    s = report.summary
    cls = "verdict-ok" if report.ok else "verdict-bad"
    if s["mode"] == "rerun":
        runs = (
            "one step, no op re-executed"  # see not_compared
            if s["runs"] < 2
            else f"one step, each stateless op executed {s['runs']} times"
        )
        per_run = "executions"
    else:
        runs, per_run = f"{s['runs']} runs", "executions per run"
    parts = [
        _STYLE,
        '<div class="nddebug">',
        f'<h3 class="{cls}">nddebug: {html.escape(s["verdict"])}</h3>',
        "<p>"
        f"{runs} · {s['ops_traced']} ops traced · {s['op_executions_per_run']} "
        f"{per_run} · {s['sources']} source(s), {s['propagated']} propagated · "
        f"TensorFlow {html.escape(str(s['tensorflow']))} on {html.escape(s['devices'])} · "
        f"op determinism {'on' if s['op_determinism'] else 'off'}</p>",
        f'<p class="note">mode: {html.escape(s["mode"])} — {html.escape(report.mode_note)}</p>',
    ]
    for e in report.errors:  # an op that raised: the step was not checked
        parts.append(
            f'<p class="verdict-bad">raises: {html.escape(e.summary)}.</p>'
            f'<p class="note">error: {html.escape(e.message)}</p>'
            f"<p>instead: {html.escape(e.fix)}</p>"
        )
    for note in report.verdict_notes:  # what the runs could not show
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    for w in report.warnings:  # what was not covered belongs next to the verdict
        parts.append(f'<p class="note">warning: {html.escape(w)}</p>')
    for item in report.blind_spots:
        parts.append(f'<p class="note">not compared: {html.escape(item)}</p>')
    for p in report.comparison.paths:
        parts.append(
            f"<p>Run {p.run} took a different path at top-level op #{p.position}: "
            f"{html.escape(p.reference_op)} vs {html.escape(p.other_op)}</p>"
        )
    fd = report.first_divergence
    if fd is not None and fd.steps > 1:  # one step: the table below says it all
        parts.append(f'<p class="first">{html.escape(fd.sentence())}</p>')
        parts.append(step_picture(report.timeline, fd.step))
    parts.append(picture(report))
    df = report.own_culprits
    if len(df):
        head = "".join(f"<th>{html.escape(h)}</th>" for _, h in _COLUMNS)
        body = []
        for _, row in df.iterrows():
            cells = "".join(f"<td>{html.escape(cell(row, c, None))}</td>" for c, _ in _COLUMNS)
            role = html.escape(row["role"].replace(" ", "-"))
            body.append(f'<tr class="{role}">{cells}</tr>')
            texts = [(h, str(row[c])) for c, h in _DETAILS if c in row and str(row[c] or "")]
            if texts:
                inner = "".join(
                    f"<p><b>{html.escape(h)}:</b> {html.escape(t)}</p>" for h, t in texts
                )
                body.append(
                    f'<tr class="details {role}"><td colspan="{len(_COLUMNS)}"><details>'
                    f"<summary>why, evidence and fix</summary>{inner}</details></td></tr>"
                )
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
        if df["rel_diff"].notna().any():
            parts.append(f'<p class="note">{html.escape(RELATIVE_NOTE)}</p>')
    parts.append("</div>")
    return "\n".join(parts)


def step_picture(counts: list[int], first: int | None) -> str:
    """Divergent op executions per step, as bars along the steps, the first divergent step
    marked: for a long run, where the runs part and how the divergence grows."""
    if len(counts) < 2:
        return ""
    n, top = len(counts), max(counts) or 1
    w, h, x0, x1, y0, y1 = 900, 120, 60, 884, 20, 90
    bw = (x1 - x0) / n
    bars = []
    for i, c in enumerate(counts):
        if c:
            bh = max(1.5, (y1 - y0) * math.log1p(c) / math.log1p(top))
            bars.append(
                f'<rect x="{x0 + i * bw:.1f}" y="{y1 - bh:.1f}" width="{max(bw, 1):.1f}" '
                f'height="{bh:.1f}" fill="#ef8f00"><title>step {i + 1}: {c} divergent op '
                f"execution(s)</title></rect>"
            )
    mark = ""
    if first is not None:
        x = x0 + (first - 0.5) * bw
        mark = (
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0 - 8}" y2="{y1}" stroke="#c62828" '
            f'stroke-width="1.5"/><text x="{x + 4:.1f}" y="{y0 - 2}" font-size="11" '
            f'fill="#c62828">first divergence: step {first}</text>'
        )
    axis = (
        f'<line x1="{x0}" x2="{x1}" y1="{y1}" y2="{y1}" stroke="#999"/>'
        f'<text x="{x0}" y="{y1 + 16}" font-size="11">step 1</text>'
        f'<text x="{x1}" y="{y1 + 16}" font-size="11" text-anchor="end">step {n}</text>'
        f'<text x="{x0 - 6}" y="{(y0 + y1) / 2:.0f}" font-size="10" text-anchor="end" '
        f'fill="#555">ops≠</text>'
    )
    return (
        f'<figure class="nddebug-steps"><svg viewBox="0 0 {w} {h}" width="100%" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="divergence per step">'
        f"{axis}{''.join(bars)}{mark}</svg><figcaption>Divergent op executions per step "
        f"(log scale), steps 1 to {n}.</figcaption></figure>"
    )


# ---------------------------------------------------------------------------------- picture
# Where the divergence is along the step, as inline SVG: one glance shows where it started and
# how far it spread, which a table sorted by role cannot. Plain SVG, no script: it survives
# nbconvert, GitHub's notebook viewer and saved pages.

ROLE_COLOURS = {"source": "#c62828", "propagated": "#ef8f00", "control flow": "#6a1b9a"}
_ROLE_ORDER = {"propagated": 0, "control flow": 1, "source": 2}  # later is drawn on top
_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
_MAX_SLOTS = 160  # up to this many executions, one column each; beyond, bins of several
_BINS = 205  # about 4 units wide each

# Geometry of the drawing (viewBox units; the SVG scales to the output's width).
_W, _H = 900, 282
_X0, _X1 = 70, 884
_TOP = 38  # the annotation line ends here
_UNKNOWN = (44, 62)  # the band for divergent executions whose magnitude is unknown
_PLOT = (72, 182)  # y extent of the log-scale area (top, bottom)
_OPS = (192, 206)  # the band of all executions


@dataclass
class DivergentExecution:
    """One divergent op execution placed on the picture."""

    position: int  # index in run 0's execution order
    role: str
    max_ulp: int | None  # the op's max ULP (as in the table); None if unknown
    op_type: str
    op_name: str


def divergent_executions(report: Report) -> list[DivergentExecution]:
    """Every divergent execution with its position in run 0's execution order.

    The findings hold op-level facts; the per-execution positions come from aligning the runs
    again (a pure function of the recordings, no TensorFlow). An execution that did not run in
    run 0 (control flow) is placed where the top-level op it belongs to ran.
    """
    from nddebug.analysis import align

    c = report.comparison
    recs = compared_runs(report)
    if not c.findings:
        return []
    per_run_units, _ = align(recs)
    ref = per_run_units[0]
    events = recs[0].events
    position = {ev.seq: i for i, ev in enumerate(events)}
    eager = [position[ev.seq] for ev in events if ev.call == ev.seq]
    by_key = {f.key: f for f in c.findings}
    units: dict[str, list[Any]] = {}
    for pu in per_run_units:
        for u in pu:
            if u[1] in by_key:
                units.setdefault(u[1], []).append(u)
    out = []
    for key, f in by_key.items():
        every = sorted(set(units.get(key, [])))
        present = [u for u in every if all(u in pu for pu in per_run_units)]
        differing = [u for u in present if len({tuple(pu[u].digests) for pu in per_run_units}) > 1]
        # As the analysis counts them: the divergent executions, or if there are none, the
        # executions missing from some runs.
        marked = differing or [u for u in every if u not in present]
        chosen = set(f.units)
        ulp = f.max_ulp if f.max_ulp is not None and f.max_ulp == f.max_ulp else None
        for u in marked:
            if u in ref:
                x = position[ref[u].seq]
            elif 0 <= u[0] < len(eager):
                x = eager[u[0]]
            else:
                x = len(events) - 1
            role = f.role if u in chosen else "propagated"
            out.append(DivergentExecution(x, role, ulp, f.op.op_type, f.op.op_name))
    out.sort(key=lambda d: (d.position, _ROLE_ORDER[d.role]))
    return out


def compared_runs(report: Report) -> list[Recording]:
    """The runs the comparison was made over: the recordings themselves, or for a rerun
    report, its one recording expanded into one run per re-execution."""
    if report.mode == "rerun":
        from nddebug.analysis import expand_reruns

        return expand_reruns(report.recordings[0])
    return report.recordings


def picture(report: Report) -> str:
    """The divergence along execution order, as an HTML figure holding an inline SVG; for a
    reproducible report, one line saying so."""
    c = report.comparison
    if not report.recordings:  # the step raised before a run ended: nothing to draw
        return ""
    n = len(report.recordings[0].events)
    if report.ok:
        return (
            f'<p class="picture-ok">All {n} op executions were bitwise identical in all '
            f"{c.runs} {'executions of each op' if report.mode == 'rerun' else 'runs'}.</p>"
        )
    marks = divergent_executions(report)
    return (
        '<figure class="nddebug-picture">'
        + _svg(report, marks, n)
        + f"<figcaption>{_caption(report, marks, n)}</figcaption></figure>"
    )


def _svg(report: Report, marks: list[DivergentExecution], n: int) -> str:
    binned = n > _MAX_SLOTS
    slots = min(n, _BINS) if binned else n
    sw = (_X1 - _X0) / slots

    def slot(position: int) -> int:
        return position * slots // n if binned else position

    def cx(s: float) -> float:
        return _X0 + (s + 0.5) * sw

    largest = max((m.max_ulp for m in marks if m.max_ulp is not None), default=1)
    top = max(1, math.ceil(math.log10(max(largest, 1))))
    step = max(1, math.ceil(top / 6))
    top = math.ceil(top / step) * step

    def y_of(ulp: int | None) -> float:
        if ulp is None:
            return (_UNKNOWN[0] + _UNKNOWN[1]) / 2
        frac = math.log10(max(ulp, 1)) / top
        return _PLOT[1] - frac * (_PLOT[1] - _PLOT[0])

    p: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="100%" '
        f'style="max-width:{_W}px;font:11px system-ui,sans-serif" role="img" '
        'aria-label="divergence along execution order">'
    ]
    # The y axis: decades of ULP, and the band for unknown magnitudes above them.
    unknown = any(m.max_ulp is None for m in marks)
    shade_top = _UNKNOWN[0] if unknown else _PLOT[0] - 8
    if unknown:
        p.append(
            f'<rect class="unknown" x="{_X0}" y="{_UNKNOWN[0]}" width="{_X1 - _X0}" '
            f'height="{_UNKNOWN[1] - _UNKNOWN[0]}" fill="#f0f0f0"/>'
            f'<text x="{_X0 - 6}" y="{(_UNKNOWN[0] + _UNKNOWN[1]) / 2 + 4}" text-anchor="end" '
            'fill="#444">unknown</text>'
        )
    for k in range(0, top + 1, step):
        y = y_of(10**k)
        label = "1" if k == 0 else ("10" if k == 1 else "10" + str(k).translate(_SUPERSCRIPT))
        p.append(
            f'<g class="ytick" data-decade="{k}"><line x1="{_X0}" x2="{_X1}" y1="{y:.1f}" '
            f'y2="{y:.1f}" stroke="#e4e4e4"/><text x="{_X0 - 6}" y="{y + 4:.1f}" '
            f'text-anchor="end" fill="#444">{label}</text></g>'
        )
    p.append(
        f'<text transform="translate(14 {(_PLOT[0] + _PLOT[1]) / 2}) rotate(-90)" '
        'text-anchor="middle" fill="#444">max ULP</text>'
    )
    # The band of all executions, divergent ones coloured by the most telling role.
    p.append(
        f'<text x="{_X0 - 6}" y="{_OPS[1] - 3}" text-anchor="end" fill="#444">ops</text>'
        f'<g class="ops">'
    )
    per_slot: dict[int, list[DivergentExecution]] = {}
    for m in marks:
        per_slot.setdefault(slot(m.position), []).append(m)
    if binned:
        p.append(
            f'<rect x="{_X0}" y="{_OPS[0]}" width="{_X1 - _X0}" height="{_OPS[1] - _OPS[0]}" '
            'fill="#e3e3e3"/>'
        )
    else:
        gap = 1 if sw >= 4 else 0
        for s in range(slots):
            p.append(
                f'<rect x="{_X0 + s * sw:.2f}" y="{_OPS[0]}" width="{max(sw - gap, 0.5):.2f}" '
                f'height="{_OPS[1] - _OPS[0]}" fill="#e3e3e3"/>'
            )
    for s, ms in sorted(per_slot.items()):
        role = max(ms, key=lambda m: _ROLE_ORDER[m.role]).role
        # Binned: the more of the bin's executions diverged, the stronger the colour.
        opacity = min(1.0, 0.35 + 0.65 * len(ms) * slots / n) if binned else 1.0
        gap = 1 if sw >= 4 and not binned else 0
        p.append(
            f'<rect class="divergent {role.replace(" ", "-")}" x="{_X0 + s * sw:.2f}" '
            f'y="{_OPS[0]}" width="{max(sw - gap, 1):.2f}" height="{_OPS[1] - _OPS[0]}" '
            f'fill="{ROLE_COLOURS[role]}" fill-opacity="{opacity:.2f}"/>'
        )
    p.append("</g>")
    # The x axis: execution numbers.
    for t in _ticks(n):
        x = cx(slot(t)) if not binned else _X0 + t / n * (_X1 - _X0)
        p.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_OPS[1]}" y2="{_OPS[1] + 4}" stroke="#888"/>'
            f'<text x="{x:.1f}" y="{_OPS[1] + 16}" text-anchor="middle" fill="#444">{t}</text>'
        )
    p.append(
        f'<text x="{(_X0 + _X1) / 2}" y="{_OPS[1] + 34}" text-anchor="middle" fill="#444">'
        f"op executions of {_reference(report)}, in execution order ({n}"
        f"{', binned' if binned else ''})</text>"
    )
    # Where the runs took different paths.
    for path in report.comparison.paths:
        x = _path_x(report, path.position, n)
        x = cx(slot(x)) if not binned else _X0 + (x + 0.5) / n * (_X1 - _X0)
        p.append(
            f'<line class="path" x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP}" y2="{_OPS[1]}" '
            f'stroke="{ROLE_COLOURS["control flow"]}" stroke-dasharray="2 3"/>'
            f'<text x="{x + 4:.1f}" y="{_PLOT[1] - 5}" fill="{ROLE_COLOURS["control flow"]}">'
            f"run {path.run} parts</text>"
        )
    # Where it started: the first source, annotated with its op type.
    sources = [m for m in marks if m.role == "source"]
    if sources:
        first = sources[0]
        x = cx(slot(first.position))
        p.append(
            f'<rect x="{x:.1f}" y="{shade_top}" width="{_X1 - x:.1f}" '
            f'height="{_PLOT[1] - shade_top}" fill="{ROLE_COLOURS["source"]}" '
            'fill-opacity="0.04"/>'
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_TOP - 8}" y2="{_OPS[1]}" '
            f'stroke="{ROLE_COLOURS["source"]}" stroke-dasharray="4 3"/>'
        )
        right = x > _X0 + 0.6 * (_X1 - _X0)
        text = (
            f"starts here: {first.op_type} (source, execution #{first.position})"
            if not right
            else f"{first.op_type} (source, execution #{first.position}): starts here"
        )
        p.append(
            f'<text class="first-source" x="{x + (-6 if right else 6):.1f}" y="{_TOP - 12}" '
            f'text-anchor="{"end" if right else "start"}" font-weight="600" '
            f'fill="{ROLE_COLOURS["source"]}">{html.escape(text)}</text>'
        )
    # The marks: one per divergent execution, or per (bin, role, band) when binned.
    groups: dict[tuple[int, str, bool], list[DivergentExecution]] = {}
    for m in marks:
        groups.setdefault((slot(m.position), m.role, m.max_ulp is None), []).append(m)
    r = max(2.6, min(5.0, sw * 0.32))
    p.append('<g class="marks">')
    for (s, role, _unknown), ms in sorted(groups.items(), key=lambda kv: _ROLE_ORDER[kv[0][1]]):
        worst = max(ms, key=lambda m: -1 if m.max_ulp is None else m.max_ulp)
        title = _mark_title(ms, worst, binned)
        p.append(_mark(cx(s), y_of(worst.max_ulp), r, role, len(ms), title))
    p.append("</g>")
    # The legend.
    x = _X0
    y = _H - 8
    for role in sorted({m.role for m in marks}, key=lambda r: -_ROLE_ORDER[r]):
        p.append(_mark(x + 5, y - 4, 4.2, role, 0, "", legend=True))
        p.append(f'<text x="{x + 14}" y="{y}" fill="#444">{role}</text>')
        x += 14 + 7 * len(role) + 22
    p.append(
        f'<rect x="{x}" y="{y - 9}" width="14" height="10" fill="#e3e3e3"/>'
        f'<text x="{x + 19}" y="{y}" fill="#444">op execution (coloured: divergent)</text>'
    )
    p.append("</svg>")
    return "".join(p)


def _mark(
    x: float, y: float, r: float, role: str, count: int, title: str, legend: bool = False
) -> str:
    colour = ROLE_COLOURS[role]
    attrs = (
        f'fill="{colour}" stroke="white" stroke-width="0.8"'
        if legend
        else f'class="mark {role.replace(" ", "-")}" data-n="{count}" fill="{colour}" '
        'stroke="white" stroke-width="0.8"'
    )
    inner = f"<title>{html.escape(title)}</title>" if title else ""
    if role == "source":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r * 1.1:.1f}" {attrs}>{inner}</circle>'
    if role == "propagated":
        pts = [(x, y - r * 1.15), (x - r, y + r * 0.75), (x + r, y + r * 0.75)]
    else:
        pts = [(x, y - r * 1.2), (x + r, y), (x, y + r * 1.2), (x - r, y)]
    points = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
    return f'<polygon points="{points}" {attrs}>{inner}</polygon>'


def _mark_title(ms: list[DivergentExecution], worst: DivergentExecution, binned: bool) -> str:
    magnitude = "unknown" if worst.max_ulp is None else f"{worst.max_ulp:.3g}"
    if not binned and len(ms) == 1:
        m = ms[0]
        return f"#{m.position} {m.op_type} ({m.op_name}) — {m.role}, max ULP {magnitude}"
    first, last = ms[0].position, ms[-1].position
    types = sorted({m.op_type for m in ms})
    shown = ", ".join(types[:4]) + (", …" if len(types) > 4 else "")
    return f"#{first}–#{last}: {len(ms)} {ms[0].role} execution(s) of {shown}; max ULP {magnitude}"


def _ticks(n: int) -> list[int]:
    """About eight round execution numbers from 0 to n."""
    if n <= 1:
        return [0]
    raw = n / 8
    base = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
    return list(range(0, n, max(1, int(step))))


def _path_x(report: Report, eager_position: int, n: int) -> int:
    events = report.recordings[0].events
    eager = [i for i, ev in enumerate(events) if ev.call == ev.seq]
    return eager[eager_position] if 0 <= eager_position < len(eager) else n - 1


def _caption(report: Report, marks: list[DivergentExecution], n: int) -> str:
    parts = [
        "Each divergent op execution is marked at its op's max ULP (log scale; the table's "
        f"value), in the order {_reference(report)} executed them."
    ]
    if n > _MAX_SLOTS:
        parts.append(
            f"With {n} executions the picture is binned: a mark stands for the executions of "
            "one role in its bin, at their largest value, and the band's colour is stronger "
            "where more of a bin diverged."
        )
    sources = [m for m in marks if m.role == "source"]
    if sources:
        first = sources[0]
        after = {m.position for m in marks if m.position > first.position}
        parts.append(
            f"The divergence starts at execution #{first.position}, "
            f"<b>{html.escape(first.op_type)}</b> (a source), and reaches "
            f"{len(after)} of the {n - first.position - 1} executions after it."
        )
    if any(m.max_ulp is None for m in marks):
        parts.append(
            "'unknown': not measured (check(quantify=False), the divergence did not recur in "
            "the capture runs, the op is in a function the step calls, whose values the "
            "capture runs do not copy, or the op ran in some runs only)."
        )
    if report.comparison.paths:
        parts.append("Dotted lines: where a run took a different path.")
    return " ".join(parts)


def _reference(report: Report) -> str:
    return "the step" if report.mode == "rerun" else "run 0"
