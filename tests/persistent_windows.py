"""Healthy engine windows whose acceptance holds for runs of a few windows, the drift detector watching them with
the floor of a reference that states no rate as its only threshold, and the floor's earlier form, one window's
dispersion (tests/drift/test_window_threshold.py, bench/window_floor.py)."""
import numpy as np

from specmon.drift import calibration, detector

K, ARL0 = 4, 20_000


def persistent_windows(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Healthy windows whose acceptance holds for runs of a geometric number of windows (mean 8): the requests a
    window holds run on into the next ones. Not the floor's own model (no Gaussian increments, no Bartlett shape)."""
    lengths = rng.geometric(1 / 8, count)
    level = np.repeat(rng.beta(0.81 * 60, 0.19 * 60, count), lengths)[:count]
    checked = rng.integers(250, 450, count).astype(float)
    return rng.binomial(checked.astype(int), level).astype(float), checked


def watched_with_the_floor_alone(a: np.ndarray, n: np.ndarray) -> tuple[list, list]:
    """The windows watched from the first REFERENCE_WINDOWS as in use, the reference growing at the checkpoints, the
    CUSUM watching for a drop of 0.10 (c unknown), the floor alone its threshold: the alarms and the designs."""
    ts = np.arange(len(a), dtype=np.int64) * 10_000_000  # 10-second windows
    grow = calibration.redesigner(lambda _: (a, n, ts // 600_000_000, ts), K, None, ARL0, "windows",
                                  lambda *_, **__: 0.0)
    first = detector.REFERENCE_WINDOWS
    _, alarms, designs = detector.detect(a, n, grow(first), first, grow)
    return alarms, designs


def pearson_dispersion(a: np.ndarray, n: np.ndarray, p: float) -> float:
    """Pearson's dispersion of windows' accepted counts about p relative to binomial counts, at least 1: ln(stated
    figure) x this was the floor's earlier form."""
    return max(float(np.sum((a - p * n) ** 2 / (p * (1 - p) * n))) / (len(n) - 1), 1.0)
