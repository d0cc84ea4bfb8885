"""The optimizers (spdnn.optim) against torch.optim itself: each update on the same arrays,
and whole training runs of the serial reference against torch on the same masked network
(float64, batches in file order). torch is installed by the test command."""

from __future__ import annotations

import numpy as np
import pytest

from spdnn.errors import OptionError
from spdnn.io.loaders import Dataset
from spdnn.optim import (
    OPTIMIZERS,
    AdagradConfig,
    AdamConfig,
    AdamWConfig,
    RMSpropConfig,
    RowGrad,
    SavedState,
    SGDConfig,
    config_of,
    make,
    parameters,
)
from spdnn.reference import train
from tests.helpers import import_torch, lazy_torch, small_network

torch = lazy_torch  # imported where a test uses it

# Each optimizer's settings as spdnn takes them, and the torch.optim class and keywords that
# mean the same.
CASES = {
    "sgd": (SGDConfig(0.1, 0.0), "SGD", dict(lr=0.1)),
    "sgd-momentum": (SGDConfig(0.05, 0.9, 0.01), "SGD",
                     dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    "sgd-nesterov": (SGDConfig(0.05, 0.8, 0.02, nesterov=True), "SGD",
                     dict(lr=0.05, momentum=0.8, weight_decay=0.02, nesterov=True)),
    "adam": (AdamConfig(), "Adam", dict()),
    "adam-decay": (AdamConfig(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05), "Adam",
                   dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    "adam-beta-low": (AdamConfig(lr=0.02, betas=(0.3, 0.9)), "Adam",
                      dict(lr=0.02, betas=(0.3, 0.9))),  # torch's lerp takes its other form
    "adamw": (AdamWConfig(), "AdamW", dict()),
    "adamw-decay": (AdamWConfig(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
                    "AdamW", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    "rmsprop": (RMSpropConfig(), "RMSprop", dict()),
    "rmsprop-all": (RMSpropConfig(lr=0.005, alpha=0.9, eps=1e-6, weight_decay=0.05,
                                  momentum=0.8, centered=True), "RMSprop",
                    dict(lr=0.005, alpha=0.9, eps=1e-6, weight_decay=0.05, momentum=0.8,
                         centered=True)),
    "rmsprop-alpha-low": (RMSpropConfig(lr=0.003, alpha=0.3, centered=True), "RMSprop",
                          dict(lr=0.003, alpha=0.3, centered=True)),  # lerp's other form
    "rmsprop-momentum": (RMSpropConfig(lr=0.003, momentum=0.9), "RMSprop",
                         dict(lr=0.003, momentum=0.9)),
    "adagrad": (AdagradConfig(), "Adagrad", dict()),
    "adagrad-all": (AdagradConfig(lr=0.05, lr_decay=0.1, weight_decay=0.05,
                                  initial_accumulator_value=0.3, eps=1e-6), "Adagrad",
                    dict(lr=0.05, lr_decay=0.1, weight_decay=0.05,
                         initial_accumulator_value=0.3, eps=1e-6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_update_is_torch_optims(case):
    """Six steps on three arrays with random gradients: within 1e-13 of torch.optim (float64)."""
    config, name, kwargs = CASES[case]
    rng = np.random.default_rng(0)
    ours = [rng.standard_normal(n) for n in (50, 7, 300)]
    theirs = [torch.tensor(p.copy(), requires_grad=True) for p in ours]
    opt = make(config, ours)
    ref = getattr(torch.optim, name)(theirs, **kwargs)
    for _ in range(6):
        grads = [rng.standard_normal(len(p)) for p in ours]
        for t, g in zip(theirs, grads):
            t.grad = torch.tensor(g)
        ref.step()
        opt.step(grads)
    for a, t in zip(ours, theirs):
        np.testing.assert_allclose(a, t.detach().numpy(), rtol=0, atol=1e-13)
    assert opt.steps == 6 and set(opt.state[0]) <= set(type(opt).STATE)


def test_adams_rows_are_updated_lazily_as_sparse_adam():
    """A RowGrad under Adam: only its entries move, their moments as torch.optim.SparseAdam
    keeps them (the step count is the optimizer's, every step)."""
    rng = np.random.default_rng(1)
    p = rng.standard_normal(40)
    theirs = torch.tensor(p.copy(), requires_grad=True)
    opt = make(AdamConfig(lr=0.05, betas=(0.85, 0.95), eps=1e-7), [p])
    ref = torch.optim.SparseAdam([theirs], lr=0.05, betas=(0.85, 0.95), eps=1e-7)
    untouched = np.ones(40, dtype=bool)
    for _ in range(7):
        rows = np.sort(rng.choice(40, size=9, replace=False))
        untouched[rows] = False
        g = rng.standard_normal(9)
        theirs.grad = torch.sparse_coo_tensor(torch.tensor(rows[None]), torch.tensor(g), (40,),
                                              check_invariants=True)
        ref.step()
        opt.step([RowGrad(rows, g)])
    np.testing.assert_allclose(p, theirs.detach().numpy(), rtol=0, atol=1e-13)
    assert untouched.any()


def _masked_torch_model(net):
    """torch's nn.Sequential of the same network, every weight pruned to its pattern
    (torch.nn.utils.prune): what a user of torch trains."""
    import_torch()  # skips (fails under CI) without torch
    from torch import nn
    from torch.nn.utils import prune

    layers = []
    for k, layer in enumerate(net.layers):
        lin = nn.Linear(layer.n_in, layer.n_out, dtype=torch.float64)
        dense = layer.weight.toarray()
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(dense))
            lin.bias.copy_(torch.tensor(layer.bias))
        prune.custom_from_mask(lin, "weight", torch.tensor(layer.weight.toarray() != 0))
        layers.append(lin)
        if k < net.n_layers - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _torch_train(model, x, y, name, kwargs, epochs, batch, factor=None, clip=None,
                 norms=None):
    """torch's loop: ``factor(t)`` through LambdaLR, stepped after every optimizer step;
    ``clip`` through clip_grad_norm_ (its norms appended to ``norms``)."""
    params = [p for m in model if hasattr(m, "bias") for p in (m.weight_orig, m.bias)]
    opt = getattr(torch.optim, name)(params, **kwargs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor) if factor else None
    xt, yt = torch.tensor(x), torch.tensor(y)
    for _ in range(epochs):
        for s in range(0, len(x), batch):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xt[s:s + batch]), yt[s:s + batch])
            loss.backward()
            if clip is not None:
                norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
            opt.step()
            if sched is not None:
                sched.step()
    return [m for m in model if hasattr(m, "bias")]


def _assert_same_weights(trained, linears, tol=1e-9):
    for ours, lin in zip(trained.layers, linears):
        w = (lin.weight_orig * lin.weight_mask).detach().numpy()
        np.testing.assert_allclose(ours.weight.toarray(), w, rtol=0, atol=tol)
        np.testing.assert_allclose(ours.bias, lin.bias.detach().numpy(), rtol=0, atol=tol)


@pytest.mark.parametrize("case", ["sgd-momentum", "sgd-nesterov", "adam", "adam-decay",
                                  "adamw-decay", "rmsprop-all", "rmsprop-momentum",
                                  "adagrad-all"])
def test_training_equals_torch_on_the_same_masked_network(case):
    """Two epochs of the serial reference and of torch (prune masks, batches in file order,
    the last one smaller): the same weights within 1e-9."""
    config, name, kwargs = CASES[case]
    net = small_network((12, 16, 10, 5), fan_in=4, seed=3, bias_scale=0.3)
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((30, 12)), rng.integers(0, 5, 30)
    trained, _ = train(net, Dataset(name="t", x_train=x, y_train=y), 2, 8, config,
                       shuffle=False)
    linears = _torch_train(_masked_torch_model(net), x, y, name, kwargs, 2, 8)
    _assert_same_weights(trained, linears)  # lin.weight is the last forward's: weight_orig
    moved = np.abs(trained.layers[0].weight.data - net.layers[0].weight.data).max()
    assert moved > 1e-3


def test_every_optimizer_resumes_from_its_state_by_name():
    """Three steps, the state saved by name and given to a new optimizer, three more: the
    same as six in one go."""
    rng = np.random.default_rng(2)
    grads = [[rng.standard_normal(20), rng.standard_normal(3)] for _ in range(6)]
    for name, cls in OPTIMIZERS.items():
        config = cls.Config()
        once, twice = [np.ones(20), np.ones(3)], [np.ones(20), np.ones(3)]
        whole = make(config, once)
        for g in grads:
            whole.step(g)
        first = make(config, twice)
        for g in grads[:3]:
            first.step(g)
        saved = SavedState.of(first)
        assert saved.name == name and saved.steps == 3
        second = make(config, twice, SavedState(name, 3, [{k: v.copy() for k, v in s.items()}
                                                          for s in saved.state]))
        for g in grads[3:]:
            second.step(g)
        for a, b in zip(once, twice):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name, given, field", [
    ("adam", dict(betas=(0.9, 1.0)), "betas"),
    ("adam", dict(betas=(0.9,)), "betas"),
    ("adam", dict(eps=0.0), "eps"),
    ("adam", dict(lr=-1.0), "lr"),
    ("adam", dict(momentum=0.9), "momentum"),
    ("sgd", dict(betas=(0.9, 0.99)), "betas"),
    ("sgd", dict(nesterov=True, momentum=0.0), "nesterov"),
    ("sgd", dict(weight_decay=float("inf")), "weight_decay"),
    ("lion", {}, "optimizer"),
])
def test_bad_settings_are_refused_by_name(name, given, field):
    with pytest.raises(OptionError) as err:
        config_of(name, **given)
    assert err.value.name == field
    if field == "optimizer":
        assert "sgd, adam" in str(err.value)


def test_defaults_are_torchs():
    """Every optimizer's defaults are torch's, setting by setting; SGD, which has no rate in
    torch, keeps spdnn's. Each maps to the torch.optim class it names."""
    import inspect
    from dataclasses import fields

    from spdnn.optim import torch_optimizer

    for name, cls in OPTIMIZERS.items():
        ours = cls.Config()
        sig = inspect.signature(getattr(torch.optim, cls.TORCH).__init__)
        for f in fields(ours):
            if (name, f.name) == ("sgd", "lr") or (name, f.name) == ("sgd", "momentum"):
                continue  # spdnn's own: torch.optim.SGD has no rate, and no momentum by default
            assert getattr(ours, f.name) == sig.parameters[f.name].default, (name, f.name)
        made = torch_optimizer(ours, [torch.zeros(2, requires_grad=True)])
        assert type(made).__name__ == cls.TORCH
    assert parameters([]) == []


def _lambda(kind, warmup, total, lr, min_lr=0.0, step_size=None, gamma=0.1):
    """The issue's formulas, written out for torch's LambdaLR."""
    import math

    def f(t):
        if t < warmup:
            return (t + 1) / warmup
        if kind == "step":
            return gamma ** ((t - warmup) // step_size)
        if kind == "cosine":
            m = min_lr / lr
            return m + (1 - m) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup))) / 2
        return 1.0
    return f


@pytest.mark.parametrize("kind, extra", [
    ("constant", {}), ("step", dict(step_size=3, gamma=0.5)), ("cosine", dict(min_lr=0.001))])
@pytest.mark.parametrize("case", ["sgd-momentum", "adamw-decay"])
def test_schedules_and_clipping_equal_torchs(kind, extra, case):
    """Three epochs of 4 steps (T = 12) with 3 warm-up steps and clipping at 0.5: torch's
    LambdaLR and clip_grad_norm_ give the same weights within 1e-9, and the epochs report
    torch's mean norms and the steps it clipped."""
    from spdnn.model.schedule import Schedule

    config, name, kwargs = CASES[case]
    net = small_network((12, 16, 10, 5), fan_in=4, seed=3, bias_scale=0.3)
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((30, 12)), rng.integers(0, 5, 30)
    schedule = Schedule(kind=kind, warmup_steps=3, **extra)
    trained, reports = train(net, Dataset(name="t", x_train=x, y_train=y), 3, 8, config,
                             shuffle=False, schedule=schedule, clip_grad_norm=0.5)
    norms: list[float] = []
    linears = _torch_train(_masked_torch_model(net), x, y, name, kwargs, 3, 8,
                           _lambda(kind, 3, 12, config.lr, **extra), 0.5, norms)
    _assert_same_weights(trained, linears)
    for e, r in enumerate(reports):
        mine = norms[4 * e:4 * e + 4]
        assert r.gradient_norm == pytest.approx(np.mean(mine), rel=1e-12)
        assert r.clipped_steps == sum(n > 0.5 + 1e-6 for n in mine)
    assert sum(r.clipped_steps for r in reports) > 0


def test_a_warm_up_longer_than_the_job_is_refused():
    from spdnn.model.schedule import Schedule

    net = small_network()
    data = Dataset(name="t", x_train=np.zeros((10, 12)), y_train=np.zeros(10, dtype=int))
    with pytest.raises(OptionError, match="warmup_steps 7 is longer than the job's 6 steps"):
        train(net, data, 2, 4, SGDConfig(), schedule=Schedule(warmup_steps=7))
    with pytest.raises(OptionError, match="min_lr 0.1 is above the rate 0.05"):
        train(net, data, 2, 4, SGDConfig(), schedule=Schedule(kind="cosine", min_lr=0.1))
    for bad, field in ((dict(kind="linear"), "lr_schedule"), (dict(kind="step"), "step_size"),
                       (dict(step_size=3), "step_size"), (dict(min_lr=-1.0), "min_lr"),
                       (dict(warmup_steps=-1), "warmup_steps"), (dict(gamma=0.0), "gamma")):
        with pytest.raises(OptionError) as err:
            Schedule(**bad)
        assert err.value.name == field


def test_dropout_is_torchs_inverted_dropout_with_the_same_masks():
    """Two epochs with dropout 0.5 and 0.3 on the hidden layers: torch, multiplying each
    hidden output by the same masks (as nn.Dropout multiplies by its Bernoulli draws over
    1 - p), gives the same weights; the masks drop about p of the entries."""
    from spdnn.model.batching import batch_order, batches
    from spdnn.model.counters import Dropout

    config, name, kwargs = CASES["adam-decay"]
    net = small_network((12, 16, 10, 5), fan_in=4, seed=3, bias_scale=0.3)
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((30, 12)), rng.integers(0, 5, 30)
    drop = Dropout((0.5, 0.3), seed=11)
    trained, _ = train(net, Dataset(name="t", x_train=x, y_train=y), 2, 8, config,
                       seed=11, dropout=drop)
    model = _masked_torch_model(net)
    params = [p for m in model if hasattr(m, "bias") for p in (m.weight_orig, m.bias)]
    opt = getattr(torch.optim, name)(params, **kwargs)
    linears = [m for m in model if hasattr(m, "bias")]
    step, kept = 0, []
    for epoch in range(2):
        for idx in batches(batch_order(30, epoch, 11, True), 8):
            h = torch.tensor(x[idx])
            for k, lin in enumerate(linears, start=1):
                h = lin(h)
                if k < len(linears):
                    # spdnn's draws decide which entries stay; the scale is torch's own,
                    # 1 / (1 - p), computed here from the rate
                    mask = drop.mask(step, k, np.arange(lin.out_features), idx, np.float64)
                    keep = mask > 0
                    kept.append(np.mean(keep))
                    h = torch.relu(h) * torch.tensor(keep.T / (1 - drop.rates[k - 1]))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(h, torch.tensor(y[idx])).backward()
            opt.step()
            step += 1
    _assert_same_weights(trained, linears)
    assert 0.4 < np.mean(kept[::2]) < 0.6 and 0.6 < np.mean(kept[1::2]) < 0.8
    for layer, p in ((1, 0.5), (2, 0.3)):
        np.testing.assert_allclose(np.unique(drop.mask(0, layer, np.arange(16), np.arange(8),
                                                       np.float64)), [0, 1 / (1 - p)],
                                   rtol=1e-15)


def test_dropout_masks_depend_on_the_sample_not_on_who_draws_them():
    """A neuron's draw for a sample is the same whichever rows and samples are asked with it,
    and differs between steps, layers and seeds."""
    from spdnn.model.counters import uniform

    whole = uniform(3, "dropout", 5, 2, np.arange(40), np.arange(100, 164))
    part = uniform(3, "dropout", 5, 2, np.array([7, 30]), np.array([150, 101]))
    np.testing.assert_array_equal(part, whole[np.ix_([7, 30], [50, 1])])
    for other in (uniform(4, "dropout", 5, 2, np.arange(40), np.arange(100, 164)),
                  uniform(3, "dropout", 6, 2, np.arange(40), np.arange(100, 164)),
                  uniform(3, "dropout", 5, 3, np.arange(40), np.arange(100, 164))):
        assert np.mean(other == whole) < 0.01
    assert 0.45 < whole.mean() < 0.55 and whole.min() >= 0 and whole.max() < 1


def test_the_validation_split_is_the_last_samples_in_file_order():
    from spdnn.io.dataset import split_validation

    x, y = np.arange(40.0).reshape(10, 4), np.arange(10) % 3
    data = split_validation(Dataset(name="t", x_train=x, y_train=y), 0.25)
    np.testing.assert_array_equal(data.x_validation, x[7:])  # ceil(2.5) = 3 held out
    np.testing.assert_array_equal(data.y_train, y[:7])
    assert len(split_validation(Dataset(name="t", x_train=x, y_train=y), 0.01).y_validation) == 1
    for n, f in ((10, 0.99), (1, 0.5)):
        with pytest.raises(OptionError, match="leaves"):
            split_validation(Dataset(name="t", x_train=x[:n], y_train=y[:n]), f)


@pytest.mark.parametrize("args, fragment", [
    (["--optimizer", "lion"], "--optimizer: must be one of sgd, adam, adamw"),
    (["--optimizer", "adam", "--betas", "0.9,1.0"],
     "--betas: must be two numbers in [0, 1), not 0.9,1.0"),
    (["--optimizer", "adamw", "--eps", "0"], "--eps: must be a finite number > 0, not 0"),
    (["--warmup-steps", "1000"], "--warmup-steps 1000 is longer than the job's 23 steps"),
    (["--clip-grad-norm", "0"], "--clip-grad-norm: must be a finite number > 0, not 0"),
    (["--dropout", "1"], "--dropout: must be a rate in [0, 1) or one per hidden layer, not 1"),
    (["--dropout", "0.1,0.2,0.3"], "--dropout lists 3 rates for 2 hidden layers"),
    (["--validation-split", "0.9999"],
     "--validation-split 0.9999 of 1437 training samples leaves 0"),
    (["--momentum", "0.9", "--optimizer", "adam"], "--momentum is not a setting of adam"),
])
def test_bad_recipe_options_are_one_line_naming_the_flag(tmp_path, args, fragment):
    """The command line's errors name the flag (the API's name the keyword: above); nothing is
    written."""
    from spdnn.io.bundle import save_network
    from spdnn.model.generate import random_network
    from tests.helpers import assert_one_line_error, launch

    save_network(random_network([64, 32, 32], 8, seed=0, head=10), tmp_path / "n.npz")
    proc = launch(0, "train", "--network", tmp_path / "n.npz", "--epochs", "1",
                  "--save", tmp_path / "t.npz", *args)
    assert_one_line_error(proc, fragment)
    assert not (tmp_path / "t.npz").exists()


def test_a_manifest_naming_another_optimizer_than_its_state_is_refused(tmp_path):
    """The optimizer a manifest names must be the one whose state the rank files hold: adam's
    checkpoint relabelled sgd, sgd's relabelled adam, and an optimizer spdnn does not know are
    each one line, exit 2, never a traceback or a silent resume."""
    import json

    from spdnn.io.bundle import save_network
    from spdnn.model.generate import random_network
    from tests.helpers import assert_one_line_error, run_spdnn

    save_network(random_network([64, 24, 10], 8, seed=3), tmp_path / "net.npz")
    common = ["train", "--network", tmp_path / "net.npz", "--data", "digits", "--epochs", "1"]
    for written, relabel, fragment in (
            ("adam", "sgd", "the rank files hold optimizer state exp_avg, exp_avg_sq, but sgd "
                            "keeps none"),
            ("sgd", "adam", "hold optimizer state momentum_buffer, but adam keeps exp_avg, "
                            "exp_avg_sq"),
            ("sgd", "lion", "'optimizer' must be one of sgd, adam, adamw")):
        ckpt = tmp_path / f"{written}-{relabel}"
        lr = ["--lr", "0.01"]
        proc = run_spdnn(*common, "--optimizer", written, *lr, "--max-steps", "3",
                         "--checkpoint-dir", ckpt)
        assert proc.returncode == 0, proc.stderr
        manifest = json.loads((ckpt / "manifest.json").read_text())
        manifest["optimizer"] = relabel
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        runs = relabel if relabel != "lion" else "sgd"
        proc = run_spdnn(*common, "--optimizer", runs, *lr, "--max-steps", "5", "--resume",
                         ckpt)
        assert_one_line_error(proc, "manifest.json", fragment)


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("lr_schedule", "exponential", "'lr_schedule' must be one of"),
    ("dtype", "float16", "'dtype' must be one of"),
    ("replan", "sometimes", "'replan' must be never, auto or every:K"),
    ("update_every", 0, "update_every"),
    ("dropout", [0.1, 0.1, 0.1], "'dropout' must hold one rate per hidden layer (1), not 3"),
    ("files", "twice", "'files' names one rank file twice"),
    ("step", 10**12, "step 1000000000000 at epoch 0 is more steps than 1 epoch(s)"),
    ("momentum", -0.5, "'momentum' must be a finite number >= 0, not -0.5"),
    ("betas", [0.9, 1.5], "'betas' must be two numbers in [0, 1)"),
    ("nesterov", "yes", "'nesterov' must be True or False"),
    ("batch_size", 0, "'batch_size' must be a positive integer, not 0"),
    ("moemntum", 0.9, "unknown field 'moemntum'"),
    ("grow_locality_x", 1.0, "unknown field 'grow_locality_x'"),
])
def test_manifest_values_are_checked_against_what_they_may_be(tmp_path, field, value,
                                                               fragment):
    """Each manifest value is one the run could have written (each run setting checked by its
    option's declaration), the values agree with each other, and a field no option declares
    is refused, not dropped; otherwise one line naming the manifest, even under
    --resume-with-changes."""
    import json

    from spdnn.io.bundle import save_network
    from spdnn.model.generate import random_network
    from tests.helpers import assert_one_line_error, run_spdnn

    save_network(random_network([64, 24, 10], 8, seed=3), tmp_path / "net.npz")
    common = ["train", "--network", tmp_path / "net.npz", "--data", "digits", "--epochs", "1"]
    ckpt = tmp_path / "ckpt"
    proc = run_spdnn(*common, "--max-steps", "3", "--checkpoint-dir", ckpt)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((ckpt / "manifest.json").read_text())
    if field == "files":
        manifest["nparts"] = 2
        manifest["files"] = manifest["files"] * 2
    else:
        manifest[field] = value
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    proc = run_spdnn(*common, "--max-steps", "5", "--resume", ckpt, "--resume-with-changes")
    assert_one_line_error(proc, "manifest.json", fragment)


@pytest.mark.parametrize(("given", "python", "flags"), [
    (dict(checkpoint_every=5), "checkpoint_every needs checkpoint_dir",
     "--checkpoint-every needs --checkpoint-dir"),
    (dict(lsh="2:6:50", optimizer="adamw"), "lsh does not apply with adamw here yet: its "
     "sampled rows are updated lazily", "--lsh does not apply with adamw here yet"),
    (dict(shuffle=False, save_best="best.npz"), "save_best needs validation_split",
     "--save-best needs --validation-split"),
    (dict(min_delta=0.01), "min_delta needs early_stopping",
     "--min-delta needs --early-stopping"),
    (dict(critical_set=0.5, lr_schedule="cosine"), "lr_schedule and warmup_steps do not apply "
     "with critical_set yet", "--lr-schedule and --warmup-steps do not apply with "
                             "--critical-set yet"),
])
def test_checks_that_join_options_name_each_in_the_callers_terms(given, python, flags):
    """A check over several options names every one: by keyword in Python, by flag on the
    command line (spdnn.errors.options_named_by_flag, as the command runs)."""
    import spdnn
    from spdnn.errors import options_named_by_flag
    from spdnn.model.options import check_train_options

    with pytest.raises(OptionError) as err:
        check_train_options(spdnn.TrainOptions(**given))
    assert str(err.value).startswith(python), str(err.value)
    with options_named_by_flag():
        assert str(err.value).startswith(flags), str(err.value)


def test_a_grown_weights_state_starts_where_the_optimizers_does():
    """After a topology update a grown weight's state starts afresh: at zero, and Adagrad's
    sum at its initial_accumulator_value (as torch.optim.Adagrad starts every sum); a kept
    weight keeps its own."""
    p = np.ones(4)
    opt = make(AdagradConfig(initial_accumulator_value=0.25), [p])
    opt.step([np.full(4, 2.0)])
    opt.resize(0, np.ones(3), np.array([2, -1, 0]))
    np.testing.assert_array_equal(opt.state[0]["sum"], [4.25, 0.25, 4.25])
    sgd = make(SGDConfig(), [np.ones(2)])
    sgd.step([np.ones(2)])
    sgd.resize(0, np.ones(2), np.array([-1, 1]))
    np.testing.assert_array_equal(sgd.state[0]["momentum_buffer"], [0.0, 1.0])


@pytest.mark.parametrize("extra", ["notes", "w9", "exp_avg.w0", "rows3x"])
def test_a_rank_file_array_the_format_does_not_define_is_refused(tmp_path, extra):
    """A rank file holding an array the checkpoint format does not define (or one for a layer
    the network does not have) is refused in one line naming the file, not ignored."""
    from spdnn.io.bundle import save_network
    from spdnn.model.generate import random_network
    from tests.helpers import assert_one_line_error, run_spdnn

    save_network(random_network([64, 24, 10], 8, seed=3), tmp_path / "net.npz")
    common = ["train", "--network", tmp_path / "net.npz", "--data", "digits", "--epochs", "1"]
    ckpt = tmp_path / "ckpt"
    proc = run_spdnn(*common, "--max-steps", "3", "--checkpoint-dir", ckpt)
    assert proc.returncode == 0, proc.stderr
    rank_file = sorted(ckpt.glob("step*-rank00000.npz"))[0]
    with np.load(rank_file) as z:
        arrays = dict(z)
    np.savez(rank_file, **arrays, **{extra: np.zeros(3)})
    proc = run_spdnn(*common, "--max-steps", "5", "--resume", ckpt)
    assert_one_line_error(proc, rank_file.name, f"holds an array '{extra}'")


def test_a_checkpoint_records_every_declared_setting_and_nothing_else():
    """What a run records (TrainConfig.settings) is what the options declare: only declared
    options and the facts the format derives; every option declared ``record="same"``
    (dtype aside: the checkpoint adds the network's) where it applies (a schedule's settings
    under a schedule, the updates' under updates), and the chosen optimizer's settings."""
    import spdnn
    from spdnn.io.checkpoint_format import DERIVED
    from spdnn.io.jsonfiles import recorded_options
    from spdnn.jobs.train import _config
    from spdnn.model.options import UPDATE_SETTINGS
    from spdnn.optim import OPTIMIZERS

    declared = recorded_options()
    same = {k for k, o in declared.items() if o.record == "same"} - {"dtype"}
    optimizer_settings = {k for cls in OPTIMIZERS.values()
                          for k in cls.Config.__dataclass_fields__}
    scheduled = {"min_lr", "step_size", "gamma"}
    for given in (dict(), dict(optimizer="rmsprop", centered=True, lr_schedule="cosine",
                               dropout=0.1, sparse_update="set", clip_grad_norm=1.0,
                               validation_split=0.2),
                  dict(optimizer="adam", weight_decay=0.0, lsh="2:6:50")):
        cfg = _config(spdnn.TrainOptions(**given))
        got = set(cfg.settings())
        assert got <= set(declared) | set(DERIVED), got - set(declared) - set(DERIVED)
        applies = same - optimizer_settings
        if "sparse_update" not in given:
            applies -= set(UPDATE_SETTINGS)
        if "lr_schedule" not in given:
            applies -= scheduled
        mine = set(OPTIMIZERS[given.get("optimizer", "sgd")].Config.__dataclass_fields__)
        assert applies | mine <= got, (applies | mine) - got
