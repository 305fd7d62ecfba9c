"""Every timing or result figure README.md and docs/ quote has a recorded run behind it (#31, item 1).

A *quoted figure* is a number with a time unit (``31 s``, ``302 ms``, ``1.5-4 s``, ``24 min``) in a
sentence that reports a measurement (took, takes, ran, measured, p50, p99, median, latency,
throughput, wall, real time, elapsed). Parameters and targets are not quoted figures: a figure
after ``=``, ``<=``, ``>=``, ``<``, ``>``, "under", "within", "every", "up to" or "target", in a table's
header row, or in a fenced block.

A figure is *recorded* when its value and unit (each end of a range) appear in a record:

* a **record section** of a page of docs/ (README.md only quotes): a ``##`` section that names a date (``YYYY-MM-DD``), the
  machine (the word "machine") and the command it ran (in backticks: ``python ...``,
  ``replistream ...``, ``pytest ...``), as docs/benchmarks.md's sections do; or
* a **record file** ``docs/experiments/*.json`` with ``date``, ``machine``, ``load``, ``command``
  and ``figures`` (name -> the figure as quoted, e.g. ``"279 s"``).

A figure outside a record section must match a record: the one its paragraph cites
(``docs/experiments/<name>.json`` or a page such as ``docs/benchmarks.md``: its record sections),
or else a record section of its own page or a record file.
Figures that still lack a record are listed in :data:`KNOWN_UNRECORDED` (each with where it stands);
the list only shrinks: an entry whose figure is gone or now recorded fails too, so it is removed.
:data:`NOT_RESULTS` names the few numbers in a measurement's sentence that are parameters or the
paper's figures.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RECORD_FILES = sorted((ROOT / "docs" / "experiments").glob("*.json"))

NUM = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.\-/^=<>≤≥])({NUM})(?:\s?(?:-|–)\s?({NUM}))?\s?(ms|s|min|h)\b(?![-/'])")
MEASURED = re.compile(r"\b(took|takes|take|ran|runs? in|measured|p50|p99|median|latency|latencies|wall|"
                      r"real time|throughput|elapsed)\b", re.I)
NOT_QUOTED_BEFORE = re.compile(r"(=|<|>|≤|≥|\bunder|\bwithin|\bevery|\btarget|\bup\s+to|\bafter\s+idle)\s*(of\s+)?~?$",
                               re.I)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMAND = re.compile(r"`(?:python|replistream|pytest|\.venv|py-spy|/usr/bin/time)[^`]*`")
CITES_FILE = re.compile(r"docs/experiments/([\w.\-]+\.json)")
CITES_PAGE = re.compile(r"docs/(\w+)\.md")
RECORD_KEYS = ("date", "machine", "load", "command", "figures")

#: (page, figure): quoted figures without a record yet, and why they stand. Only ever shrinks.
KNOWN_UNRECORDED: dict[tuple[str, str], str] = {
    # empty since 2026-11-26: the last ten (docs/handover.md, reliability.md, placement.md,
    # experiments.md) were measured again by bench/records.py and cite their record files
}

#: (page, figure): numbers with a time unit in a measurement's sentence that are not results: a
#: model's parameters and the paper's own figures.
NOT_RESULTS: dict[tuple[str, str], str] = {
    ("docs/experiments.md", "1-20 min"): "the trace model's outage lengths (a parameter)",
    ("docs/experiments.md", "12 h"): "the trace model's mean time between outages (a parameter)",
    ("docs/experiments.md", "16 s"): "the paper's claim about random kmax = 3 (Fig. 4), quoted",
    ("docs/sim.md", "2 ms"): "the latency model's fixed overhead (a parameter)",
    ("docs/placement.md", "600 s"): "the length of the reference run it describes (a parameter)",
    ("README.md", "30 s"): "the demo's input length (a parameter)",
}


def strip_code(text: str) -> str:
    """Text without fenced blocks (commands and code). Inline code stays: a verdict quoted in
    backticks quotes figures too."""
    return re.sub(r"(?ms)^```.*?^```", "", text)


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) per ``##`` section (its ``###`` subsections included); ``(top)`` first."""
    parts = re.split(r"(?m)^(## .*)$", text)
    return [("(top)", parts[0])] + [(parts[i], parts[i] + "\n" + parts[i + 1]) for i in range(1, len(parts), 2)]


def is_record_section(body: str) -> bool:
    return bool(DATE.search(body)) and "machine" in body.lower() and bool(COMMAND.search(body))


def holds_records(page: str) -> bool:
    """README.md quotes and never records: every figure in it must match a record in docs/."""
    return Path(page).name != "README.md"


def quoted_figures(body: str) -> list[tuple[str, tuple[tuple[str, str], ...], str]]:
    """(figure text, ((number, unit), ...), paragraph) of every quoted figure in ``body``."""
    out = []
    for para in re.split(r"\n\s*\n", body):
        lines = para.split("\n")
        headers = {i for i, line in enumerate(lines[:-1]) if line.startswith("|") and re.match(r"\|\s*:?-", lines[i + 1])}
        kept = "\n".join(line for i, line in enumerate(lines) if i not in headers)
        plain = strip_code(kept)
        for sentence in re.split(r"(?<=[.;])\s+|\n(?=\|)", plain):
            if not MEASURED.search(sentence):
                continue
            for m in FIGURE.finditer(sentence):
                if NOT_QUOTED_BEFORE.search(sentence[:m.start()]):
                    continue
                values = tuple((n.replace(",", ""), m.group(3)) for n in (m.group(1), m.group(2)) if n)
                out.append((m.group(0), values, para))
    return out


def figures_in(text: str) -> set[tuple[str, str]]:
    """Every (number, unit) in ``text``, range ends one by one."""
    return {(n.replace(",", ""), m.group(3)) for m in FIGURE.finditer(text) for n in (m.group(1), m.group(2)) if n}


def load_records(files=RECORD_FILES) -> dict[str, dict]:
    """The record files: ``docs/experiments/*.json`` that carry ``figures``."""
    out = {}
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and "figures" in data:
            out[f.name] = data
    return out


def record_corpus(pages: dict[str, str], records: dict[str, dict]) -> dict[str, set]:
    """Recorded (number, unit) pairs per source: ``page.md`` (its record sections) and ``file.json``."""
    corpus: dict[str, set] = {}
    for name, text in pages.items():
        corpus[Path(name).name] = set().union(*[figures_in(body) for _, body in sections(text)
                                                if holds_records(name) and is_record_section(body)] or [set()])
    for name, data in records.items():
        corpus[name] = set().union(*[figures_in(str(v)) for v in data["figures"].values()] or [set()])
    return corpus


def unrecorded(pages: dict[str, str], records: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(page, figure, paragraph) of every quoted figure without a record."""
    corpus = record_corpus(pages, records)
    files = set().union(*[corpus[f] for f in records]) if records else set()
    missing = []
    for name, text in pages.items():
        own = corpus.get(Path(name).name, set()) | files  # the page's own record sections, the record files
        for _, body in sections(text):
            if holds_records(name) and is_record_section(body):
                continue
            for fig, values, para in quoted_figures(body):
                cited = [corpus.get(f, set()) for f in CITES_FILE.findall(para)] or \
                        [corpus.get(f"{p}.md", set()) for p in CITES_PAGE.findall(para) if f"{p}.md" in corpus]
                pool = set().union(*cited) if cited else own
                if not all(v in pool for v in values):
                    missing.append((name, fig, " ".join(para.split())[:160]))
    return missing


def repo_pages() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}


# -- the checks ----------------------------------------------------------------------------------

def test_every_quoted_figure_has_a_record():
    missing = [(page, fig, para) for page, fig, para in unrecorded(repo_pages(), load_records())
               if (page, fig) not in KNOWN_UNRECORDED and (page, fig) not in NOT_RESULTS]
    assert not missing, "quoted figures without a recorded run (add a record to docs/experiments/*.json or a " \
                        "dated section with machine and command, or write a ratio):\n" + \
                        "\n".join(f"  {page}: {fig!r} in: {para}" for page, fig, para in missing)


def test_the_known_unrecorded_list_only_shrinks():
    still = {(page, fig) for page, fig, _ in unrecorded(repo_pages(), load_records())}
    gone = sorted(set(KNOWN_UNRECORDED) - still)
    assert not gone, f"recorded or removed since: drop them from KNOWN_UNRECORDED: {gone}"


@pytest.mark.parametrize("name", sorted(load_records()))
def test_every_record_names_date_machine_load_and_command(name):
    data = load_records()[name]
    missing = [k for k in RECORD_KEYS if not data.get(k)]
    assert not missing, f"docs/experiments/{name} lacks {missing}"
    assert DATE.search(str(data["date"])), f"docs/experiments/{name}: date {data['date']!r} is not YYYY-MM-DD"
    assert all(re.search(r"\d", str(v)) for v in data["figures"].values()), f"{name}: a figure without a number"


def test_the_check_fails_on_a_figure_without_a_record_and_passes_with_one():
    page = {"README.md": "## Speed\n\n`replistream sim fig4 --quick` took 31 s here.\n"}
    assert [fig for _, fig, _ in unrecorded(page, {})] == ["31 s"]
    record = {"date": "2026-11-26", "machine": "2-core", "load": "0.1", "command": "replistream sim fig4 --quick",
              "figures": {"fig4 --quick": "31 s"}}
    assert unrecorded(page, {"r.json": record}) == []
    other = {"README.md": "## Speed\n\nIt took 31 s (docs/experiments/q.json).\n"}  # cites another record
    assert [fig for _, fig, _ in unrecorded(other, {"r.json": record, "q.json": {**record, "figures": {}}})] == ["31 s"]
    ranged = {"README.md": "## Start\n\nThe first deploy took 1.5-4 s.\n"}
    assert [fig for _, fig, _ in unrecorded(ranged, {"r.json": {**record, "figures": {"a": "1.5 s"}}})] == ["1.5-4 s"]


def test_parameters_and_targets_are_not_quoted_figures():
    text = ("## Run\n\nThe target p99 <= 200 ms was met. With idle_timeout=0.5 s the latency stays low. "
            "A heartbeat every 10 s keeps the wall clock honest. The span doubles up to 1 s while latency grows.\n\n| mean latency 40-60 s | n |\n|---|---|\n| 1 | 2 |\n")
    assert quoted_figures(text) == []


def test_a_figure_in_the_readme_must_match_a_record_even_in_a_dated_section():
    readme = {"README.md": "## Set up\n\nOn 2026-11-26 `python -m pytest` took 300 s on this machine.\n"}
    assert [fig for _, fig, _ in unrecorded(readme, {})] == ["300 s"]
    page = {"docs/x.md": readme["README.md"]}  # the same section in docs/ is a record itself
    assert unrecorded(page, {}) == []


def test_a_dated_section_with_machine_and_command_is_a_record():
    body = "On 2026-11-26, this machine, `python bench/core.py` took 5.2 s."
    assert is_record_section(body) and not is_record_section(body.replace("2026-11-26", "today"))
