"""The report as self-contained HTML, for Jupyter and for saving as a page."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from nddebug.render.text import cell

if TYPE_CHECKING:
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
    ("known_cause", "known cause"),
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
.nddebug .note {color: #666}
</style>
"""


def render(report: Report) -> str:
    s = report.summary
    cls = "verdict-ok" if report.ok else "verdict-bad"
    parts = [
        _STYLE,
        '<div class="nddebug">',
        f'<h3 class="{cls}">nddebug: {html.escape(s["verdict"])}</h3>',
        "<p>"
        f"{s['runs']} runs · {s['ops_traced']} ops traced · {s['op_executions_per_run']} "
        f"executions per run · {s['sources']} source(s), {s['propagated']} propagated · "
        f"TensorFlow {html.escape(str(s['tensorflow']))} on {html.escape(s['devices'])} · "
        f"op determinism {'on' if s['op_determinism'] else 'off'}</p>",
        f'<p class="note">mode: {html.escape(s["mode"])} — {html.escape(report.mode_note)}</p>',
    ]
    for w in report.warnings:  # what was not covered belongs next to the verdict
        parts.append(f'<p class="note">warning: {html.escape(w)}</p>')
    for p in report.comparison.paths:
        parts.append(
            f"<p>Run {p.run} took a different path at top-level op #{p.position}: "
            f"{html.escape(p.reference_op)} vs {html.escape(p.other_op)}</p>"
        )
    df = report.culprits
    if len(df):
        head = "".join(f"<th>{html.escape(h)}</th>" for _, h in _COLUMNS)
        body = []
        for _, row in df.iterrows():
            cells = "".join(f"<td>{html.escape(cell(row, c, None))}</td>" for c, _ in _COLUMNS)
            body.append(f'<tr class="{html.escape(row["role"].replace(" ", "-"))}">{cells}</tr>')
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    parts.append("</div>")
    return "\n".join(parts)
