"""The values an option may take, named once: value types and exchange modes (the records,
the parsers, the file schemas and the kernels take them from here)."""

from __future__ import annotations

from typing import Literal, get_args

Dtype = Literal["float32", "float64"]
Exchange = Literal["auto", "dense", "sparse"]  # how rows travel: spdnn.kernels.encoding

DTYPE_NAMES: tuple[str, ...] = get_args(Dtype)
EXCHANGES: tuple[str, ...] = get_args(Exchange)
# Graph Challenge input images: the sides (32: the 1024-neuron networks .. 256: 65536), and the
# grey level (scaled to [0, 1]) above which a pixel is on (spdnn.io.images).
CHALLENGE_SIZES: tuple[int, ...] = (32, 64, 128, 256)
CHALLENGE_THRESHOLD = 0.71
