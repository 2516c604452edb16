"""The language-model trainer's CUDA-graph step (cuda_graph / `hgrn2 train --cuda-graph`): what it refuses, the
captured step's body against the trainer's eager step (CPU), the learning rate a capturable optimiser reads in
place, and on a GPU the graphed run against the eager one and its exact resume."""

import pytest
import torch

from hgrn2.cli import main
from hgrn2.train.config import make_config
from hgrn2.train.graphed import GraphedStep, train_step
from hgrn2.train.optim import build_optimizer, set_capturable, set_lr
from tests.train.helpers import base_overrides, losses, make_corpus

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus") / "data")


def test_cuda_graph_refuses_what_it_does_not_support(data, tmp_path, capsys):
    with pytest.raises(ValueError, match="cuda_graph needs a CUDA device, got device=cpu"):
        make_config(None, ["data=d", "cuda_graph=true", "device=cpu"])
    for key in ("compile", "activation_checkpointing"):
        with pytest.raises(ValueError, match=f"cuda_graph cannot be combined with {key}=true"):
            make_config(None, ["data=d", "cuda_graph=true", "device=cuda", f"{key}=true"])
    assert make_config(None, ["data=d", "cuda_graph=true"]).cuda_graph is True  # device=auto: checked by the trainer
    assert make_config(None, ["data=d"]).cuda_graph is None  # automatic: on for one GPU
    assert make_config(None, ["data=d", "cuda_graph=false"]).cuda_graph is False
    assert make_config(None, ["data=d", "cuda_graph=null"]).cuda_graph is None
    with pytest.raises(ValueError, match="config key 'cuda_graph' expects bool"):
        make_config(None, ["data=d", "cuda_graph=sometimes"])
    assert main(["train", "--cuda-graph", "--set", *base_overrides(data, str(tmp_path / "a"))]) == 2
    assert "cuda_graph needs a CUDA device, got device=cpu" in capsys.readouterr().err
    if not torch.cuda.is_available():  # device=auto resolves to the CPU
        assert main(["train", "--cuda-graph", "--set", *base_overrides(data, str(tmp_path / "b"), device="auto")]) == 2
        assert "cuda_graph needs one CUDA device and no DDP/FSDP2, got 1 rank(s) on cpu" in capsys.readouterr().err
    assert main(["train", "--cuda-graph", "--print-config", "--set", "device=cuda"]) == 0
    assert "cuda_graph: true" in capsys.readouterr().out


def test_graphed_step_refuses_bad_arguments():
    opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="`warmup` and `accum`: expected at least 1, got 0 and 1"):
        GraphedStep(lambda x: x.sum(), opt, warmup=0)
    with pytest.raises(ValueError, match="`pad_values`: padding a smaller batch is supported without accumulation"):
        GraphedStep(lambda x: x.sum(), opt, pad_values=(0,), accum=2)
    with pytest.raises(ValueError, match="`optimizer`: expected capturable=True"):
        GraphedStep(lambda x: x.sum(), opt, accum=2, max_norm=1.0)


@pytest.mark.parametrize("micro,grad_clip", [(4, 1.0), (2, 0.0), (8, 1e-3)])
def test_captured_step_body_is_the_trainers_eager_step(data, tmp_path, micro, grad_clip):
    """`train_step` (what GraphedStep captures) on the step's micro-batches stacked into one batch gives the eager
    step's loss, gradient norm and weights: accumulation over the row chunks, clipping (also where it bites) and the
    norm measured when clipping is off."""
    from hgrn2.data.packed import StepSampler, train_loader
    from hgrn2.train.trainer import Trainer

    runs = []
    for name in ("eager", "body"):
        cfg = make_config(None, base_overrides(data, str(tmp_path / name), dropout=0.0, micro_batch_size=micro,
                                               grad_clip=grad_clip, save_every=0, eval_every=0))
        t = Trainer(cfg)
        start = [p.detach().clone() for p in t.model.parameters()]
        sampler = StepSampler(len(t.train_set), micro, t.accum, 0, 1, cfg.seed, 0, cfg.max_steps)
        batches = iter(train_loader(t.train_set, sampler))
        out = []
        for _ in range(3):
            x = torch.cat([next(batches) for _ in range(t.accum)])
            if name == "eager":
                loss, _, norm = t.engine._step_function()((x,))
                out.append((loss, norm))
            else:
                out.append(train_step(t.engine._loss, t.optimizer, [x], t.accum, grad_clip or float("inf")))
        runs.append((out, [p.detach().clone() for p in t.model.parameters()]))
    (eager, w_eager), (body, w_body) = runs
    for (l0, n0), (l1, n1) in zip(eager, body):
        assert l0.shape == n0.shape == ()
        torch.testing.assert_close(l1, l0)
        torch.testing.assert_close(n1, n0)
    if grad_clip < 0.01:
        assert all(n > 10 * grad_clip for _, n in eager)  # the clip bites in these steps
    for a, b in zip(w_eager, w_body):
        torch.testing.assert_close(b, a)
    assert any(not torch.equal(a, b) for a, b in zip(w_body, start))  # the steps moved the weights


def test_trainers_graph_branch_feeds_the_eager_steps_batches(data, tmp_path, monkeypatch):
    """The engine's cuda_graph branch (micro-batches stacked, the step's outputs used before the next one, the
    norm logged) with the graph replaced by the body it captures: the eager run's losses and gradient norms."""

    from hgrn2.train import engine as engine_module
    from hgrn2.train import trainer as trainer_module

    def eager_body(compute_loss, optimizer, pad_values, accum, max_norm):
        return lambda *batch: train_step(compute_loss, optimizer, batch, accum, max_norm)

    monkeypatch.setattr(engine_module, "GraphedStep", eager_body)
    runs = {}
    for graph in (False, True):
        cfg = make_config(None, base_overrides(data, str(tmp_path / f"g{graph}"), dropout=0.0, max_steps=6,
                                               micro_batch_size=2, save_every=0, eval_every=0))
        t = trainer_module.Trainer(cfg)
        t.engine.cuda_graph = graph  # past the CUDA check: the branch runs on the CPU
        t.train()
        runs[graph] = (losses(cfg.out_dir), losses(cfg.out_dir, key="grad_norm"))
    assert len(runs[True][0]) == 6
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-6)
    assert runs[True][1] == pytest.approx(runs[False][1], rel=1e-5)


def test_capturable_learning_rate_is_changed_in_place():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, "adamw", 1e-3, [0.9, 0.98], 1e-8, 0.1)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    assert all(isinstance(g["lr"], float) and not g["capturable"] for g in opt.param_groups)
    set_capturable(opt, torch.device("cpu"))  # the device a CUDA graph would use; CPU here
    rates = [g["lr"] for g in opt.param_groups]
    assert all(torch.is_tensor(r) and r.dtype == torch.float32 and r.item() == pytest.approx(1e-3) for r in rates)
    assert all(g["capturable"] for g in opt.param_groups)
    set_lr(opt, 2e-4)
    assert [g["lr"] for g in opt.param_groups] == rates and all(r.item() == pytest.approx(2e-4) for r in rates)
    set_capturable(opt, None)
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(2e-4)] * 2
    assert all(isinstance(g["lr"], float) and not g["capturable"] for g in opt.param_groups)
    assert all(st["step"].device.type == "cpu" for st in opt.state.values())


# --- GPU ---------------------------------------------------------------------------------------------------------


def _cuda_overrides(data, out_dir, **kw):
    return base_overrides(data, out_dir, dropout=0.0, device="cuda", eval_every=0, **kw)


def _train(overrides, after_step=None):
    from hgrn2.train.trainer import Trainer

    cfg = make_config(None, overrides)
    Trainer(cfg).train(after_step)
    return cfg.out_dir


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("precision,workers", [("fp32", 0), ("bf16", 2)])
def test_graphed_run_follows_the_eager_run(data, tmp_path, precision, workers):
    """Warm-up steps, the capture and the replays (accumulation over 2 micro-batches, clipping, the schedule's
    in-place learning rate; with loader workers, pinning in a thread during the capture): the same losses and
    gradient norms as the eager trainer, within float rounding (the graph's learning rate is a float32 tensor)."""
    runs = {}
    for graph in (False, True):
        out = _train(_cuda_overrides(data, str(tmp_path / f"g{graph}"), precision=precision, max_steps=16,
                                     save_every=0, num_workers=workers, cuda_graph=str(graph).lower()))
        runs[graph] = (losses(out), losses(out, key="grad_norm"))
    (eager, eager_norm), (graphed, graphed_norm) = runs[False], runs[True]
    assert sorted(graphed) == list(range(1, 17)) and graphed[16] < graphed[1] - 0.05  # it trains
    tol = 1e-4 if precision == "fp32" else 2e-2
    assert graphed == pytest.approx(eager, rel=tol)
    assert graphed_norm == pytest.approx(eager_norm, rel=10 * tol)


@pytest.mark.gpu
@gpu
def test_graphed_run_resumes_on_its_trajectory(data, tmp_path):
    """A graphed run stopped at step 10 (checkpointed) and resumed (3 eager warm-up steps on the real batches, then a
    new capture) logs the losses of the uninterrupted graphed run and ends with its weights: the warm-up steps run
    the kernels the graph replays."""
    from safetensors.torch import load_file

    from hgrn2.train.trainer import Trainer

    ref = _train(_cuda_overrides(data, str(tmp_path / "ref"), max_steps=20, cuda_graph="true"))
    cut_overrides = _cuda_overrides(data, str(tmp_path / "cut"), max_steps=20, cuda_graph="true")
    steps = []
    _train(cut_overrides, after_step=lambda: steps.append(1) or len(steps) == 10)
    assert sorted(losses(str(tmp_path / "cut"))) == list(range(1, 11))
    resumed = Trainer(make_config(None, cut_overrides))
    assert resumed.step == 10 and all(torch.is_tensor(g["lr"]) and g["lr"].is_cuda and g["capturable"]
                                      for g in resumed.optimizer.param_groups)
    resumed.train()
    got, want = losses(str(tmp_path / "cut")), losses(ref)
    assert sorted(got) == list(range(1, 21))
    assert got == pytest.approx(want, rel=1e-5)
    assert losses(str(tmp_path / "cut"), "val", "val_loss") == pytest.approx(losses(ref, "val", "val_loss"), rel=1e-5)
    a = load_file(str(tmp_path / "ref" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6)


def test_automatic_cuda_graph_only_where_its_capture_is_tested():
    from types import SimpleNamespace

    from hgrn2.train.trainer import auto_cuda_graph

    cfg = make_config(None, ["data=d"])
    hgrn2, hgrn1 = SimpleNamespace(token_mixer="hgrn2"), SimpleNamespace(token_mixer="hgrn1")
    assert auto_cuda_graph(cfg, True, hgrn2)
    assert not auto_cuda_graph(cfg, False, hgrn2)  # CPU, or several ranks
    assert not auto_cuda_graph(cfg, True, hgrn1) and not auto_cuda_graph(cfg, True, SimpleNamespace())  # llama
    for key in ("compile", "activation_checkpointing"):
        assert not auto_cuda_graph(make_config(None, ["data=d", f"{key}=true"]), True, hgrn2)
