"""The README's quick start runs as written, on CPU tensors, and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import kvdispatch

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start() -> str:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quick_start_runs_as_written(monkeypatch):
    monkeypatch.delenv("KVDISPATCH_BACKEND", raising=False)  # as a user runs it: the suite may force one
    kvdispatch.reset()
    code = quick_start()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md quick start", "exec"), {"__name__": "quick_start"})
    lines = printed.getvalue().splitlines()
    comments = re.findall(r"print\(.*\)\s+# (.*)", code)
    assert lines[0] == comments[0]  # the page table, exactly
    first, last = comments[1].split(", ..., ")  # the CSR, elided in the middle
    assert lines[1].startswith(first) and lines[1].endswith(last)
    assert lines[2] in ("torch", "triton", "cupy")
