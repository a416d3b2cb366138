"""A live run's inputs, read and checked without loading torch: the prompts, and that a model path given as a local
directory exists. A mistyped argument is then reported at once, not after the seconds torch and transformers take
to import."""
from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from specmon.core.faults import SpecmonError


def read_prompts(path: str) -> list[str]:
    """One prompt per JSON line ({"prompt": ...}) or, for a .txt file, prompts separated by blank lines."""
    p = Path(path)
    if not p.is_file():
        raise SpecmonError(f"{path}: no such prompt file")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".jsonl":
        prompts = [orjson.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    else:
        prompts = [block.strip("\n") for block in text.split("\n\n") if block.strip()]
    if not prompts:
        raise SpecmonError(f"{path}: no prompts in the file")
    return prompts


def check_pair(target: str, draft: str | None) -> None:
    """Refuse a target or draft (None: the n-gram proposer) given as a local path that does not exist. A hub name is
    "org/model"; anything that looks like a file path must exist here."""
    for path, role in ((target, "target"), (draft, "draft")):
        if path is None:
            continue
        looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1
        if looks_local and not Path(path).expanduser().exists():
            raise SpecmonError(f"--{role} {path}: no such model directory")


def int_list(text: str) -> list[int]:
    """"1,2,4" as [1, 2, 4]: a sweep's batch sizes or draft lengths (argparse's type; their range is checked where
    they are used, with the option's name)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values
