"""The README opens with the two set-up commands, and CI runs exactly the second one."""

from __future__ import annotations

import os
import re

from tests.helpers import ROOT


def _readme_commands() -> list[str]:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block, "the README must open with a bash block of set-up commands"
    assert text.index("```bash") < text.index("\n## "), "the commands come before any section"
    return [line for line in first_block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands_using_the_venv() -> None:
    demo, tests = _readme_commands()
    for command in (demo, tests):
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install")
    assert demo.endswith("-m nddebug.demo")
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command_and_nothing_else() -> None:
    script = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    lines = [
        line
        for line in script.splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))
    ]
    assert lines == [_readme_commands()[1]]


def test_api_md_names_every_keyword_check_takes_for_itself() -> None:
    """A step's own keyword named like one of check()'s never reaches it: api.md said six,
    check() takes ten (probe round 44, F4: a step's mode="train" raised "mode must be
    'repeat' or 'rerun'", and rerun=3 was swallowed)."""
    import inspect

    from nddebug import check

    taken = [
        p.name
        for p in inspect.signature(check).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    api = open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8").read()
    row = next(line for line in api.splitlines() if line.startswith("| `*args`, `**kwargs`"))
    missing = [name for name in taken if f"`{name}`" not in row]
    assert len(taken) >= 10 and not missing, missing
