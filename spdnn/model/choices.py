"""The values an option may take, named once: value types and exchange modes (the records,
the parsers, the file schemas and the kernels take them from here)."""

from __future__ import annotations

from typing import Literal, get_args

Dtype = Literal["float32", "float64"]  # what files and arrays hold
# what a run computes in: bfloat16 stores what the products gather and the exchanges send in 16
# bits and sums, master weights and the optimizer's state in float32 (spdnn.kernels.bfloat16)
ValueType = Literal["float32", "float64", "bfloat16"]
Exchange = Literal["auto", "dense", "sparse"]  # how rows travel: spdnn.kernels.encoding

DTYPE_NAMES: tuple[str, ...] = get_args(Dtype)
VALUE_TYPES: tuple[str, ...] = get_args(ValueType)
EXCHANGES: tuple[str, ...] = get_args(Exchange)
# Graph Challenge input images: the sides (32: the 1024-neuron networks .. 256: 65536), and the
# grey level (scaled to [0, 1]) above which a pixel is on (spdnn.io.images).
CHALLENGE_SIZES: tuple[int, ...] = (32, 64, 128, 256)
CHALLENGE_THRESHOLD = 0.71
