"""What ``spdnn calibrate`` measures: the grid of kernel cells, reference networks and message
sizes, in one record. ``FULL`` is the default; ``QUICK`` (``--quick``) measures a coarse
subset in a fraction of the time, for trying the cost model out (the tables interpolate
between fewer points, and one round of reference steps cannot show the host's drift)."""

from __future__ import annotations

from dataclasses import dataclass

Widths = tuple[int, int, int]


@dataclass(frozen=True)
class CalibrationGrid:
    """The cells of a calibration. Kernels: batch sizes x buffer rows (``inputs``) x reuse
    (nonzeros per buffer row); dense layers (rows, columns); a RadiX-Net layer of
    ``structured`` neurons against a random one, at ``structure_batches``; reference networks
    (widths of three fan-in 32 layers, batch sizes) in cache and beyond it, each class at
    every batch of ``reference_batches``, for ``reference_rounds`` rounds of at least
    ``reference_seconds`` each (and 5 steps at least); the link at
    ``link_sizes`` bytes, and its CPU cost per byte over ``stack_work_s`` seconds of work,
    ``stack_rounds`` times. A cold call follows a write of ``evict_bytes`` (None: 1.5x the
    last-level cache, 64-512 MiB, a cost that grows with the cache);
    a cold cell is the median of ``cold_reps`` calls."""

    batches: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)
    inputs: tuple[int, ...] = (256, 1024, 4096, 16384, 65536)
    reuses: tuple[int, ...] = (1, 4, 32)  # a cut layer's ghosts .. a whole square layer
    dense_shapes: tuple[tuple[int, int], ...] = ((4, 512), (16, 1024), (64, 4096), (256, 4096))
    structured: int = 16384
    structure_batches: tuple[int, ...] = (8, 32, 128, 512)
    reference_batches: tuple[int, ...] = (32, 256)
    warm_references: tuple[tuple[Widths, tuple[int, ...]], ...] = (
        ((1024, 1024, 1024), (32, 256)), ((4096, 4096, 4096), (32,)))
    cold_references: tuple[tuple[Widths, tuple[int, ...]], ...] = (
        ((16384, 16384, 16384), (32, 256)),)
    reference_rounds: int = 3
    reference_seconds: float = 0.5  # per network and batch, each of alone and together
    link_sizes: tuple[int, ...] = (8, 1024, 16384, 131072, 1048576, 4194304, 16777216)
    stack_work_s: float = 0.25
    stack_rounds: int = 5
    evict_bytes: int | None = None
    cold_reps: int = 3

    def __post_init__(self) -> None:
        # The scales are kept per reference batch for each class (in cache, beyond it).
        for name in ("warm_references", "cold_references"):
            timed = {b for _, batches in getattr(self, name) for b in batches}
            if not set(self.reference_batches) <= timed:
                raise ValueError(f"CalibrationGrid: {name} must time every reference batch "
                                 f"{self.reference_batches}, not only {sorted(timed)}")
        if min(self.reference_rounds, self.stack_rounds, self.cold_reps) < 1 \
                or len(self.link_sizes) < 2:
            raise ValueError("CalibrationGrid: at least one round of each and two link sizes")
        if self.evict_bytes is not None and self.evict_bytes < 8:
            raise ValueError("CalibrationGrid: evict_bytes must be None or 8 or more")
        if not self.reference_seconds >= 0:
            raise ValueError("CalibrationGrid: reference_seconds must be 0 or more")


FULL = CalibrationGrid()
QUICK = CalibrationGrid(
    batches=(8, 64, 512), inputs=(256, 4096, 65536), reuses=(1, 32),
    dense_shapes=((16, 1024), (256, 4096)), structure_batches=(8, 128),
    warm_references=(((1024, 1024, 1024), (32, 256)),), reference_rounds=1,
    reference_seconds=0.25,
    link_sizes=(8, 16384, 131072, 1048576, 16777216), stack_work_s=0.1, stack_rounds=3,
    cold_reps=1)
