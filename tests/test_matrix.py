"""The configurations a user would try: each one runs compiled graphs and trains as eager does.

Every case trains the same seeded model twice, eagerly and with `use_compile` (backend `aot_eager`: the graphs go
through AOTAutograd like inductor's, and run the same kernels as eager), and compares the loss of every step and the
final weights. Tolerance: 1e-5 relative in fp32; in bf16-mixed, where eager and compiled round intermediate values
differently, 2e-2 relative on the losses.
"""

import pytest
import torch
from torch.distributed._composable.fsdp import fully_shard

from helpers import QUIET, TORCH_2_7, CountingBackend, LoggingModel, demo_gpt, leftovers
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.strategies import ModelParallelStrategy


class Losses(Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, pl_module, outputs, *args):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.values.append(float(loss))


class TwoOptimizers(LoggingModel):
    """Manual optimization with two optimizers, as in a GAN: each updates half of the model."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.other = torch.nn.Linear(2, 2)

    def training_step(self, batch, batch_idx):
        first, second = self.optimizers()
        loss = self.loss(self.other(self(batch)))
        first.zero_grad()
        second.zero_grad()
        self.manual_backward(loss)
        first.step()
        second.step()
        self.log("loss", loss)
        return {"loss": loss.detach()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.layer.parameters(), lr=0.1), torch.optim.Adam(self.other.parameters(), lr=0.01)


class ShardedGPT(demo_gpt().GPTModule):
    """FSDP2: every block and the root sharded in `configure_model`, as ModelParallelStrategy expects."""

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)


def small_gpt(cls=None):
    gpt = demo_gpt()
    return (cls or gpt.GPTModule)(gpt.GPTConfig(n_layer=2, n_embd=16, block_size=8, vocab_size=32, samples=32))


def train(model_factory, use_compile, strategy="auto", **kwargs):
    seed_everything(0)
    model = model_factory()
    losses = Losses()
    options = {**QUIET, "max_steps": 4, "limit_val_batches": 0, **kwargs}
    trainer = Trainer(strategy=strategy, use_compile=use_compile, callbacks=[losses], **options)
    trainer.fit(model)
    assert leftovers(model) == []
    return losses.values, [p.detach().float().clone() for p in model.parameters()]


FSDP2_ON_CPU = "FSDP2 on CPU needs torch 2.7 or newer (torch 2.6's CPU stream has no `record_event`), eager too"
NEEDS_FSDP2_ON_CPU = pytest.mark.skipif(not TORCH_2_7, reason=FSDP2_ON_CPU)

CASES = {
    "single device, 32-bit": (LoggingModel, "auto", {}),
    "single device, bf16-mixed": (LoggingModel, "auto", {"precision": "bf16-mixed"}),
    "ddp, 32-bit": (LoggingModel, "ddp", {}),
    "ddp, bf16-mixed": (LoggingModel, "ddp", {"precision": "bf16-mixed"}),
    "single device, accumulate 2": (LoggingModel, "auto", {"accumulate_grad_batches": 2}),
    "ddp, accumulate 2": (LoggingModel, "ddp", {"accumulate_grad_batches": 2}),
    "single device, clip norm": (LoggingModel, "auto", {"gradient_clip_val": 0.05}),
    "ddp, clip value": (LoggingModel, "ddp", {"gradient_clip_val": 0.05, "gradient_clip_algorithm": "value"}),
    "single device, two optimizers": (TwoOptimizers, "auto", {}),
    "ddp, two optimizers": (TwoOptimizers, "ddp", {}),
    "fsdp2 (model parallel), gpt": (lambda: small_gpt(ShardedGPT), ModelParallelStrategy, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_run_matches_eager(case):
    if case.startswith("fsdp2") and not TORCH_2_7:
        pytest.skip(FSDP2_ON_CPU)
    model_factory, strategy, kwargs = CASES[case]
    make_strategy = (lambda: strategy()) if isinstance(strategy, type) else (lambda: strategy)
    eager_losses, eager_weights = train(model_factory, None, make_strategy(), **kwargs)
    backend = CountingBackend(f"matrix-{case}")
    compiled_losses, compiled_weights = train(model_factory, {"backend": backend}, make_strategy(), **kwargs)
    assert backend.graphs > 0
    assert backend.calls > 0
    assert len(compiled_losses) == len(eager_losses) > 0
    bf16 = kwargs.get("precision") == "bf16-mixed"
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=2e-2 if bf16 else 1e-5, atol=1e-5)
    for ours, theirs in zip(compiled_weights, eager_weights, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=2e-2 if bf16 else 1e-5, atol=1e-3 if bf16 else 1e-6)


@NEEDS_FSDP2_ON_CPU
def test_fsdp2_blocks_compile_as_regions_with_their_hooks():
    """In-place region compilation keeps `fully_shard`'s hooks on each block firing: losses match eager."""
    eager_losses, _ = train(lambda: small_gpt(ShardedGPT), None, ModelParallelStrategy())
    regional_losses, _ = train(
        lambda: small_gpt(ShardedGPT), {"backend": "aot_eager", "regions": "auto"}, ModelParallelStrategy()
    )
    torch.testing.assert_close(regional_losses, eager_losses, rtol=1e-5, atol=1e-6)


def test_fsdp1_on_cpu_is_refused_by_lightning_itself():
    with pytest.raises(ValueError, match="requires a GPU accelerator"):
        Trainer(strategy="fsdp", accelerator="cpu", use_compile=True)


def every_stage_in_bf16(use_compile, backend=None):
    """Fits, validates, tests and predicts one seeded model: what each stage gave, and the compiled calls in each."""
    seed_everything(0)
    model = LoggingModel()
    trainer = Trainer(use_compile=use_compile, precision="bf16-mixed", max_steps=2, **QUIET)
    results, calls = {}, {}

    def stage(name, run):
        before = backend.calls if backend else 0
        results[name] = run()
        calls[name] = (backend.calls if backend else 0) - before

    stage("fit", lambda: trainer.fit(model))
    results["fit"] = [p.detach().float().clone() for p in model.parameters()]  # the weights it trained
    stage("validate", lambda: trainer.validate(model, verbose=False))
    stage("test", lambda: trainer.test(model, verbose=False))
    stage("predict", lambda: [out.float() for out in trainer.predict(model)])
    assert leftovers(model) == []
    return results, calls


def test_every_stage_runs_compiled_in_bf16_and_matches_eager():
    eager, _ = every_stage_in_bf16(None)
    backend = CountingBackend("bf16-stages")
    compiled, calls = every_stage_in_bf16({"backend": backend}, backend)
    assert all(n > 0 for n in calls.values()), calls  # compiled code ran in every stage, not only in fit
    assert len(compiled["predict"]) == len(eager["predict"]) == 64
    for stage in eager:  # weights after fit, logged metrics of validate and test, every prediction
        torch.testing.assert_close(compiled[stage], eager[stage], rtol=2e-2, atol=1e-3)
