"""The repository speaks of the project alone: documentation links resolve inside it, nothing cites files outside
it, and no doc, comment or test tells how the project was developed (rounds, passes, sessions, issue numbers)."""
import re
from pathlib import Path

import pytest
from paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "specmon").rglob("*.md"))]
SOURCES = [*DOCS, *sorted(ROOT.glob("specmon/**/*.py")), *sorted(ROOT.glob("tests/**/*.py")),
           *sorted(ROOT.glob("bench/*.py")), ROOT / "pyproject.toml", ROOT / ".ci" / "run", ROOT / "app.py"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
_ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            r"fourteenth|fifteenth|\d+(?:st|nd|rd|th))")
# How the project was developed, which belongs in git log: "the sixth round", "issue 11's fifth pass", "another
# session", result files named after a pass or a trial, and the notes outside the repository it was built from.
HISTORY = re.compile("|".join([
    rf"\b{_ORDINAL} (?:round|pass|session|trial)\b",
    r"\b(?:round|pass) \d+\b",
    r"\bissues? #?\d+\b",
    r"\b(?:the lead|another helper|other helpers|the helpers?'s?|another agent|other agents|agent's)\b",
    r"\b(?:this|another|an earlier|the previous|the next|a later|each) session\b(?! of its own)",
    r"\b\w+_(?:pass|round|trial)\w*\.json\b",
    r"shared/spec|\.\./shared\b",
]), re.IGNORECASE)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(doc):
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the same page
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{doc.relative_to(ROOT)} links to {target}, which does not exist"
        assert path.is_relative_to(ROOT), f"{doc.relative_to(ROOT)} links outside the repository: {target}"


def test_no_file_speaks_of_how_the_project_was_developed():
    found = [f"{p.relative_to(ROOT)}:{no}: {line.strip()}" for p in SOURCES if p != Path(__file__).resolve()
             for no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1) if HISTORY.search(line)]
    assert not found, "\n".join(found)


def test_the_history_check_finds_what_it_is_for():
    said = ["as measured in the sixth round", "issue 11's fifth pass", "another helper's run", "in this session",
            "docs/drift_study_ninth_pass_trial.json", "see ../shared/spec/math.md", "round 3 of the study"]
    assert all(HISTORY.search(s) for s in said), [s for s in said if not HISTORY.search(s)]
    fine = ["one pass on all its threads", "rounded to the integer", "a child in a session of its own",
            "Streamlit's session state", "issued a warning", "the draft tokens per round"]
    assert not any(HISTORY.search(s) for s in fine), [s for s in fine if HISTORY.search(s)]
