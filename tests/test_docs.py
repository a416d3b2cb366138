"""Documentation points only inside the repository: every relative Markdown link resolves, and no file cites the
spec folder the project was built from (it is not part of the repository)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "specmon").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(doc):
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the same page
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{doc.relative_to(ROOT)} links to {target}, which does not exist"
        assert path.is_relative_to(ROOT), f"{doc.relative_to(ROOT)} links outside the repository: {target}"


def test_no_file_cites_the_spec_folder_outside_the_repository():
    sources = [*ROOT.glob("specmon/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("bench/*.py"), *DOCS]
    cited = [str(p.relative_to(ROOT)) for p in sources if p != Path(__file__).resolve()
             and re.search(r"shared/spec|formats\.md", p.read_text(encoding="utf-8"))]
    assert not cited
