"""Mutants the test suite must catch: each applies one deliberate mistake to the library in a
clean copy of the tree (``git archive HEAD``), runs the tests it names there, and is caught
when they fail. Prints one line a mutant and exits 1 when any survives.

    python scripts/mutants.py                 # every mutant (about 10 minutes on 2 cores)
    python scripts/mutants.py --list          # their names
    python scripts/mutants.py --only dropout-scale,set-half-columns
    python scripts/mutants.py --check         # each mistake applies to HEAD exactly once

A mutant names the file, the text it replaces (which must occur exactly once, so that the
list fails loudly when the code it targets changes), its replacement, and the tests (pytest
arguments; ``mpi`` ranks to run them under mpirun). docs/architecture.md ("What the tests
prove") lists what the suite is held to.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    mpi: int = 0  # ranks (0: a serial pytest)


M = Mutant
MUTANTS = [
    # The hostile-input classes (issue 87) and what their checks guard.
    M("optimizer-state-unchecked", "spdnn/runtime/checkpoint.py",
      "            _check_state(manifest, {key[:-2] for key in held}, k, directory)\n", "",
      ("tests/test_optim.py", "-k", "another_optimizer")),
    M("metadata-type-unchecked", "spdnn/io/safetensors.py",
      "        if meta is not None and not (", "        if False and not (",
      ("tests/test_safetensors_io.py", "-k", "damaged and metadata")),
    M("shape-claim-unchecked", "spdnn/io/safetensors.py",
      "if len(claimed) != 2 or min(claimed) < 1:", "if len(claimed) != 2:",
      ("tests/test_safetensors_io.py", "-k", "damaged and huge")),
    M("mask-values-unchecked", "spdnn/io/safetensors.py",
      "if not np.all((mask == 0) | (mask == 1)):", "if False:",
      ("tests/test_safetensors_io.py", "-k", "damaged and mask")),
    M("locality-weighted-in-float32", "spdnn/runtime/growth.py",
      "            score = weighted(score, weight)",
      "            score *= weight.astype(score.dtype)",
      ("tests/test_sparsity_mpi.py", "-k", "huge_grow_locality"), mpi=2),
    M("layer-named-twice", "spdnn/io/safetensors.py",
      "    if twice:\n", "    if False:\n",
      ("tests/test_safetensors_io.py", "-k", "round_trip_exactly")),
    M("layers-ignored-to-safetensors", "spdnn/cli/commands.py",
      "        net = read_safetensors(args.inputs[0], names, args.dtype,",
      "        net = read_safetensors(args.inputs[0], names if args.to == \"network\" else None,"
      " args.dtype,",
      ("tests/test_safetensors_io.py", "-k", "round_trip_exactly")),
    M("outputs-not-together", "spdnn/io/atomic.py",
      "        if _together is not None and final.absolute() in _together.finals:",
      "        if False:",
      ("tests/test_durable.py", "-k", "takes_the_others")),
    M("activations-not-compared", "spdnn/runtime/checkpoint.py",
      "                             network_functions(dnet))", "                             None)",
      ("tests/test_activations.py", "-k", "written_for")),
    M("files-named-twice", "spdnn/io/jsonfiles.py",
      "        if len(set(self.files)) != len(self.files):", "        if False:",
      ("tests/test_optim.py", "-k", "what_they_may_be")),
    M("schedule-unchecked", "spdnn/model/options.py",
      "Choice(*SCHEDULES), record=\"same\")", "Text(), record=\"same\")",
      ("tests/test_optim.py", "-k", "what_they_may_be")),
    M("weight-and-orig-both-taken", "spdnn/io/safetensors.py",
      "        if f\"{name}.weight_orig\" in st.tensors and f\"{name}.weight\" in st.tensors:",
      "        if False:", ("tests/test_safetensors_io.py", "-k", "damaged and orig")),
    M("duplicate-header-keys", "spdnn/io/safetensors.py",
      "header = decode(raw, self.path, unique_keys=True)", "header = decode(raw, self.path)",
      ("tests/test_safetensors_io.py", "-k", "damaged and twice")),
    M("cap-not-read-back", "spdnn/io/safetensors.py",
      "    cap, output_activation = _from_metadata(os.fspath(path), st.metadata, cap,\n"
      "                                            output_activation)\n",
      "    cap, output_activation = None, \"linear\"\n",
      ("tests/test_safetensors_io.py", "-k", "round_trip_exactly")),
    M("convert-narrows", "spdnn/io/safetensors.py",
      "        dtype = np.float64 if wide else np.float32", "        dtype = np.float32",
      ("tests/test_safetensors_io.py", "-k", "declares")),
    # What the tests' oracles must see (issue 87's list of weak tests).
    M("dropout-scale", "spdnn/model/counters.py",
      "np.asarray(1 / (1 - p), dtype)", "np.asarray(1 / p, dtype)",
      ("tests/test_optim.py", "-k", "inverted_dropout")),
    M("set-half-columns", "spdnn/model/sparsity.py",
      "        return np.minimum((u * n_in).astype(np.int64), n_in - 1)",
      "        return np.minimum((u * n_in // 2).astype(np.int64), n_in - 1)",
      ("tests/test_sparsity.py", "-k", "uniform")),
    M("one-replica-off", "spdnn/runtime/training.py",
      "    opt.step(grads)\n    dnet.weights_updated()\n    return float(value), int(ok)",
      "    opt.step(grads)\n    if grid.data.rank == 1:\n        opt.params[0][:1] += 1e-6\n"
      "    dnet.weights_updated()\n    return float(value), int(ok)",
      ("tests/test_optim_mpi.py", "-k", "every_grid_equals"), mpi=4),
    # Each optimizer: its update against torch.optim.
    M("sgd-momentum", "spdnn/optim/sgd.py",
      "                buf *= c.momentum\n", "                buf *= c.momentum * 0.99\n",
      ("tests/test_optim.py", "-k", "each_update")),
    M("sgd-nesterov", "spdnn/optim/sgd.py",
      "                d += buf * c.momentum\n", "                d -= buf * c.momentum\n",
      ("tests/test_optim.py", "-k", "each_update")),
    M("adam-eps", "spdnn/optim/adam.py", "        d += c.eps\n", "        d += 2 * c.eps\n",
      ("tests/test_optim.py", "-k", "each_update")),
    M("adam-bias-correction", "spdnn/optim/adam.py",
      "return -(self.lr / (1 - b1 ** self.steps)), (1 - b2 ** self.steps) ** 0.5",
      "return -self.lr, (1 - b2 ** self.steps) ** 0.5",
      ("tests/test_optim.py", "-k", "each_update")),
    M("adamw-decay", "spdnn/optim/adam.py",
      "            p *= 1 - self.lr * c.weight_decay\n",
      "            p *= 1 - c.weight_decay\n", ("tests/test_optim.py", "-k", "each_update")),
    M("rmsprop-centered", "spdnn/optim/rmsprop.py", "            avg = np.sqrt(v - m * m)\n",
      "            avg = np.sqrt(v)\n", ("tests/test_optim.py", "-k", "each_update and rmsprop")),
    M("rmsprop-momentum", "spdnn/optim/rmsprop.py", "            buf *= c.momentum\n",
      "            buf *= c.momentum * 0.5\n",
      ("tests/test_optim.py", "-k", "each_update and rmsprop")),
    M("adagrad-lr-decay", "spdnn/optim/adagrad.py",
      "clr = self.lr / (1 + (self.steps - 1) * c.lr_decay)", "clr = self.lr",
      ("tests/test_optim.py", "-k", "each_update and adagrad")),
    M("adagrad-grown-state", "spdnn/optim/adagrad.py",
      "        return self.config.initial_accumulator_value\n", "        return 0.0\n",
      ("tests/test_optim.py", "-k", "grown_weights_state")),
    M("rmsprop-state-by-name", "spdnn/optim/rmsprop.py",
      "({\"grad_avg\"} if settings.get(\"centered\") else set())", "set()",
      ("tests/test_optim_mpi.py", "-k", "resumes_on_another_grid"), mpi=2),
    # The kernel backend: the scipy backend's numpy twins give the compiled halves' results.
    M("hylo-twin-sign", "spdnn/lossy/_numpy_hylo.py", "    total[codes == 2] -= s\n",
      "    total[codes == 2] += s\n", ("tests/test_hylo.py", "-k", "numpy_passes")),
    M("compress-twin-threshold", "spdnn/lossy/_numpy_compress.py",
      "    keep = np.abs(x) > t\n", "    keep = np.abs(x) >= t * 0.999\n",
      ("tests/test_compress.py", "-k", "numpy_passes")),
    M("arrivals-twin-order", "spdnn/cost/_arrivals_numpy.py",
      "    order = np.argsort(src, kind=\"stable\")\n", "    order = np.argsort(-src)\n",
      ("tests/test_costmodel.py", "-k", "posting_order")),
    M("plan-stats-twin-fold", "spdnn/model/plan.py",
      "            if k > 1:  # the fold goes the other way\n",
      "            if k > 2:  # the fold goes the other way\n",
      ("tests/test_plan.py", "-k", "brute_force")),
    M("partition-epsilon-unchecked", "partition/options.py",
      "Number(0, 1, open=\"both\", what=\"a number in (0, 1)\")",
      "Number(0, 2, what=\"a number in (0, 1)\")",
      ("tests/test_partition.py", "-k", "epsilon or bad")),
    # The schema: a manifest's run setting checked by its option's declaration, and a field
    # no option declares refused.
    M("manifest-setting-unchecked", "spdnn/io/jsonfiles.py",
      "                    setattr(self, name, declared.check(value))",
      "                    setattr(self, name, value)",
      ("tests/test_optim.py", "-k", "manifest_values")),
    M("manifest-unknown-field", "spdnn/io/jsonfiles.py",
      "kw_only=True,\n                             forbid_unknown_fields=True",
      "kw_only=True,\n                             forbid_unknown_fields=False",
      ("tests/test_optim.py", "-k", "manifest_values")),
    M("joint-check-by-keyword", "spdnn/errors.py", "    return name\n",
      "    return \"--\" + name\n", ("tests/test_optim.py", "-k", "callers_terms")),
    # Each activation: value and slope against their formulas, on both backends.
    M("relu-slope-at-zero", "spdnn/model/activations.py", "        keep = z > 0\n",
      "        keep = z >= 0\n", ("tests/test_activations.py", "-k", "relus_slope")),
    M("identity-value", "spdnn/model/activations.py", "        np.copyto(out, z)\n",
      "        np.copyto(out, z * 1.01)\n",
      ("tests/test_kernels.py", "-k", "every_activation and identity")),
    M("leaky-relu", "spdnn/model/activations.py",
      "np.where(z > 0, z, z * z.dtype.type(self.slope))", "np.where(z >= 0.1, z, z * "
      "z.dtype.type(self.slope))", ("tests/test_kernels.py", "-k", "every_activation")),
    M("tanh", "spdnn/model/activations.py", "        return 1 - h * h\n",
      "        return 1 - h * h * 1.01\n",
      ("tests/test_kernels.py", "-k", "every_activation and tanh")),
    M("sigmoid", "spdnn/model/activations.py", "        return (1 - h) * h\n",
      "        return (1 - h) * h * 1.01\n",
      ("tests/test_kernels.py", "-k", "every_activation and sigmoid")),
    M("gelu", "spdnn/model/activations.py", "        t = _erf(z * _SQRT1_2)\n",
      "        t = _erf(z * _SQRT1_2 * 1.01)\n",
      ("tests/test_kernels.py", "-k", "every_activation and gelu")),
    M("gelu-compiled-slope", "spdnn/model/activations.py",
      "        getattr(nb, \"slope_\" + self.name)(g, z, h)\n", "        g *= 1.0\n",
      ("tests/test_kernels.py", "-k", "every_activation and gelu")),
    M("torch-module-of-sigmoid", "spdnn/model/activations.py",
      "    TORCH: ClassVar[str] = \"Sigmoid\"", "    TORCH: ClassVar[str] = \"Tanh\"",
      ("tests/test_pytorch.py",)),
    M("gelu-tanh", "spdnn/model/activations.py", "_KAPPA = 0.044715", "_KAPPA = 0.045",
      ("tests/test_kernels.py", "-k", "every_activation and gelu_tanh")),
    # The cost model and the partitioner (issue 84).
    M("fold-posting-order", "spdnn/cost/_workload_kernels.py", "        m = order[k]\n",
      "        m = k\n", ("tests/test_costmodel.py", "-k", "posting_order")),
    M("replan-never-backs-off", "spdnn/runtime/replan.py",
      "min(2 * self.wait, AUTO_MAX_WAIT)", "1", ("tests/test_sparsity.py", "-k", "backs_off")),
    M("replan-ignores-rebuilds", "spdnn/runtime/replan.py",
      "                values += int(indptr[-1])\n", "                values += 0\n",
      ("tests/test_sparsity.py", "-k", "rebuilds")),
    # Early stopping's rule and the scikit-learn estimator (issue 86).
    M("early-stopping-ignores-min-delta", "spdnn/runtime/training.py",
      "watched < best - cfg.min_delta", "watched < best",
      ("tests/test_optim_mpi.py", "-k", "min_delta"), mpi=2),
    M("estimator-drops-alpha", "spdnn/estimators.py", "weight_decay=self.alpha,",
      "weight_decay=0.0,", ("tests/test_estimators.py", "-k", "serial_references")),
    M("targets-other-columns", "spdnn/runtime/outputs.py", "y[:, rows].T", "y[:, :len(rows)].T",
      ("tests/test_api_mpi.py", "-k", "real_valued"), mpi=2),
    M("regressor-r2-unweighted", "spdnn/estimators.py", "r.validation_loss * held.size / spread",
      "r.validation_loss * len(held) / spread",
      ("tests/test_estimators.py", "-k", "validation_scores_are_r2")),
    M("lsh-twin-label-hits", "spdnn/kernels/_numpy_lsh.py",
      "hits = hits - np.bincount(from_labels, minlength=len(pairs))", "hits = hits",
      ("tests/test_lsh.py", "-k", "retrieval_is_the_union")),
    M("lsh-twin-lanes", "spdnn/kernels/_numpy_lsh.py", "j[~tail] % 8", "j[~tail] % 4",
      ("tests/test_lsh.py", "-k", "sampled_passes")),
    M("dwta-twin-borrow", "spdnn/kernels/_numpy_hashing.py",
      "won[empty] = arg[:, _probe(functions, attempt, n_fn)][empty]",
      "won[empty] = arg[:, _probe(functions, attempt + 1, n_fn)][empty]",
      ("tests/test_lsh.py", "-k", "dwta_codes")),
    M("estimator-rank-seeds", "spdnn/estimators.py",
      "return comm.bcast(drawn if comm.rank == 0 else None)", "return drawn",
      ("tests/test_estimators_mpi.py", "-k", "random_state_of_none"), mpi=2),
    # bfloat16 (issue 85): its rounding, its rounding points, the copy of the weights.
    M("bfloat16-kernels-truncate", "spdnn/kernels/_vectors.py",
      "    up = builder.lshr(builder.add(builder.add(bits, const(0x7FFF)), lsb), const(16))",
      "    up = builder.lshr(bits, const(16))",
      ("tests/test_bfloat16.py", "-k", "products_read")),
    M("bfloat16-numpy-truncates", "spdnn/kernels/bfloat16.py",
      "rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16)",
      "rounded = bits >> 16",
      ("tests/test_bfloat16.py", "-k", "torch_converts")),
    M("bfloat16-errors-truncated", "spdnn/kernels/_numba_bfloat16.py",
      "            u = narrow_value(s[b])",
      "            u = np.uint16(_bits_of_float(np.float32(s[b])) >> np.uint32(16))",
      ("tests/test_bfloat16.py", "-k", "numba_conversions")),
    M("bfloat16-copy-stale", "spdnn/runtime/training.py",
      "    dnet.weights_updated()\n", "",
      ("tests/test_bfloat16_mpi.py", "-k", "every_grid and sgd and None"), mpi=2),
    M("bfloat16-resume-stale", "spdnn/runtime/checkpoint.py",
      "    dnet.weights_updated()  # the products' bfloat16 copies of the weights read\n", "",
      ("tests/test_bfloat16_mpi.py", "-k", "resumes"), mpi=2),
    M("bfloat16-slope-cap-unrounded", "spdnn/runtime/distributed.py",
      "self.slope_cap = self.cap if self.cap is None or not self.bfloat16 else",
      "self.slope_cap = self.cap if True else",
      ("tests/test_bfloat16_mpi.py", "-k", "every_grid and 0.7"), mpi=2),
    M("bfloat16-activation-skipped", "spdnn/runtime/distributed.py",
      "                kernels.activate(act, z, z)",
      "                pass",
      ("tests/test_bfloat16_mpi.py", "-k", "every_grid and tanh and sgd"), mpi=2),
    M("bfloat16-slope-reads-bits", "spdnn/kernels/_numba_activations.py",
      "            v = value(hi[b])  # bfloat16 outputs widened",
      "            v = hi[b]",
      ("tests/test_bfloat16.py", "-k", "widened_values")),
    M("bfloat16-reference-slope-of-z", "spdnn/reference/passes.py",
      "                g *= act.slope_of(zs[k - 1], h)",
      "                g *= act.slope_of(zs[k - 1])",
      ("tests/test_bfloat16_mpi.py", "-k", "every_grid and tanh and sgd"), mpi=2),
    M("bfloat16-cap-pattern-cast", "spdnn/kernels/encoding.py",
      "return _ints(bfloat16.narrow(np.array([value], np.float32)) if bfloat16.is_bfloat16(dtype)",
      "return _ints(np.array([value], dtype) if bfloat16.is_bfloat16(dtype)",
      ("tests/test_bfloat16.py", "-k", "encode")),
    M("bfloat16-bundle-not-widened", "spdnn/io/bundle.py",
      "        return bfloat16.widen(stored) if self.bfloat16 else stored",
      "        return stored",
      ("tests/test_bfloat16.py", "-k", "stays_bfloat16")),
    M("exchange-keeps-a-stale-buffer", "spdnn/runtime/halo.py",
      "        self._stage = _NO_BYTES\n", "",
      ("tests/test_exchange_mpi.py", "-k", "pool_let_go"), mpi=2),
    M("fold-packs-beside-not-in-place", "spdnn/runtime/halo.py",
      "                packed = block.reshape(-1)\n",
      "                packed = self._buffer(1, n, dtype, GHOST_SIDE)[0]\n",
      ("tests/test_exchange_mpi.py", "-k", "pool_let_go"), mpi=2),
    M("bfloat16-stages-in-the-pool", "spdnn/runtime/distributed.py",
      "None if ws is None else ws.stages[i])", "None)",
      ("tests/test_exchange_mpi.py", "-k", "pool_let_go"), mpi=2),
    M("bfloat16-dense-head-sums-out-of-order", "spdnn/kernels/_numba_products.py",
      "                        s = s + w6 * ahead[6, c]\n",
      "                        s = s + w7 * ahead[6, c]\n",
      ("tests/test_bfloat16.py", "-k", "dense")),
    M("bfloat16-narrow-tail-biases-as-bits", "spdnn/kernels/_numba_layers.py",
      "_array(where, k, 3, bias_like)", "_array(where, k, 3, value_like)",
      ("tests/test_runtime_mpi.py", "-k", "narrow_end and bfloat16"), mpi=1),
    M("bfloat16-replay-sends-float32", "spdnn/cost/_replay.py",
      "        return self.sent_item if forward else self.item\n",
      "        return self.item\n", ("tests/test_costmodel.py", "-k", "posting_order")),
    M("bfloat16-replay-skips-the-copy", "spdnn/cost/_replay.py",
      "        self.round_ns = cal.round_ns() if dtype == \"bfloat16\" else 0.0",
      "        self.round_ns = 0.0", ("tests/test_costmodel.py", "-k", "bfloat16")),
]


def copy_of_head(where: Path) -> Path:
    """A clean copy of the committed tree (what CI checks out)."""
    tree = where / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def apply(tree: Path, m: Mutant) -> str:
    """Apply ``m``; returns the file's original text."""
    path = tree / m.file
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"mutants.py: {m.name}: the text to replace occurs "
                         f"{text.count(m.old)} times in {m.file}, not once (update the list)")
    path.write_text(text.replace(m.old, m.new))
    return text


def run(tree: Path, m: Mutant) -> bool:
    """Whether the mutant's tests fail (it is caught). A mutant of a kernel module compiles
    into a numba cache of its own: numba's cache does not follow imports, so kernels cached
    by an earlier mutant would keep the unmutated code of the helpers they inline."""
    env = {**os.environ, "PYTHONPATH": str(tree), "SPDNN_TEST_ORACLES": "required"}
    if m.file.startswith("spdnn/kernels/"):
        env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="mutant-numba-", dir=tree.parent)
    pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
              "--timeout=600", *m.tests]
    cmd = (["mpirun", "-n", str(m.mpi), *pytest, "--with-mpi"] if m.mpi else pytest)
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode == 5 or "no tests ran" in proc.stdout:
        raise SystemExit(f"mutants.py: {m.name}: its tests select nothing ({' '.join(m.tests)})")
    return proc.returncode != 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print the mutants' names")
    ap.add_argument("--only", help="comma-separated names")
    ap.add_argument("--check", action="store_true",
                    help="only check that every mutant applies to HEAD")
    args = ap.parse_args()
    chosen = MUTANTS
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {m.name for m in MUTANTS}
        if unknown:
            ap.error(f"no mutant named {', '.join(sorted(unknown))} (see --list)")
        chosen = [m for m in MUTANTS if m.name in names]
    if args.list:
        print("\n".join(m.name for m in chosen))
        return 0
    with tempfile.TemporaryDirectory(prefix="spdnn-mutants-") as tmp:
        tree = copy_of_head(Path(tmp))
        if args.check:
            for m in chosen:
                original = apply(tree, m)
                (tree / m.file).write_text(original)
            print(f"{len(chosen)} mutants apply to HEAD")
            return 0
        # The tests must pass on the tree as it is: a mutant is caught by what it breaks, not
        # by a test that fails anyway.
        for tests, mpi in dict.fromkeys((m.tests, m.mpi) for m in chosen):
            if run(tree, Mutant("baseline", "", "", "", tests, mpi)):
                raise SystemExit(f"mutants.py: {' '.join(tests)} fails on HEAD itself")
        print("the tests pass on HEAD", flush=True)
        survived = []
        for i, m in enumerate(chosen, start=1):
            original = apply(tree, m)
            t0 = time.monotonic()
            try:
                caught = run(tree, m)
            finally:
                (tree / m.file).write_text(original)
            print(f"[{i}/{len(chosen)}] {m.name}: {'caught' if caught else 'SURVIVED'} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            if not caught:
                survived.append(m.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutants caught"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
