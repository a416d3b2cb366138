"""Random step-log lines for the tests that compare two ingest paths: the fields of a step besides its drafts and
distributions."""
import numpy as np


def step_envelope(rng: np.random.Generator, obj: dict, g: int, times: list, templates: list) -> None:
    """Add a step's optional fields to obj, each present half the time: ts from `times`, template from
    `templates`, k (at least g), temperature, target_ms and draft_ms."""
    maybe = lambda: rng.random() < 0.5  # noqa: E731
    if maybe():
        obj["ts"] = times[int(rng.integers(len(times)))]
    if maybe():
        obj["template"] = templates[int(rng.integers(len(templates)))]
    if maybe():
        obj["k"] = g + int(rng.integers(0, 3)) if g else int(rng.integers(1, 4))
    for field in ("temperature", "target_ms"):
        if maybe():
            obj[field] = float(rng.uniform(0, 2)) if maybe() else int(rng.integers(0, 5))
    if maybe():
        obj["draft_ms"] = rng.uniform(0, 3, int(rng.integers(0, 4))).tolist() if maybe() else 1.5
