"""The report as terminal text (tabulate)."""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from nddebug.timeline import sparkline

if TYPE_CHECKING:
    from nddebug.report import Report

_TABLE = [
    ("op_type", "op"),
    ("role", "role"),
    ("kind", "kind"),
    ("location", "created at"),
    ("runs_differing", "runs≠"),
    ("distinct_outputs", "distinct"),
    ("max_abs_diff", "max |Δ|"),
    ("max_ulp", "max ULP"),
    ("rel_diff", "rel |Δ|"),
]
MAX_ROWS = 25
RELATIVE_NOTE = (
    "rel |Δ| = max |Δ| / max |x|, the difference against the output's largest value; sources "
    "are sorted by it (float32 rounding is about 1e-7, float16 1e-3, bfloat16 1e-2)"
)


def fmt_number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def short_location(location: str, width: int = 44) -> str:
    if len(location) <= width:
        return location
    return "…" + location[-(width - 1) :]


def render(report: Report) -> str:
    if report.as_compiled is not None:
        return "\n\n".join(
            [
                "== The step as compiled (XLA on), as you run it ==",
                _render(report.as_compiled),
                "== The same step with XLA off, to name the ops ==",
                _render(report),
            ]
        )
    return _render(report)


def _render(report: Report) -> str:
    s = report.summary
    if s["mode"] == "rerun" and s["runs"] < 2:  # nothing re-executed (see not_compared)
        head = (
            f"nddebug: {s['verdict']} — one step, no op re-executed, {s['ops_traced']} ops traced"
        )
    elif s["mode"] == "rerun":
        head = (
            f"nddebug: {s['verdict']} — one step, each stateless op executed {s['runs']} times "
            f"on the same inputs, {s['ops_traced']} ops traced, "
            f"{s['op_executions_per_run']} op executions"
        )
    else:
        head = (
            f"nddebug: {s['verdict']} — {s['runs']} runs, {s['ops_traced']} ops traced, "
            f"{s['op_executions_per_run']} op executions per run"
        )
    lines = [
        head,
        f"  mode: {s['mode']} ({report.mode_note})" if report.mode_note else f"  mode: {s['mode']}",
        f"  TensorFlow {s['tensorflow']} on {s['devices'] or '?'}; "
        f"op determinism {'on' if s['op_determinism'] else 'off'}",
    ]
    if report.errors and not s["runs"]:
        lines.append("  The step could not run to the end: nothing was compared.")
    elif not report.comparison.executions:
        lines.append("  Nothing was compared (see below).")
    elif report.ok:
        lines.append("  Every traced op produced bitwise-identical outputs in every run.")
    elif not report.comparison.findings and not report.comparison.paths:
        lines.append("  No traced op differed between the runs.")
    else:
        lines.append(
            f"  {s['sources']} source op(s), {s['propagated']} propagated, "
            f"{s['control_flow']} op(s) that ran in some runs only"
        )
    for e in report.errors:
        lines += [f"  raises: {e.summary}.", *_wrap("  error: ", e.message)]
        lines += _wrap("  instead: ", e.fix)
    fd = report.first_divergence
    if fd is not None and fd.steps > 1:  # one step: the table below says it all
        lines += _wrap("", fd.sentence())
        counts = report.timeline
        if len(counts) > 1:
            lines.append(
                f"  steps 1…{len(counts)}: {sparkline(counts)}  (divergent op executions per step)"
            )
    # What the runs could not show, and what was not covered, belong next to the verdict.
    for note in report.verdict_notes:
        lines += _wrap("note: ", note)
    lines += [f"  warning: {w}" for w in report.warnings]
    for item in report.blind_spots:
        lines += _wrap("not compared: ", item)
    for p in report.comparison.paths:
        lines.append(
            f"  Run {p.run} took a different path at top-level op #{p.position}: "
            f"{p.reference_op} in run 0, {p.other_op} in run {p.run}"
        )
    df = report.own_culprits
    if len(df):
        shown = df.head(MAX_ROWS)
        table = [[cell(row, c) for c, _ in _TABLE] for _, row in shown.iterrows()]
        lines += ["", tabulate(table, headers=[h for _, h in _TABLE], tablefmt="simple")]
        if len(df) > MAX_ROWS:
            lines.append(f"  … and {len(df) - MAX_ROWS} more (report.culprits has them all)")
        if df["rel_diff"].notna().any():
            lines.append(f"  {RELATIVE_NOTE}")
        sources = df[df["role"] == "source"]
        for _, row in sources.iterrows():
            lines += [
                "",
                f"Source: {row['op_type']} ({row['op_name'].strip('()')}) — {row['kind']}",
                *(
                    [f"  created at {row['location'] or '?'} on {row['device'] or '?'}"]
                    if row["location"] or row["device"]
                    else []  # a pseudo-op (a folded step): no one place made it
                ),
                *_wrap("size: ", _size(row)),
                *_wrap("why: ", row["explanation"]),
                *_wrap("known: ", _known(row)),
                *_wrap("evidence: ", row["evidence"]),
                *_wrap("fix: ", row["fix"]),
            ]
    return "\n".join(lines)


def cell(row: Any, column: str, width: int | None = 44) -> str:
    """One table cell as text; ``width`` shortens locations (None: keep them whole)."""
    if row["op_type"] == "VariableState":  # a variable's value after the step, not an op
        if column == "op_type":
            return f"{row['op_name']} (value after step)"
        if column == "location":
            return ""
    if column == "location":
        return short_location(str(row[column]), width) if width else str(row[column])
    return fmt_number(row[column])


def _size(row: Any) -> str:
    """The divergence in words, relative figure first ("" when it was not measured)."""
    rel = row["rel_diff"]
    if rel is None or rel != rel:
        why = row.get("unmeasured") if hasattr(row, "get") else ""
        return f"not measured: {why}" if why else ""
    return (
        f"max |Δ| {fmt_number(row['max_abs_diff'])} against the output's max |x| "
        f"{fmt_number(row['scale'])}: {fmt_number(rel)} of its scale "
        f"(max ULP {fmt_number(row['max_ulp'])})"
    )


def _known(row: Any) -> str:
    """The knowledge-base line, without repeating the mechanism already given as "why"."""
    known = str(row["known_cause"])
    api, _, mechanism = known.partition(": ")
    return api if mechanism and mechanism in str(row["explanation"]) else known


def _wrap(prefix: str, text: str) -> list[str]:
    if not text:
        return []
    return textwrap.wrap(
        text, width=100, initial_indent="  " + prefix, subsequent_indent="  " + " " * len(prefix)
    )
