"""Writes the table of refusal reason codes in docs/metrics.md from the package `model/reasons/`
(the `Code` enum of `model/reasons/codes.py` with its group comments, each code's `Category`,
its reason class, found among the names the package re-exports, and that class's docstring),
so the list is never typed by hand.

Run from the repository root:
    PYTHONPATH=$PWD .venv/bin/python tools/reason-codes.py          # rewrite the table
    PYTHONPATH=$PWD .venv/bin/python tools/reason-codes.py --check  # exit 1 if it is stale
The table sits between the `reason-codes:begin` and `reason-codes:end` comments. A code
marked ✱ can be the `reason` label of `gpu_binder_decisions_total`: its reason class is
built, as a set-level reason, in `model/decide.py` or `actors/reservation.py`.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import model.reasons as R
from k8s.webhook.review import STATUS

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
BEGIN, END = "<!-- reason-codes:begin", "<!-- reason-codes:end -->"


def table() -> str:
    groups: dict[R.Code, str] = {}
    group = ""
    for line in inspect.getsource(R.Code).splitlines():
        if m := re.match(r"\s+# (.*)", line):
            group = m.group(1)
        elif m := re.match(r"\s+([A-Z_]+) = \"", line):
            groups[R.Code[m.group(1)]] = group
    classes = {obj.code: obj for obj in vars(R).values()
               if isinstance(obj, type) and issubclass(obj, R.Reason)
               and isinstance(obj.__dict__.get("code"), R.Code)}
    binder_src = Path("model/decide.py").read_text() + Path("actors/reservation.py").read_text()
    built = set(re.findall(r"\b([A-Z][A-Za-z]+)\(", binder_src))
    node_group = groups[R.Code.NODE_GONE]
    rows = ["| code | category (W1 denial status) | reason class | what it means |",
            "|---|---|---|---|"]
    last = None
    for code in R.Code:
        if groups[code] != last:
            last = groups[code]
            rows.append(f"| **{last}** | | | |")
        cls = classes[code]
        mark = " ✱" if cls.__name__ in built and groups[code] != node_group else ""
        status = STATUS[code.category][0]
        doc = " ".join((cls.__doc__ or "").split()).replace("|", "\\|")
        rows.append(f"| `{code.value}`{mark} | {code.category.value} ({status}) "
                    f"| `{cls.__name__}` | {doc} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    marker, rest = rest.split("\n", 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}{marker}\n{table()}{END}{tail}"
    if "--check" in argv:
        if new != text:
            print(f"{DOC}: the reason-code table is stale; run tools/reason-codes.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
