"""Which of the drift study's references the spread test (calibration.spread_z) can reach: replays every false-alarm,
delay and river window's stream with the study's own seeds (bench/drift_study.py) and prints, per cell, the least spread
test z (calibration.spread_z) over the references of SPREAD_TEST_STEPS steps or more its checkpoints can take. A cell
whose least z is at least calibration.SPREAD_Z is calibrated exactly as before the test existed. The river part's delay
streams are drawn after river's own detectors and are not replayed.

    nice python bench/drift_spread_check.py      # about 30 s
"""
from __future__ import annotations

import numpy as np
import streams
from drift_study import DELAY_PARTS, KS, LENGTHS, P0, P_DROP, RHOS

from specmon.drift import calibration, detector


def least_z(a: np.ndarray, c: np.ndarray, req: np.ndarray, top: int, step: int = 1000) -> float:
    """The least spread test over the stream's first SPREAD_TEST_STEPS, + step, ... steps, up to top."""
    return min(calibration.spread_z(a[:size], c[:size], req[:size])
               for size in range(calibration.SPREAD_TEST_STEPS, min(top, len(a)) + 1, step))


def main() -> None:
    top = 16 * detector.REFERENCE_STEPS * 2  # past the largest checkpoint, so a deferred one is covered too
    for arl0, windows in ((2000, 40), (20_000, 30)):
        for rho in RHOS:
            rng = np.random.default_rng([arl0, round(rho * 100)])
            for lengths in LENGTHS:
                for k in (KS if arl0 == 2000 else (4,)):
                    z = min(least_z(*streams.steps(rng, detector.REFERENCE_STEPS + 10 * arl0, P0, k, rho, lengths), top)
                            for _ in range(windows))
                    rng.integers(0, windows, (2000, windows))  # the cell's bootstrap, as false_alarm_cell draws it
                    print(f"false alarms, stated {arl0:,}, correlation {rho}, {lengths}, k = {k}: least z {z:.1f}")
    for rho in (0.05, 0.2):
        rng = np.random.default_rng([2029, round(rho * 100)])
        for lengths in LENGTHS:
            z = min(least_z(*streams.steps(rng, detector.REFERENCE_STEPS + 20_000, P0, 4, rho, lengths, "two-point"),
                            top) for _ in range(150))
            rng.integers(0, 150, (2000, 150))
            print(f"false alarms, two-point, correlation {rho}, {lengths}: least z {z:.1f}")
    for part, (rhos, _, part_lengths, seed) in DELAY_PARTS.items():
        rng = np.random.default_rng(seed)
        for rho in rhos:
            for lengths in part_lengths:
                z = np.inf
                for _ in range(40):
                    a0, c0, r0 = streams.steps(rng, detector.REFERENCE_STEPS + 3000, P0, 4, rho, lengths)
                    a1, c1, r1 = streams.steps(rng, 3000, P_DROP, 4, rho, lengths)
                    z = min(z, least_z(np.concatenate([a0, a1]), np.concatenate([c0, c1]),
                                       np.concatenate([r0, r1 + r0.max() + 1]), top, 500))
                print(f"{part}, correlation {rho}, {lengths}: least z {z:.1f}")
    rng = np.random.default_rng(2028)
    z = min(least_z(*streams.steps(rng, detector.REFERENCE_STEPS + 20_000, P0, 4, 0.2, "geometric"), top)
            for _ in range(40))
    print(f"river, its false-alarm streams (correlation 0.2, geometric): least z {z:.1f}")


if __name__ == "__main__":
    main()
