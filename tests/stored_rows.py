"""Comparing what two ingest paths stored: every column of steps and positions, floats to 1e-12."""
import math

from specmon.store.database import Store


def stored(db: str) -> tuple[list, list]:
    """Every stored step and position, in id order; an inferred ts (the ingest time) as NULL, since two ingests
    infer different times."""
    with Store(db) as s:
        steps = s.query("SELECT * EXCLUDE (ingest_id, ts), CASE WHEN ts_inferred THEN NULL ELSE ts END "
                        "FROM steps LEFT JOIN step_details USING (step_id) "
                        "ORDER BY step_id")
        positions = s.query("SELECT * FROM positions ORDER BY step_id, position")
    return steps, positions


def same(a, b) -> bool:
    """Equal, floats (also inside lists and rows) to 1e-12."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b
