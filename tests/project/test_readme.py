"""The README's set-up commands are the ones CI runs."""
from paths import ROOT


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"\n{ci_command}\n" in readme


def test_the_monitoring_commands_parse_as_written():
    """The README's "Connect specmon to your monitoring" commands are ones specmon's own parser accepts."""
    import shlex

    from specmon.cli.main import build_parser

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Connect specmon to your monitoring", 1)[1].split("\n## ", 1)[0]
    commands = [line.split(" > ")[0] for line in section.splitlines() if line.startswith("specmon ")]
    assert len(commands) == 4
    for command in commands:
        args = build_parser().parse_args(shlex.split(command)[1:])
        assert callable(args.func), command
