"""Plan files: one ``.npz`` of format ``spdnn-plan/1`` (docs/formats.md): ``nparts``,
``owner{k}`` for k = 0..L (int32, length n_k) and ``meta`` (JSON: method, epsilon, seed,
backend, the network's fingerprint, statistics, partitioning time)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from spdnn.errors import InputError, check_type
from spdnn.io.atomic import atomic_path
from spdnn.io.jsonread import decode
from spdnn.io.npz import NpzReader
from spdnn.model.plan import Plan, check_owners

PLAN_FORMAT = "spdnn-plan/1"


def save_plan(plan: Plan, path: str | os.PathLike) -> None:
    check_type("plan", plan, Plan, "a spdnn.Plan (from partition.partition or spdnn.load_plan)")
    check_owners(plan.owners, plan.parts, os.fspath(path))
    arrays = {
        "format": np.array(PLAN_FORMAT),
        "nparts": np.array(plan.parts, dtype=np.int64),
        "n_layers": np.array(len(plan.owners) - 1, dtype=np.int64),
        "meta": np.array(json.dumps(plan.meta, sort_keys=True)),
    }
    for k, o in enumerate(plan.owners):
        arrays[f"owner{k}"] = o.astype(np.int32)
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)


def load_plan(path: str | os.PathLike) -> Plan:
    with NpzReader(path, "plan") as npz:
        fmt = npz.text("format")
        if fmt != PLAN_FORMAT:
            raise InputError(npz.path, f"unknown format version '{fmt}' (expected {PLAN_FORMAT})")
        nparts = npz.integer("nparts")
        meta = decode(npz.text("meta"), npz.path, "meta")
        if not isinstance(meta, dict):
            raise InputError(npz.path, "meta must be a JSON object")
        owners = []
        k = 0
        while f"owner{k}" in npz.keys:
            owners.append(npz.get(f"owner{k}"))
            k += 1
        if len(owners) < 2:
            raise InputError(npz.path, "a plan needs owner0 and at least owner1")
        check_owners(owners, nparts, npz.path)
    return Plan(nparts, tuple(o.astype(np.int32) for o in owners), meta)
