"""Horovod 0.28.1's own optimizer scenarios (test/parallel/test_torch.py) on real ranks, each
run twice in this worker: with Horovod's dense allreduce and with a lossless DeepReduce. The
two runs must agree (rtol 1e-5: DeepReduce sums ranks in rank order, Horovod's ring in its
own), ranks that reduce together must hold identical parameters, and where Horovod raises,
DeepReduce must raise the same. Run by tests/test_horovod_scenarios.py.

Process sets: even ranks [0, 2, ...] and odd ranks [1, 3, ...], registered at hvd.init (or,
with HOROVOD_DYNAMIC_PROCESS_SETS=1, added after it with hvd.add_process_set, as Horovod's own
test does). On 2 ranks each is a 1-rank set; the checks bite on 4.

Each scenario is a check_* function (tests/workers/harness.py runs them, records each rank's
outcome and ends the worker when one raises or hangs).
"""
import inspect
import os
import tempfile
import warnings

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

import harness
from deepreduce_hvd.torch import DeepReduce
from harness import DENSE, assert_close, assert_compressed, both, same_within

EVEN, ODD = harness.init_with_process_sets(hvd)
rank, size = hvd.rank(), hvd.size()
harness.bind(hvd)
THIS_SET = EVEN if rank % 2 == 0 else ODD
RTOL, ATOL = 1e-5, 1e-6


def lossless():
    """Every float tensor (min_size=1) exactly through DeepReduce's sparse allgather."""
    return DeepReduce(sparsifier="none", index="entropy", value="raw", min_size=1)


def compression_for(kind):
    return hvd.Compression.none if kind == DENSE else lossless()


def snapshot(model):
    return {n: p.detach().clone().numpy() for n, p in model.state_dict().items()}


def expect_same_error(build, what):
    """Horovod raises for this construction: so must it with DeepReduce, with the same type."""
    errors = []
    for kind in (DENSE, "deepreduce"):
        try:
            build(compression_for(kind))
        except Exception as exc:  # noqa: BLE001 -- compared below
            errors.append(exc)
        else:
            errors.append(None)
    assert errors[0] is not None, f"{what}: Horovod did not raise"
    assert type(errors[1]) is type(errors[0]), (what, errors)
    return errors


# ---------------------------------------------------------------------------------------------
# process sets: test_optimizer_process_sets, allreduce/grouped_allreduce with process_set
# ---------------------------------------------------------------------------------------------

def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(100, 10), torch.nn.ReLU(), torch.nn.Linear(10, 10))


def train_mlp(kind, process_set, steps=3, distributed=True, **kwargs):
    """test_optimizer_process_sets' model and SGD (momentum, weight decay), rank-own data."""
    model = mlp(seed=rank)  # different weights per rank until broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=0.1)
    compression = compression_for(kind)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=compression, process_set=process_set,
                                       **kwargs)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(kwargs.get("backward_passes_per_step", 1)):
            x, y = torch.randn(64, 100, generator=gen), torch.randn(64, 10, generator=gen)
            F.mse_loss(model(x), y, reduction="sum").backward()
        opt.step()
    return snapshot(model), compression


def verify_process_set_result(dense, drr, compression, process_set, what):
    """DeepReduce == dense; inside the set the ranks agree (and, in a set of several ranks,
    differ from local training); outside it, Horovod leaves the rank to train alone and
    DeepReduce is never called."""
    assert_close(dense, drr, what)
    local, _ = train_mlp(DENSE, process_set, distributed=False)
    if process_set.included():
        assert_compressed(compression, what)
        if process_set.size() > 1:
            assert any(not np.allclose(local[k], drr[k]) for k in local), what
        else:
            assert_close(local, drr, what + " (1-rank set)")
    else:
        assert_close(local, drr, what + " (outside the set)")
        assert compression.stats()["tensors_compressed"] == 0, compression.stats()
    members = process_set.ranks
    same_within(drr, what, groups=[members] + [[r] for r in range(size) if r not in members])


def check_grouped_allreduce_process_sets():
    """hvd.grouped_allreduce with process_set= and DeepReduce, named (Horovod names the members
    <name>.0, .1, ...) and unnamed, with members of different and of equal shapes. (Stops at
    the first failing case: a failure inside compress leaves an earlier member's payload
    allgather in flight, after which the ranks' collectives need not line up.)"""
    gen = torch.Generator().manual_seed(11 + rank)
    for op in (hvd.Average, hvd.Sum):
        for ps_name, ps in (("this", THIS_SET), ("global", hvd.global_process_set)):
            for shapes in (((20,), (3, 4)), ((6, 5), (6, 5), (30,))):
                for named in (False, True):
                    case = f"op={op} process_set={ps_name} {ps.ranks} shapes={shapes} named={named}"
                    tag = f"{ps_name}.{op}.{len(shapes)}.{named}"
                    tensors = [torch.randn(*shape, generator=gen) for shape in shapes]
                    want = hvd.grouped_allreduce(tensors, op=op, process_set=ps,
                                                 name=f"gdense.{tag}" if named else None)
                    compression = lossless()
                    try:
                        got = hvd.grouped_allreduce(tensors, op=op, process_set=ps,
                                                    name=f"gdr.{tag}" if named else None,
                                                    compression=compression)
                    except Exception as exc:
                        raise AssertionError(f"{case}: {type(exc).__name__}: {exc}") from exc
                    for i, (w, g) in enumerate(zip(want, got)):
                        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=RTOL, atol=ATOL,
                                                   err_msg=f"{case}: member {i}")
                    stats = compression.stats()
                    assert stats["tensors_compressed"] == len(shapes), (case, stats)


def check_optimizer_process_sets():
    """Horovod's test: every rank builds the optimizer with process_set=even_set and steps;
    even ranks reduce over the even set, odd ranks train alone (also with groups=2: Horovod
    broadcasts the grouping from rank 0 over the set, so only a set holding rank 0 can group).
    Then each rank on its own set, the even and the odd set reducing at the same time: plain,
    op=Sum, backward_passes_per_step=2."""
    for kwargs in (dict(), dict(groups=2)):
        what = f"even_set{kwargs}"
        dense, (drr, compression) = (train_mlp(DENSE, EVEN, **kwargs)[0],
                                     train_mlp("deepreduce", EVEN, **kwargs))
        verify_process_set_result(dense, drr, compression, EVEN, what)
    for kwargs in (dict(), dict(op=hvd.Sum), dict(backward_passes_per_step=2)):
        what = f"this_set{kwargs}"
        dense, (drr, compression) = (train_mlp(DENSE, THIS_SET, **kwargs)[0],
                                     train_mlp("deepreduce", THIS_SET, **kwargs))
        assert_close(dense, drr, what)
        assert_compressed(compression, what)
        same_within(drr, what, groups=[EVEN.ranks, ODD.ranks])
        if size >= 4:  # the even and the odd set reduced different data
            everyone = hvd.allgather_object(drr["2.weight"])
            assert not np.allclose(everyone[0], everyone[1]), what


def check_allreduce_process_sets():
    """hvd.allreduce / grouped_allreduce with process_set= and DeepReduce: the payload travels
    on the caller's set; an explicit DeepReduce(process_set=) must match it."""
    gen = torch.Generator().manual_seed(7 + rank)
    for op in (hvd.Average, hvd.Sum):
        for shape in ((33, 7), (1,), (5,)):
            t = torch.randn(*shape, generator=gen)
            for ps_name, ps in (("this", THIS_SET), ("global", hvd.global_process_set)):
                tag = f"{ps_name}.{op}.{shape}"
                want = hvd.allreduce(t, op=op, process_set=ps, name=f"dense.{tag}")
                compression = lossless()
                got = hvd.allreduce(t, op=op, process_set=ps, name=f"dr.{tag}",
                                    compression=compression)
                np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL,
                                           err_msg=tag)
                assert_compressed(compression, tag)
                same_within({"t": got.numpy()}, tag,
                                   groups=[EVEN.ranks, ODD.ranks] if ps is THIS_SET else None)
    t = torch.randn(40, generator=gen)
    explicit = DeepReduce(sparsifier="none", index="entropy", value="raw", min_size=1,
                          process_set=THIS_SET)
    got = hvd.allreduce(t, process_set=THIS_SET, name="explicit", compression=explicit)
    want = hvd.allreduce(t, process_set=THIS_SET, name="explicit.dense")
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)
    # a DeepReduce pinned to one set, handed a global allreduce: refused on every rank, locally
    try:
        hvd.allreduce(t, name="wrong.set", compression=explicit)
    except Exception as exc:  # noqa: BLE001
        assert "process set" in str(exc), exc
    else:
        raise AssertionError("DeepReduce(process_set=this set) accepted a global allreduce")


# ---------------------------------------------------------------------------------------------
# test_dynamic_requires_grad, test_gradient_clipping, test_synchronize_step_warning
# ---------------------------------------------------------------------------------------------

def check_dynamic_requires_grad():
    """A generator and a discriminator, each with its own DistributedOptimizer; gradients are
    turned off and on between steps, and only the trained half steps."""
    def run(kind):
        torch.manual_seed(0)
        gen_net, disc = torch.nn.Conv2d(1, 10, 1), torch.nn.Conv2d(10, 1, 1)
        inp = torch.rand([1, 1, 20, 20], generator=torch.Generator().manual_seed(rank))
        compressions = compression_for(kind), compression_for(kind)
        gen_opt = hvd.DistributedOptimizer(torch.optim.SGD(gen_net.parameters(), lr=0.1),
                                           named_parameters=gen_net.named_parameters(),
                                           compression=compressions[0])
        disc_opt = hvd.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.1),
                                            named_parameters=disc.named_parameters(),
                                            compression=compressions[1])

        def step(train_gen):
            for p in gen_net.parameters():
                p.requires_grad_(train_gen)
            for p in disc.parameters():
                p.requires_grad_(not train_gen)
            gen_opt.zero_grad()
            disc_opt.zero_grad()
            disc(gen_net(inp)).sum().backward()
            for net, trained in ((gen_net, train_gen), (disc, not train_gen)):
                for p in net.parameters():
                    assert trained == (p.grad is not None and bool(p.grad.abs().max() > 0))
            (gen_opt if train_gen else disc_opt).step()

        for _ in range(4):
            step(True)
            step(False)
        return {**{"gen." + k: v for k, v in snapshot(gen_net).items()},
                **{"disc." + k: v for k, v in snapshot(disc).items()}}, compressions

    (dense, _), (drr, compressions) = both(run)
    assert_close(dense, drr, "dynamic_requires_grad")
    for c in compressions:
        assert_compressed(c, "dynamic_requires_grad")
    same_within(drr, "dynamic_requires_grad")


def linear_setup(kind, seed=3):
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = compression_for(kind)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    gen = torch.Generator().manual_seed(50 + rank)
    return model, opt, compression, gen


def check_gradient_clipping():
    """synchronize(), clip the reduced gradients, step under skip_synchronize(); and the
    warning when step() follows synchronize() without it."""
    def run(kind):
        model, opt, compression, gen = linear_setup(kind)
        grads = {}
        for i in range(3):
            x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.synchronize()
            grads.update({f"{i}.{n}": p.grad.clone().numpy() for n, p in model.named_parameters()})
            prior = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            clipped = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            assert prior > clipped and clipped <= 0.1 + 1e-6, (prior, clipped)
            with opt.skip_synchronize():
                opt.step()
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        messages = [str(w.message) for w in caught]
        assert any("optimizer.step() called without optimizer.skip_synchronize()" in m
                   for m in messages), messages
        return {**grads, **snapshot(model)}, compression

    (dense, _), (drr, compression) = both(run)
    assert_close(dense, drr, "gradient_clipping")
    assert_compressed(compression, "gradient_clipping")
    same_within(drr, "gradient_clipping")


# ---------------------------------------------------------------------------------------------
# test_duplicate_names, test_missing_named_parameters, test_no_named_parameters,
# test_optimizer_no_named_parameters
# ---------------------------------------------------------------------------------------------

class TwoConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 12, 1)
        self.conv2 = torch.nn.Conv2d(12, 1, 1)

    def forward(self, x):
        return self.conv2(self.conv1(x))


def check_named_parameters():
    net1, net2 = torch.nn.Conv2d(1, 1, 1), torch.nn.Conv2d(1, 1, 1)

    def duplicate(compression):
        opt = torch.optim.SGD(list(net1.parameters()) + list(net2.parameters()), lr=0.1)
        hvd.DistributedOptimizer(opt, compression=compression, named_parameters=list(
            net1.named_parameters()) + list(net2.named_parameters()))

    for exc in expect_same_error(duplicate, "duplicate names"):
        assert isinstance(exc, ValueError) and "unique" in str(exc), exc

    def missing(compression):
        model = TwoConv()
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=list(model.named_parameters())[0:1],
                                 compression=compression)

    for exc in expect_same_error(missing, "missing named parameters"):
        assert isinstance(exc, ValueError) and "not named" in str(exc), exc

    def not_tuples(compression):
        model = TwoConv()
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[p for _, p in model.named_parameters()],
                                 compression=compression)

    expect_same_error(not_tuples, "named_parameters not tuples")

    def no_names(kind):  # test_no_named_parameters: the optimizer names them allreduce.noname.*
        torch.manual_seed(0)
        model = TwoConv()
        compression = compression_for(kind)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       compression=compression)
        inp = torch.rand([1, 1, 30, 30], generator=torch.Generator().manual_seed(rank))
        for _ in range(2):
            opt.zero_grad()
            model(inp).sum().backward()
            opt.step()
        return snapshot(model), compression

    (dense, _), (drr, compression) = both(no_names)
    assert_close(dense, drr, "no_named_parameters")
    assert_compressed(compression, "no_named_parameters")
    same_within(drr, "no_named_parameters")

    def groups(kind):  # test_optimizer_no_named_parameters: two parameter groups, no names
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
        compression = compression_for(kind)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(
            [{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.05}],
            lr=0.001), compression=compression)
        names = opt._parameter_names
        assert len(names) == len(set(names.values()))
        all_names = hvd.allgather_object(sorted(names.values()), name=f"names.{kind}")
        assert all(n == all_names[0] for n in all_names), all_names
        x = torch.randn(8, 10, generator=torch.Generator().manual_seed(rank))
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
        return snapshot(model), compression

    (dense, _), (drr, compression) = both(groups)
    assert_close(dense, drr, "optimizer_no_named_parameters")
    assert_compressed(compression, "optimizer_no_named_parameters")
    same_within(drr, "optimizer_no_named_parameters")


# ---------------------------------------------------------------------------------------------
# test_sparse_embeddings
# ---------------------------------------------------------------------------------------------

def check_sparse_embeddings():
    """A sparse nn.Embedding with SparseAdam: Horovod's sparse allgather (compression not
    involved) and sparse_as_dense=True (the densified gradient goes through DeepReduce)."""
    for sparse_as_dense in (False, True):
        def run(kind):
            torch.manual_seed(0)
            model = torch.nn.Embedding(40, 6, sparse=True)
            compression = compression_for(kind)
            opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                           named_parameters=model.named_parameters(),
                                           compression=compression,
                                           sparse_as_dense=sparse_as_dense)
            gen = torch.Generator().manual_seed(rank)
            for _ in range(3):
                inp = torch.randint(0, 40, (2, 3 + rank), generator=gen)
                opt.zero_grad()
                (model(inp) * torch.arange(6.0)).sum().backward()
                opt.step()
            return snapshot(model), compression

        (dense, _), (drr, compression) = both(run)
        assert_close(dense, drr, f"sparse_embeddings(sparse_as_dense={sparse_as_dense})")
        if sparse_as_dense:
            assert_compressed(compression, "sparse_as_dense")
        same_within(drr, f"sparse_embeddings.{sparse_as_dense}")


# ---------------------------------------------------------------------------------------------
# test_broadcast_state, test_broadcast_state_options, test_broadcast_state_no_grad
# ---------------------------------------------------------------------------------------------

OPTIMIZERS = sorted(((c.__name__, c) for c in torch.optim.Optimizer.__subclasses__()
                     if c.__module__.startswith("torch.optim")
                     and c not in (torch.optim.LBFGS, torch.optim.SparseAdam)),
                    key=lambda item: item[0])


def new_optimizer(cls, params, model):
    accepted = inspect.signature(cls.__init__).parameters
    return cls(model.parameters(), **{k: v for k, v in params.items() if k in accepted})


def optimizer_state(optimizer):
    out = {}
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        for pid in group["params"]:
            for key, value in sorted(state["state"].get(pid, {}).items()):
                if torch.is_tensor(value):
                    out[f"{pid}.{key}"] = value.detach().clone().numpy()
                elif isinstance(value, (int, float)):
                    out[f"{pid}.{key}"] = np.float64(value)
    return out


def broadcast_state_once(cls, params, kind):
    """One distributed step, rank 0 checkpoints, fresh model and optimizer, rank 0 loads,
    broadcast_parameters + broadcast_optimizer_state, then another distributed step."""
    def create(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(30, 10), torch.nn.ReLU(),
                                    torch.nn.Linear(10, 10))
        compression = compression_for(kind)
        opt = hvd.DistributedOptimizer(new_optimizer(cls, params, model),
                                       named_parameters=model.named_parameters(),
                                       compression=compression)
        return model, opt, compression

    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 30, generator=gen), torch.randn(64, 10, generator=gen)
    model, opt, compression = create(seed=rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt.zero_grad()
    F.mse_loss(model(x), y, reduction="mean").backward()
    opt.step()
    after_step = {**snapshot(model), **{"opt." + k: v for k, v in optimizer_state(opt).items()}}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt.pt")
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
        model, opt, compression2 = create(seed=1000 + rank)
        if rank == 0:
            checkpoint = torch.load(path)
            model.load_state_dict(checkpoint["model"])
            opt.load_state_dict(checkpoint["optimizer"])
    expected = hvd.broadcast_object(len(opt.state_dict()["state"]), root_rank=0,
                                    name=f"nstate.{cls.__name__}.{kind}")
    # a rank without state takes a zero-gradient step of the wrapped optimizer to create it
    # (weight decay moves its weights): parameters are broadcast after the state
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert len(opt.state_dict()["state"]) == expected
    restored = {**snapshot(model), **{"opt." + k: v for k, v in optimizer_state(opt).items()}}
    root = hvd.broadcast_object(after_step, root_rank=0, name=f"root.{cls.__name__}.{kind}")
    assert root.keys() == restored.keys(), (sorted(root), sorted(restored))
    for key in root:  # every rank now holds rank 0's checkpoint exactly
        np.testing.assert_array_equal(restored[key], root[key], err_msg=f"{cls.__name__} {key}")
    opt.zero_grad()
    F.mse_loss(model(x), y, reduction="mean").backward()
    opt.step()
    final = {**snapshot(model), **{"opt." + k: v for k, v in optimizer_state(opt).items()}}
    return {**{"step1." + k: v for k, v in after_step.items()},
            **{"step2." + k: v for k, v in final.items()}}, (compression, compression2)


def check_broadcast_state():
    # Horovod's hyperparameters at a smaller rate (and a mean loss) so that a few steps stay
    # well-conditioned: the two runs differ only by the order ranks are summed in
    param_sets = [dict(lr=0.02, momentum=0.9, weight_decay=0.1, centered=True), dict(lr=0.02)]
    covered = []
    for (name, cls), params in ((o, p) for o in OPTIMIZERS for p in param_sets):
        try:  # torch itself refuses some (Muon takes only 2-D parameters): not Horovod's concern
            new_optimizer(cls, params, torch.nn.Linear(3, 3))
        except (ValueError, TypeError, RuntimeError):
            continue
        print(f"broadcast_state {name}{params}", flush=True)
        dense, _ = broadcast_state_once(cls, params, DENSE)
        drr, compressions = broadcast_state_once(cls, params, "deepreduce")
        assert_close(dense, drr, f"broadcast_state {name}{params}")
        for c in compressions:
            assert_compressed(c, name)
        step2 = {k: v for k, v in drr.items() if k.startswith("step2.")}
        same_within(step2, f"broadcast_state.{name}.{len(params)}")
        covered.append(name)
    assert {"SGD", "Adam", "RMSprop", "Adagrad"} <= set(covered), covered
    broadcast_state_options()
    broadcast_state_no_grad()


def broadcast_state_options():
    """Per-rank hyperparameters: after broadcast_optimizer_state every rank has rank 0's, and
    the next steps run (test_broadcast_state_options)."""
    params_0 = dict(lr=0.1, momentum=0.8, weight_decay=0.2, nesterov=True,
                    betas=(0.9, 0.999), etas=(0.8, 2.4), step_sizes=(1e-5, 100))
    params_1 = dict(lr=0.2, momentum=0.9, weight_decay=0.1, nesterov=False,
                    betas=(0.8, 0.9), etas=(0.25, 1.75), step_sizes=(1e-7, 5))
    for name, cls in (("SGD", torch.optim.SGD), ("Adam", torch.optim.Adam),
                      ("Rprop", torch.optim.Rprop)):
        def run(kind):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(30, 10), torch.nn.ReLU(),
                                        torch.nn.Linear(10, 10))
            compression = compression_for(kind)
            opt = hvd.DistributedOptimizer(
                new_optimizer(cls, params_0 if rank == 0 else params_1, model),
                named_parameters=model.named_parameters(), compression=compression)
            gen = torch.Generator().manual_seed(rank)
            x, y = torch.randn(64, 30, generator=gen), torch.randn(64, 10, generator=gen)
            opt.zero_grad()
            F.mse_loss(model(x), y, reduction="mean").backward()
            opt.step()
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            accepted = inspect.signature(cls.__init__).parameters
            for key, want in params_0.items():
                if key in accepted:
                    got = opt.param_groups[0][key]
                    np.testing.assert_allclose(np.asarray(got, dtype=float),
                                               np.asarray(want, dtype=float), atol=1e-5)
            opt.zero_grad()
            F.mse_loss(model(x), y, reduction="mean").backward()
            opt.step()
            return snapshot(model), compression

        (dense, _), (drr, compression) = both(run)
        assert_close(dense, drr, f"broadcast_state_options {name}")
        assert_compressed(compression, name)
        same_within(drr, f"broadcast_state_options.{name}")


def broadcast_state_no_grad():
    """An integer parameter that needs no gradient next to a float one
    (test_broadcast_state_no_grad)."""
    class ModelNoGrad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32),
                                        requires_grad=False)
            self.b = torch.nn.Parameter(torch.rand(4))

        def forward(self, x):
            return torch.index_select(self.b, 0, self.a.long()) * x

    def run(kind):
        torch.manual_seed(rank)
        model = ModelNoGrad()
        compression = compression_for(kind)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01, weight_decay=1e-6, momentum=0.9,
                            nesterov=True),
            named_parameters=model.named_parameters(), compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert opt.param_groups[0]["params"][0].grad is None
        grad = opt.param_groups[0]["params"][1].grad
        assert torch.equal(grad, hvd.broadcast(grad, root_rank=0, name=f"nograd.{kind}"))
        x = torch.randn(2, generator=torch.Generator().manual_seed(rank))
        for _ in range(2):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        return snapshot(model), compression

    (dense, _), (drr, compression) = both(run)
    assert_close(dense, drr, "broadcast_state_no_grad")
    assert_compressed(compression, "broadcast_state_no_grad")
    same_within(drr, "broadcast_state_no_grad")


if __name__ == "__main__":
    harness.main(globals(), finish=hvd.barrier)
