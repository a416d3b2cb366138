"""The README's set-up commands are the ones CI runs."""
from paths import ROOT


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"\n{ci_command}\n" in readme
