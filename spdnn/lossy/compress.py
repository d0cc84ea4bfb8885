"""Lossy gradient compression for the sum across replicas (opt-in: ``--compress``).

Each rank keeps, per layer, a residual of the gradient it has not sent (error feedback): the
step's gradient is added to it, the compressor picks positions, their values are sent and
zeroed in the residual, the rest waits for the next step. Selection:

- ``topk:R``   exact: the ceil(R n) largest magnitudes (``argpartition``), the reference;
- ``dgc:R``    Deep Gradient Compression: the threshold is the top-R quantile of a random
               sample of the magnitudes (1%, at least 1,000); when far more pass it than
               asked, the exact top-k of those that passed (DGC's hierarchical selection);
- ``hylo``     two bits per value, no positions (spdnn.lossy.hylo);
- ``sidco:R[:exp|gamma|gpareto]``  SIDCo (Abdelmoniem et al., MLSys 2021): the threshold is
               the top-R quantile of a distribution fitted to the magnitudes, in stages: the
               first fits all of them at ratio 0.25, each later stage fits the excess of those
               above the previous threshold (exponential for exp, generalised Pareto for the
               others) at an equal share of the remaining ratio; every few steps the number of
               stages moves to keep the achieved ratio near R.

Thresholds scale with the vector (every fit here is scale-equivariant), so fitting |g| equals
fitting |g| / ||g|| as in the paper, without the division. Kernels know nothing of MPI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

# numba and scipy load on first use: parsing --compress must not load numba before --threads
# has sized its pool (spdnn.comm.threads).

KINDS = ("none", "topk", "dgc", "sidco", "hylo")
DISTRIBUTIONS = ("exp", "gamma", "gpareto")
FIRST_RATIO = 0.25  # SIDCo's first stage
ADAPT_EVERY = 5  # steps between changes of the stage count
TOLERANCE = 0.15  # achieved / target within 1 +- this: the stage count stays
DGC_SAMPLE = 0.01
DGC_MIN_SAMPLE = 1000
DGC_OVERSHOOT = 1.3  # more than this x k passed the sampled threshold: exact top-k of them


@dataclass(frozen=True)
class CompressSpec:
    """What ``--compress`` asked for; ``min_values``: layers with fewer gradient values on a
    rank are summed exactly (``--compress-min-values``)."""

    kind: Literal["none", "topk", "dgc", "sidco", "hylo"] = "none"
    ratio: float = 1.0
    distribution: Literal["exp", "gamma", "gpareto"] = "exp"
    min_values: int = 0

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def text(self) -> str:
        if self.kind in ("none", "hylo"):
            return self.kind
        dist = f":{self.distribution}" if self.kind == "sidco" else ""
        return f"{self.kind}:{self.ratio:g}{dist}"

    def applies(self, n_values: int) -> bool:
        return self.enabled and n_values >= max(self.min_values, 1)


def parse_compress(text: str, min_values: int = 0) -> CompressSpec:
    """``none``, ``hylo``, ``topk:R``, ``dgc:R`` or ``sidco:R[:exp|gamma|gpareto]`` with R in
    (0, 1]."""
    parts = text.strip().split(":")
    kind = parts[0].lower()
    if kind not in KINDS:
        raise ValueError(f"unknown compressor {parts[0]!r}; choose none, hylo, topk:RATIO, "
                         "dgc:RATIO or sidco:RATIO[:exp|gamma|gpareto]")
    if min_values < 0:
        raise ValueError(f"--compress-min-values must be >= 0, not {min_values}")
    if kind in ("none", "hylo"):
        if len(parts) > 1:
            raise ValueError(f"'{kind}' takes no ratio")
        return CompressSpec(kind=kind, min_values=min_values if kind == "hylo" else 0)
    if len(parts) < 2 or len(parts) > (3 if kind == "sidco" else 2):
        form = "sidco:RATIO[:exp|gamma|gpareto]" if kind == "sidco" else f"{kind}:RATIO"
        raise ValueError(f"{text!r}: write {form}")
    try:
        ratio = float(parts[1])
    except ValueError:
        raise ValueError(f"{text!r}: the ratio {parts[1]!r} is not a number") from None
    if not 0 < ratio <= 1:  # also rejects nan
        raise ValueError(f"{text!r}: the ratio must lie in (0, 1], not {parts[1]}")
    dist = parts[2].lower() if len(parts) == 3 else "exp"
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"{text!r}: unknown distribution {parts[2]!r}; choose exp, gamma or "
                         "gpareto")
    return CompressSpec(kind, ratio, dist, min_values)


# ----------------------------------------------------------------------- fits and thresholds

def exp_threshold(mean_excess: float, ratio: float, shift: float = 0.0) -> float:
    """P(X > t) = ratio for X - shift exponential with this mean."""
    return shift - mean_excess * math.log(ratio)


def gamma_fit(mean: float, mean_log: float) -> tuple[float, float]:
    """Shape and scale of a gamma distribution: the closed-form approximation of the maximum
    likelihood shape (Minka), scale = mean / shape."""
    s = math.log(mean) - mean_log
    if not s > 0:  # all values equal: a very peaked gamma
        return 1e6, mean / 1e6
    shape = (3 - s + math.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)
    return shape, mean / shape


def gamma_threshold(shape: float, scale: float, ratio: float) -> float:
    """P(X > t) = ratio: the inverse of the regularised upper incomplete gamma function."""
    from scipy import special

    return scale * float(special.gammainccinv(shape, ratio))


def gpareto_fit(mean: float, var: float) -> tuple[float, float]:
    """Shape xi and scale sigma of a generalised Pareto distribution by the method of
    moments."""
    if not var > 0:
        return 0.0, mean
    q = mean * mean / var
    return 0.5 * (1 - q), 0.5 * mean * (q + 1)


def gpareto_threshold(xi: float, sigma: float, ratio: float, shift: float = 0.0) -> float:
    """P(X - shift > t - shift) = ratio for a generalised Pareto excess."""
    if abs(xi) < 1e-9:
        return shift - sigma * math.log(ratio)
    return shift + sigma / xi * (ratio ** -xi - 1)


def stage_ratios(ratio: float, stages: int) -> list[float]:
    """The ratio of each SIDCo stage: one stage at ``ratio``, or FIRST_RATIO then equal
    shares of the rest (their product is ``ratio``)."""
    if stages <= 1 or ratio >= FIRST_RATIO:
        return [ratio]
    rest = (ratio / FIRST_RATIO) ** (1.0 / (stages - 1))
    return [FIRST_RATIO] + [rest] * (stages - 1)


def max_stages(ratio: float) -> int:
    """Every stage at least halves: at most ceil(log2(1 / ratio)) stages, and 16."""
    return min(16, max(1, math.ceil(math.log(ratio) / math.log(0.5))))


# ---------------------------------------------------------------------------- selections

def topk_select(acc: np.ndarray, k: int, mag: np.ndarray | None = None) -> np.ndarray:
    """Positions of the k largest |acc| (ascending positions; ties: any k of them)."""
    n = len(acc)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    mag = np.abs(acc, out=mag[:n] if mag is not None else None)
    idx = np.argpartition(mag, n - k)[n - k:]
    idx.sort()
    return idx


class Workspace:
    """Scratch of one vector length: the positions (integers as wide as the values, for the
    vector compress) and values of the selected entries."""

    def __init__(self, n: int, dtype: np.dtype) -> None:
        itype = np.int32 if np.dtype(dtype).itemsize == 4 and n < 2**31 else np.int64
        if np.dtype(dtype).itemsize != np.dtype(itype).itemsize:
            raise ValueError(f"no compressor workspace for {n} values of {dtype}")
        pad = 64 // np.dtype(dtype).itemsize  # room for the last vector's store
        self.idx = np.empty(n + pad, dtype=itype)
        self.val = np.empty(n + pad, dtype=dtype)
        self.mag = np.empty(n, dtype=dtype)


def sidco_select(acc: np.ndarray, ratio: float, distribution: str, stages: int,
                 ws: Workspace, correction: float = 1.0) -> np.ndarray:
    """Positions whose |acc| exceeds SIDCo's multi-stage threshold (the last stage's ratio
    times ``correction``, at most 1)."""
    nbc = compressor_passes()
    n = len(acc)
    ratios = stage_ratios(ratio, stages)
    ratios[-1] = min(1.0, ratios[-1] * correction)
    if distribution == "exp":
        t = exp_threshold(nbc.abs_sum(acc) / max(n, 1), ratios[0])
    elif distribution == "gamma":
        mean, mean_log, nz = nbc.abs_log_moments(acc)
        t = gamma_threshold(*gamma_fit(mean, mean_log), min(1.0, ratios[0] * n / nz)) \
            if nz else 0.0
    else:
        t = gpareto_threshold(*gpareto_fit(*nbc.abs_moments(acc)), ratios[0])
    c = nbc.select_above(acc, nbc.below(t, acc.dtype), ws.idx, ws.val)
    for r in ratios[1:]:
        if c < 2:
            break
        mean, var = nbc.excess_moments(ws.val, c, t)
        t = exp_threshold(mean, r, t) if distribution == "exp" else \
            gpareto_threshold(*gpareto_fit(mean, var), r, t)
        c = nbc.keep_above(ws.idx, ws.val, c, nbc.below(t, acc.dtype))
    return ws.idx[:c].astype(np.int64)


def dgc_select(acc: np.ndarray, ratio: float, rng: np.random.Generator,
               ws: Workspace) -> np.ndarray:
    """Positions whose |acc| reaches the top-``ratio`` quantile of a random sample."""
    nbc = compressor_passes()
    n = len(acc)
    k = max(1, math.ceil(ratio * n))
    s = min(n, max(DGC_MIN_SAMPLE, math.ceil(DGC_SAMPLE * n)))
    sample = np.abs(acc[rng.integers(0, n, s)]) if s < n else np.abs(acc)
    ks = max(1, math.ceil(ratio * s))
    t = float(np.partition(sample, s - ks)[s - ks])
    # |x| > the next value below t: the sampled k-th magnitude itself passes
    t = np.nextafter(acc.dtype.type(t), acc.dtype.type(-np.inf)) if t > 0 else acc.dtype.type(-1)
    c = nbc.select_above(acc, t, ws.idx, ws.val)
    if c > DGC_OVERSHOOT * k:
        keep = np.argpartition(np.abs(ws.val[:c]), c - k)[c - k:]
        keep.sort()
        return ws.idx[keep].astype(np.int64)
    return ws.idx[:c].astype(np.int64)


# ------------------------------------------------------------------------- error feedback

class Compressor:
    """One layer's compressor on one rank: the residual (error feedback) and SIDCo's stage
    count. ``compress`` is deterministic given (seed, step, stream): DGC's sample comes from a
    generator seeded with them, so a resumed run draws what an uninterrupted one draws."""

    def __init__(self, spec: CompressSpec, n: int, dtype: np.dtype, seed: int = 0,
                 stream: tuple[int, ...] = ()) -> None:
        self.spec, self.n = spec, n
        self.residual = np.zeros(n, dtype=dtype)
        self.seed, self.stream = seed, stream
        self._ws: Workspace | None = None
        # SIDCo adaptation: stages, sum of achieved/target since the last check, calls
        # counted, the correction of the last stage's ratio
        start = 2 if spec.ratio < FIRST_RATIO else 1
        self.state = np.array([start, 0.0, 0.0, 1.0])

    @property
    def k(self) -> int:
        return max(1, math.ceil(self.spec.ratio * self.n))

    def workspace(self) -> Workspace:
        if self._ws is None:
            self._ws = Workspace(self.n, self.residual.dtype)
        return self._ws

    def select(self, acc: np.ndarray, step: int) -> np.ndarray:
        """Positions of ``acc`` to send this step."""
        kind = self.spec.kind
        if kind == "topk":
            return topk_select(acc, self.k, self.workspace().mag)
        if kind == "dgc":
            rng = np.random.default_rng([self.seed, step, *self.stream])
            return dgc_select(acc, self.spec.ratio, rng, self.workspace())
        idx = sidco_select(acc, self.spec.ratio, self.spec.distribution,
                           int(self.state[0]), self.workspace(), self.state[3])
        self._adapt(len(idx) / max(self.n, 1), acc)
        return idx

    def _adapt(self, achieved: float, acc: np.ndarray) -> None:
        """Every ADAPT_EVERY calls, from the mean achieved / target ratio since the last check
        (``estimate``), when it is off by more than TOLERANCE:

        - the last stage's ratio is scaled by a correction that follows 1 / estimate (square
          root steps, within [1/4, 4]): the fine knob, in the spirit of SIDCo's first-ratio
          adjustment;
        - when the correction would leave [1/4, 4], the stage count is chosen again: every
          count is tried on this step's vector and the one whose selection is nearest the
          target kept (correction 1). Nearest, not a step up or down: how the count moves the
          threshold depends on the tail (more stages select fewer values on heavier tails than
          the fit, more on lighter ones), and need not be monotone.
        """
        st = self.state
        st[1] += achieved / self.spec.ratio
        st[2] += 1
        if st[2] < ADAPT_EVERY:
            return
        estimate = st[1] / st[2]
        st[1] = st[2] = 0.0
        if abs(estimate - 1) <= TOLERANCE:
            return
        correction = st[3] * min(max(1 / max(estimate, 1e-9), 0.25), 4) ** 0.5
        if 0.25 <= correction <= 4:
            st[3] = correction
            return
        spec, ws = self.spec, self.workspace()
        counts = [len(sidco_select(acc, spec.ratio, spec.distribution, s, ws))
                  for s in range(1, max_stages(spec.ratio) + 1)]
        miss = [abs(math.log((c + 0.5) / self.k)) for c in counts]
        st[0], st[3] = 1 + int(np.argmin(miss)), 1.0

    def compress(self, grads: Sequence[np.ndarray], step: int
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Add the gradient (``grads`` end to end: n values) to the residual, take the selected
        positions and their values out of it (sent + residual = residual before + gradient,
        exactly); returns (positions, values)."""
        acc = self.residual
        start = 0
        for g in grads:
            acc[start:start + len(g)] += g
            start += len(g)
        idx = self.select(acc, step)
        values = acc[idx]
        acc[idx] = 0
        return idx, values


def compressor_passes():  # noqa: ANN202
    """The compressors' passes: compiled where the kernel backend runs them, else numpy's."""
    from spdnn.backends import active

    return active().passes("spdnn.lossy._numba_compress", "spdnn.lossy._numpy_compress")


def warm_up() -> None:
    nbc = compressor_passes()
    nbc.warm_up()
