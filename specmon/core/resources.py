"""The files specmon ships inside its package: the dashboard entry, its Streamlit settings, the demo step log, the
model pair, the prompt sets and the step-log schema.

They are found through importlib.resources, so a source checkout, an editable install and an installed wheel all
resolve them the same way, from wherever the package is, never from the working directory. pip unpacks a wheel
into files on disk; these are those files' paths (the model loaders and Streamlit need real paths).
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _on_disk(*parts: str) -> Path:
    found = files("specmon").joinpath(*parts)
    if not isinstance(found, Path):  # a zip import: not how pip installs, and not supported
        raise RuntimeError(f"specmon's {'/'.join(parts)} is not a file on disk ({found}); install specmon with pip")
    return found


UI = _on_disk("ui")  # the dashboard
PAGES = UI / "views"  # its page files (not pages/: Streamlit would list that folder itself)
APP = UI / "app.py"
SERVER = UI / "dashboard_server.py"  # what `specmon serve` runs: APP with a start-up hook
STREAMLIT_CONFIG = UI / "streamlit.toml"
DEMO_LOG = _on_disk("data", "demo_steplog.jsonl")
DEMO_SWEEP = _on_disk("data", "demo_sweep.csv")
MODELS = _on_disk("data", "models")
TARGET_MODEL = MODELS / "target"
DRAFT_MODEL = MODELS / "draft"
PROMPTS = _on_disk("data", "prompts")
STEPLOG_SCHEMA = _on_disk("schema", "steplog.schema.json")
PROMPT_SETS = sorted(p.stem for p in PROMPTS.glob("*.jsonl"))  # copy: repeat or edit a text; open: open-ended code


def prompt_file(name_or_path: str) -> str:
    """A shipped prompt set by name (`copy`, `open`), wherever specmon is installed; anything else is a path."""
    return str(PROMPTS / f"{name_or_path}.jsonl") if name_or_path in PROMPT_SETS else name_or_path
