"""docs/contract.md is the contract every rule id in the repository cites: each id cited in
the Python of the packages, tests and tools, or in README.md and docs/, has exactly one heading
there (`### B3: eligible node`), each `§N` and `§7.N` cited has its section or invariant, and
every link into the page lands on a heading. Adding a rule means adding its heading (and its id
to `RULE_IDS` below) in the same commit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "docs" / "contract.md"
# where rule ids are cited: the packages, the tests and tools (Python), and the docs
PY_ROOTS = ("model", "actors", "supervisor", "k8s", "cli", "localcluster", "fakes", "bench",
            "tests", "tools")
MD_FILES = ("README.md", "docs/*.md", "*/README.md")

# Every rule of the contract, by id: B1-B8 binding, D1-D5 defragmentation, DR1-DR6 device mode,
# W1-W7 admission, H1-H4 housekeeping.
RULE_IDS = frozenset([*(f"B{i}" for i in range(1, 9)), *(f"D{i}" for i in range(1, 6)),
                      *(f"DR{i}" for i in range(1, 7)), *(f"W{i}" for i in range(1, 8)),
                      *(f"H{i}" for i in range(1, 5))])
SECTIONS = frozenset(["1", "2", "3", "3a", "3b", "3c", "4", "5", "6", "7"])
INVARIANTS = frozenset(["7.1", "7.2", "7.3", "7.4", "7.5"])

# A rule id as cited: `B3`, `DR4`, `H1-H3` (both ends), `B5a` (part a of B5). One or two digits
# and word boundaries, so GPU model names (`H100`, `GH100_H100`), hex (`0xD1`) and identifiers
# (`sha256`, `B1_refusal`) do not count.
CITED_RULE = re.compile(r"\b((?:DR|[BDWH])[0-9]{1,2})[a-z]?\b")
CITED_SECTION = re.compile(r"§ ?([0-9][a-z]?)(?:\.([0-9]+))?")
RULE_HEADING = re.compile(r"^### ((?:DR|[BDWH])[0-9]+): \S", re.M)
SECTION_HEADING = re.compile(r"^## §([0-9][a-z]?) \S", re.M)
INVARIANT_HEADING = re.compile(r"^### (7\.[0-9]+) \S", re.M)
LINK_TO_CONTRACT = re.compile(r"\]\((?:[\w./]*/)?contract\.md#([^)\s]+)\)")
LINK_INSIDE = re.compile(r"\]\(#([^)\s]+)\)")


def sources() -> list[Path]:
    """Every file whose rule ids must resolve: `*.py` under `PY_ROOTS`, and `MD_FILES`; not
    this file, whose checker examples cite missing ids on purpose."""
    out = [p for root in PY_ROOTS for p in (REPO / root).rglob("*.py")
           if "__pycache__" not in p.parts and p != Path(__file__).resolve()]
    out += [p for pattern in MD_FILES for p in REPO.glob(pattern)]
    return sorted(set(out))


def citations(text: str) -> set[str]:
    """The rule ids, sections (`3a`) and invariants (`7.2`) `text` cites."""
    got = {m.group(1) for m in CITED_RULE.finditer(text)}
    for m in CITED_SECTION.finditer(text):
        got.add(f"{m.group(1)}.{m.group(2)}" if m.group(1) == "7" and m.group(2) else m.group(1))
    return got


def defined(doc: str) -> list[str]:
    """What the contract page defines, in order, repeats kept: rule ids, sections, invariants."""
    return ([m.group(1) for m in RULE_HEADING.finditer(doc)]
            + [m.group(1) for m in SECTION_HEADING.finditer(doc)]
            + [m.group(1) for m in INVARIANT_HEADING.finditer(doc)])


def unresolved(cited: dict[Path, set[str]], doc: str) -> dict[str, list[str]]:
    """Each cited id the page does not define, with the files (relative) that cite it."""
    have = set(defined(doc))
    out: dict[str, list[str]] = {}
    for path, ids in cited.items():
        for rid in sorted(ids - have):
            out.setdefault(rid, []).append(str(path.relative_to(REPO)) if path.is_absolute()
                                           else str(path))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: str) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", doc, re.M)}


def test_every_rule_id_cited_in_code_tests_and_docs_has_its_heading_in_the_contract():
    doc = CONTRACT.read_text(encoding="utf-8")
    files = sources()
    assert len(files) > 100, "the scan found too few files: is REPO right?"
    cited = {p: citations(p.read_text(encoding="utf-8")) for p in files}
    cited_rules = set().union(*cited.values()) & RULE_IDS
    assert {"B1", "B7", "W1", "W7", "H2", "D3"} <= cited_rules   # the scan sees real citations
    assert unresolved(cited, doc) == {}


def test_the_contract_defines_every_rule_section_and_invariant_exactly_once():
    got = defined(CONTRACT.read_text(encoding="utf-8"))
    repeated = sorted({x for x in got if got.count(x) > 1})
    assert repeated == []
    assert set(got) == RULE_IDS | SECTIONS | INVARIANTS


def test_every_link_into_the_contract_lands_on_a_heading():
    doc = CONTRACT.read_text(encoding="utf-8")
    have = anchors(doc)
    links = {(CONTRACT.name, a) for a in LINK_INSIDE.findall(doc)}
    for p in sources():
        if p.suffix == ".md":
            links |= {(str(p.relative_to(REPO)), a) for a in LINK_TO_CONTRACT.findall(p.read_text())}
    assert len(links) >= 10
    assert sorted((f, a) for f, a in links if a not in have) == []


def test_the_not_yet_implemented_rules_say_so_under_their_heading():
    doc = CONTRACT.read_text(encoding="utf-8")
    # device mode is built, with limits its section names; nothing calls it unimplemented
    body = doc.split("## §3b Device mode: DR1–DR6", 1)[1].lstrip()
    assert body.startswith("**Implemented, with limits.**")
    limits = " ".join(body.split("### DR1", 1)[0].split("Limits today:", 1)[1].split())
    for limit in ("greedily", "re-pointing", "no DRA driver runs"):
        assert limit in limits, limit
    for gone in ("B5's", "defragmentation leaves device-mode"):  # built since (B5b, §3a)
        assert gone not in limits, gone
    assert "Defragmentation\n(§3a) covers device-mode classes" in doc
    assert "not implemented" not in doc.split("## §4", 1)[0].split("## §3b", 1)[1]
    # H4 is built (count and device mode): its heading says so, and nothing calls it unimplemented
    body = doc.split("### H4: a VM keeps its set", 1)[1].lstrip()
    assert body.startswith("**Implemented (count and device mode).**")
    assert "H4 are specified" not in doc and "and H4 are specified" not in (
        REPO / "README.md").read_text(encoding="utf-8")


# The checker itself: it fails on what it must catch, and not on what is no citation.

DOC = """## §7 Invariants
### B1: gather or refuse
### 7.1 no node over
"""


@pytest.mark.parametrize("text, want", [
    ("gather or refuse (B1), see also B9", {"B9": ["x.py"]}),
    ("DESIGN §7.1 and §7.6", {"7.6": ["x.py"]}),
    ("§3a D1-D5", {"3a": ["x.py"], "D1": ["x.py"], "D5": ["x.py"]}),
    ("B5a, the first cordon case", {"B5": ["x.py"]}),
    ("nvidia.com/GH100_H100 on an H100, uuid 0xD1, test_B1_refusal", {}),
    ("B1 and §7.1", {}),
])
def test_the_checker_reports_ids_missing_from_the_page(text, want):
    assert unresolved({Path("x.py"): citations(text)}, DOC) == want


def test_the_checker_sees_a_rule_defined_twice():
    got = defined(DOC + "### B1: again\n")
    assert [x for x in got if got.count(x) > 1] == ["B1", "B1"]


def test_slugs_are_githubs():
    assert slug("§3b Device mode: DR1–DR6") == "3b-device-mode-dr1dr6"
    assert slug("B3: eligible node") == "b3-eligible-node"
