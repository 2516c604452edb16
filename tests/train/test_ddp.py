"""torchrun on CPU (gloo): 2 ranks with DDP and with FSDP2 give the 1-process loss curve with accumulation 2;
their sharded checkpoints resume on 2 ranks and across world sizes (2 ranks -> 1 process and 1 process -> 2 ranks)
with the same loss curve."""

import os
import shutil

import pytest
import torch

from tests.train.helpers import base_overrides, losses, make_corpus, run_train

STEPS = 12


def _close(a: dict, b: dict, tol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        assert abs(a[k] - b[k]) <= tol * abs(b[k]), (k, a[k], b[k])


def _rewind(out_dir, to_step):
    """Make a finished run look like one that stopped right after the checkpoint of `to_step`."""
    for f in os.listdir(os.path.join(out_dir, "checkpoints")):
        if f.startswith("step_") and int(f[5:13]) > to_step:
            shutil.rmtree(os.path.join(out_dir, "checkpoints", f))
    shutil.rmtree(os.path.join(out_dir, "final"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    data = make_corpus(tmp / "data")
    # batch 8 = micro 4 × accumulation 2 on one process, micro 4 × 2 ranks under torchrun; no dropout, so the
    # per-rank RNG streams cannot make the runs differ
    run_train(base_overrides(data, str(tmp / "one"), dropout=0.0, max_steps=STEPS))
    return tmp, data, losses(str(tmp / "one")), losses(str(tmp / "one"), "val", "val_loss")


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_match_one_process_with_accumulation(reference, parallel):
    tmp, data, ref, ref_val = reference
    out = str(tmp / parallel)
    overrides = base_overrides(data, out, dropout=0.0, max_steps=STEPS, parallel=parallel)
    p = run_train(overrides, nproc=2)
    assert "2 rank(s) × micro batch 4 × accumulation 1" in p.stdout
    _close(losses(out), ref)
    _close(losses(out, "val", "val_loss"), ref_val)
    assert ref[STEPS] < ref[1]

    # resume on 2 ranks, and the 2-rank checkpoint on 1 process (accumulation 2): each reads its shards
    for step, nproc in [(8, 2), (4, 1)]:
        _rewind(out, step)
        p = run_train(overrides, nproc=nproc)
        assert f"resumed from step {step}" in p.stdout
        _close(losses(out), ref)
        assert os.path.isfile(os.path.join(out, "final", "model.safetensors"))
    # and the 1-process run's checkpoint on 2 ranks
    shutil.copytree(tmp / "one", tmp / f"one-on-2-{parallel}")
    out = str(tmp / f"one-on-2-{parallel}")
    _rewind(out, 4)
    p = run_train(base_overrides(data, out, dropout=0.0, max_steps=STEPS, parallel=parallel), nproc=2)
    assert "resumed from step 4" in p.stdout
    _close(losses(out), ref)


@pytest.mark.slow
def test_fsdp_accumulating_on_two_ranks_matches_one_process(reference):
    """Micro batch 2 × 2 ranks × accumulation 2: between micro steps FSDP2 keeps the parameters gathered after the
    backward (`no_sync`), which must not change a step."""
    tmp, data, ref, ref_val = reference
    out = str(tmp / "fsdp_accum")
    p = run_train(base_overrides(data, out, dropout=0.0, max_steps=STEPS, parallel="fsdp", micro_batch_size=2),
                  nproc=2)
    assert "2 rank(s) × micro batch 2 × accumulation 2" in p.stdout
    _close(losses(out), ref)
    _close(losses(out, "val", "val_loss"), ref_val)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gpus_match_one_gpu_with_accumulation(tmp_path, parallel):
    """NCCL version of the test above (fp32: TF32 is off by default, so only reduction order differs)."""
    data = make_corpus(tmp_path / "data")
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    run_train(base_overrides(data, one, dropout=0.0, max_steps=STEPS, device="cuda"))
    run_train(base_overrides(data, two, dropout=0.0, max_steps=STEPS, device="cuda", parallel=parallel), nproc=2)
    _close(losses(two), losses(one), tol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_one_layer_model_trains_on_two_ranks(tmp_path, parallel):
    """A one-layer model holds bound logits no output depends on; DDP must not wait for their gradient."""
    data = make_corpus(tmp_path / "data")
    overrides = [o for o in base_overrides(data, str(tmp_path / "out"), dropout=0.0, max_steps=2, save_every=0,
                                           eval_every=0, parallel=parallel) if not o.startswith(("model=", "arch="))]
    p = run_train(overrides + ["arch=hgrn2", "model={hidden_size: 32, num_hidden_layers: 1, expand_ratio: 16}"],
                  nproc=2)
    assert "2 rank(s)" in p.stdout and set(losses(str(tmp_path / "out"))) == {1, 2}


@pytest.mark.slow
def test_fsdp_options_never_resharding_and_prefetching_two_match_one_process(reference):
    """The FSDP2 options of the config (`distributed.wrap`): parameters kept gathered from the forward to the
    backward, two units prefetched and two blocks per unit change the schedule of the collectives, not a step."""
    tmp, data, ref, _ = reference
    out = str(tmp / "fsdp_options")
    run_train(base_overrides(data, out, dropout=0.0, max_steps=STEPS, parallel="fsdp", fsdp_reshard="never",
                             fsdp_prefetch=2, fsdp_unit=2), nproc=2)
    _close(losses(out), ref)
