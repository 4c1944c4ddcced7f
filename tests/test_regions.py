"""`use_compile={"regions": ...}`: each repeated block compiled on its own, the rest of the step around them."""

import gc
import logging
import os

import pytest
import torch
from torch import nn
from torch._dynamo.utils import get_compilation_metrics
from torch.nn.parallel import DistributedDataParallel

from helpers import QUIET, StateProbe, demo_gpt, dynamo_stats, last_summary, leftovers, lightning_side, state_dict_keys
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel

gpt = demo_gpt()
EAGER = {"backend": "eager"}


def small_gpt(n_layer=3, samples=60, **kwargs):
    """Batches of 8 over 60 samples: the last batch of each epoch has 4."""
    return gpt.GPTModule(
        gpt.GPTConfig(n_layer=n_layer, n_embd=32, block_size=16, vocab_size=64, samples=samples, **kwargs)
    )


class BlockProbe(Callback):
    """Records, at the first training batch, which blocks are compiled regions."""

    def on_train_batch_start(self, trainer, pl_module, *args):
        if not hasattr(self, "compiled"):
            self.compiled = [isinstance(b.__dict__.get("forward"), type(lambda: 0)) for b in pl_module.model.blocks]
            self.model_type = type(trainer.strategy.model)


def fit(model, regions, strategy="auto", **kwargs):
    probe = BlockProbe()
    options = {**QUIET, "max_epochs": 1, "limit_val_batches": 2, **kwargs}
    trainer = Trainer(strategy=strategy, use_compile={**EAGER, "regions": regions}, callbacks=[probe], **options)
    trainer.fit(model)
    return trainer, probe


def block_compiles():
    """How many times Dynamo compiled the block's `forward` (one entry serves every block)."""
    return sum(
        1
        for m in get_compilation_metrics()
        if m.co_name == "forward"
        and m.co_filename.endswith("gpt.py")
        and m.co_firstlineno == gpt.Block.forward.__code__.co_firstlineno
    )


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
@pytest.mark.parametrize("regions", ["auto", gpt.Block, (gpt.Block,), ["Block"]])
def test_every_block_is_compiled_in_place_after_the_wrap(regions, strategy):
    model = small_gpt()
    keys = state_dict_keys(model)
    _, probe = fit(model, regions, strategy)
    assert probe.compiled == [True, True, True]
    if strategy == "ddp":
        assert probe.model_type is DistributedDataParallel
    assert leftovers(model) == []
    assert all("forward" not in block.__dict__ for block in model.model.blocks)
    assert state_dict_keys(model) == keys


def test_identical_blocks_share_one_graph_whatever_the_depth():
    compiles = {}
    for depth in (2, 6):
        torch._dynamo.reset()
        torch._dynamo.utils.clear_compilation_metrics()
        fit(small_gpt(n_layer=depth), "auto", limit_val_batches=0)
        compiles[depth] = block_compiles()
    # training only: one entry for full batches and one for the last, partial one, for 2 blocks as for 6
    assert compiles == {2: 2, 6: 2}


def test_partial_batches_recompile_once_not_per_block():
    fit(small_gpt(n_layer=4), "auto", max_epochs=2)
    # grad mode (train, eval) x shape (8, 4): at most 4 entries, shared by the 4 blocks
    assert block_compiles() <= 4
    assert dynamo_stats().max_entries_per_code <= 4


class RestProbe(Callback):
    """Records, at the first training batch, which modules around the blocks run as compiled regions."""

    def on_train_batch_start(self, trainer, pl_module, *args):
        if not hasattr(self, "compiled"):
            model = pl_module.model
            self.compiled = {
                name: "forward" in getattr(model, name).__dict__ for name in ("wte", "wpe", "ln_f", "head")
            }


def test_the_rest_of_the_model_and_step_is_compiled_too():
    """Embeddings, final norm and head run as regions of their own; the loss runs in the compiled step."""
    probe = RestProbe()
    model = small_gpt()
    trainer = Trainer(
        use_compile={**EAGER, "regions": "auto"}, max_steps=2, limit_val_batches=0, callbacks=[probe], **QUIET
    )
    trainer.fit(model)
    assert probe.compiled == {"wte": True, "wpe": True, "ln_f": True, "head": True}
    assert leftovers(model) == []
    frames = {m.co_name: m.graph_op_count or 0 for m in get_compilation_metrics()}
    loss_frames = [name for name, ops in frames.items() if "resume_in__loss" in name and ops]
    assert loss_frames, frames  # the cross entropy after the model call runs compiled


def test_rest_of_model_is_found_under_the_module_that_owns_the_blocks():
    regions = lightning_side("regions")

    class NanoGPT(nn.Module):  # nanoGPT's layout: the blocks sit in a ModuleDict next to the embeddings
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(
                {
                    "wte": nn.Embedding(8, 4),
                    "h": nn.ModuleList([nn.Linear(4, 4) for _ in range(3)]),
                    "ln_f": nn.LayerNorm(4),
                }
            )
            self.lm_head = nn.Linear(4, 8)
            self.criterion = nn.CrossEntropyLoss()  # no parameters: nothing to compile

    model = NanoGPT()
    blocks = regions._find_regions(model, "auto")
    assert sorted(blocks) == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    assert sorted(regions._rest_of_model(model, blocks)) == ["lm_head", "transformer.ln_f", "transformer.wte"]


def test_region_boundaries_count_as_intended_breaks():
    trainer, _ = fit(small_gpt(), "auto", limit_val_batches=0)
    summary = last_summary(trainer)
    assert summary.graph_breaks > 0
    assert summary.graph_breaks == summary.expected_breaks


def test_every_stage_compiles_the_regions():
    model = small_gpt()
    probe = StateProbe()
    trainer = Trainer(use_compile={**EAGER, "regions": "auto"}, max_epochs=1, callbacks=[probe], **QUIET)
    trainer.fit(model)
    trainer.validate(model, verbose=False)
    trainer.predict(model, dataloaders=model.val_dataloader())
    steps = ["predict_step", "test_step", "training_step", "validation_step"]
    assert probe.seen["validate"]["compiled_steps"] == steps
    assert probe.seen["predict"]["compiled_steps"] == steps
    assert leftovers(model) == []


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.stack = nn.ModuleList([Outer(), Outer()])
        self.head = nn.Linear(8, 2)


def test_nested_matches_compile_the_outermost_block():
    find = lightning_side("regions")._find_regions
    # the Linears inside each Outer are part of it; the head is a Linear of its own
    assert sorted(find(Nested(), (Outer, nn.Linear))) == ["head", "stack.0", "stack.1"]
    assert sorted(find(Nested(), ["Linear"])) == [
        "head",
        "stack.0.inner.0",
        "stack.0.inner.1",
        "stack.1.inner.0",
        "stack.1.inner.1",
    ]
    # 'auto' finds the list of Outer; the lists of Linear inside them are nested in it
    assert sorted(find(Nested(), "auto")) == ["stack.0", "stack.1"]


def test_regions_matching_nothing_fail_before_training_and_name_the_candidates(tmp_path):
    model = small_gpt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(use_compile={**EAGER, "regions": ["Transformer"]}, default_root_dir=tmp_path, **QUIET)
    with pytest.raises(
        ValueError, match=r"no module of `GPTModule` matches Transformer\. It has these repeated blocks: Block"
    ):
        trainer.fit(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert leftovers(model) == []


def test_auto_takes_the_blocks_of_a_list_of_lists():
    # the inner lists have no `forward` to compile: their blocks are what runs
    find = lightning_side("regions")._find_regions
    model = nn.Module()
    model.stages = nn.ModuleList([nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]) for _ in range(2)])
    assert sorted(find(model, "auto")) == ["stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1"]


def test_auto_on_a_model_without_repeated_blocks_says_so():
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer = Trainer(use_compile={**EAGER, "regions": "auto"}, **QUIET)
    with pytest.raises(ValueError, match="no container of repeated blocks"):
        trainer.fit(BoringModel())


@pytest.mark.parametrize("regions", [[], 5, ["not a name"], [int], "not a name", {"Block": 1}])
def test_bad_regions_fail_at_construction(regions):
    with pytest.raises((TypeError, ValueError), match="regions"):
        Trainer(use_compile={"regions": regions}, **QUIET)


def losses(use_compile, steps=6, n_layer=2):
    seed_everything(0)
    model = small_gpt(n_layer=n_layer, samples=8 * steps)

    class Record(Callback):
        values = []

        def on_train_batch_end(self, trainer, pl_module, outputs, *args):
            self.values.append(float(outputs["loss"]))

    record = Record()
    record.values = []
    trainer = Trainer(use_compile=use_compile, max_epochs=1, limit_val_batches=0, callbacks=[record], **QUIET)
    trainer.fit(model)
    return record.values


@pytest.mark.slow
def test_losses_of_eager_whole_and_regional_agree_with_inductor(tmp_path, monkeypatch):
    """Inductor generates the code here: the numerics risk of per-block compilation is in the generated kernels."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    eager = losses(None)
    whole = losses({"backend": "inductor"})
    regional = losses({"backend": "inductor", "regions": "auto"})
    assert len(eager) == len(whole) == len(regional) == 6
    assert eager[-1] < eager[0]
    # fp32 on CPU; kernels fuse and reorder reductions differently: agree to 1e-4 relative over 6 AdamW steps
    torch.testing.assert_close(whole, eager, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(regional, eager, rtol=1e-4, atol=1e-5)


def test_losses_of_eager_and_regional_agree_with_aot_eager():
    torch.testing.assert_close(losses({"backend": "aot_eager", "regions": "auto"}), losses(None), rtol=1e-6, atol=1e-6)


def _rss_mb():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cuda_allocated_mb():
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() / 2**20


class MemorySamples(Callback):
    """Reads memory every 25 steps, after a garbage collection."""

    def __init__(self, read_mb):
        self.read_mb = read_mb
        self.samples = []

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step % 25 == 0:
            gc.collect()
            self.samples.append(self.read_mb())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("accelerator", "use_compile", "read_mb", "bound_mb"),
    [
        pytest.param(
            "cpu",
            {"backend": "aot_eager", "regions": "auto"},
            _rss_mb,
            8,
            id="cpu_rss",
            marks=pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc"),
        ),
        pytest.param(  # with inductor, where the leak was reported
            "cuda",
            {"regions": "auto"},
            _cuda_allocated_mb,
            1,
            id="cuda_allocated",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="reads CUDA allocated memory: needs a GPU"),
        ),
    ],
)
def test_memory_stays_flat_over_many_steps(accelerator, use_compile, read_mb, bound_mb):
    """The per-layer compile leak reported on torchtitan (#61) would show as memory growing with every step."""
    memory = MemorySamples(read_mb)
    model = small_gpt(n_layer=4, samples=8 * 300)
    options = {**QUIET, "accelerator": accelerator}
    trainer = Trainer(use_compile=use_compile, max_steps=300, limit_val_batches=0, callbacks=[memory], **options)
    trainer.fit(model)
    after_warmup = memory.samples[2:]  # from step 50 on
    growth = after_warmup[-1] - after_warmup[0]
    # 250 steps; a leak of even one activation (8x16x32 floats = 16 KiB) per block per step would add ~16 MB
    assert growth < bound_mb, f"memory grew {growth:.2f} MB over 250 steps: {[round(s, 1) for s in memory.samples]}"


def test_the_summary_counts_every_regional_step_as_compiled():
    # bug: under regions the step's own frame runs no graph (the model's forward breaks at every region), and the
    # summary counted every step eager, with a warning that the run went uncompiled
    trainer, _ = fit(small_gpt(), "auto")
    summary = last_summary(trainer)
    assert summary.eager_steps == {}
    assert summary.compiled_steps == {"training": 8, "evaluation": 4}  # 60 samples in batches of 8; 2 + 2 validation


class IndexedBlock(nn.Module):
    """A block that reads its own index, as each HF decoder layer reads `layer_idx` to find its slot of the cache."""

    def __init__(self, index):
        super().__init__()
        self.layer_idx = index
        self.fc = nn.Linear(8, 8)

    def forward(self, x, scales):
        return x + self.fc(x) * scales[self.layer_idx]


class IndexedBlocks(BoringModel):
    """More blocks than Dynamo's recompile limit (8), each with its own `layer_idx`."""

    def __init__(self, depth=12):
        super().__init__()
        self.blocks = nn.ModuleList(IndexedBlock(i) for i in range(depth))
        self.scales = [torch.tensor(1.0 + i / 10) for i in range(depth)]

    def forward(self, x):
        x = x[..., :8]
        for block in self.blocks:
            x = block(x, self.scales)
        return x

    def training_step(self, batch, batch_idx):
        return self(batch).square().mean()


def test_blocks_that_differ_by_a_per_layer_constant_are_each_compiled(caplog):
    # bug: the blocks shared one compiled graph, which Dynamo specialized on `layer_idx`: each block recompiled it,
    # and from the 9th block on Dynamo's recompile limit left the rest to run eagerly
    seen = {}

    class Probe(Callback):
        def on_train_batch_start(self, trainer, pl_module, *args):
            seen["regions"] = [isinstance(b.__dict__.get("forward"), type(lambda: 0)) for b in pl_module.blocks]

    trainer = Trainer(
        use_compile={"backend": "aot_eager", "regions": "auto"},
        max_steps=3,
        limit_val_batches=0,
        callbacks=[Probe()],
        **QUIET,
    )
    with caplog.at_level(logging.INFO):
        trainer.fit(IndexedBlocks())
    summary = last_summary(trainer)
    assert seen["regions"] == [True] * 12
    assert summary.recompile_limit_hits == []
    assert summary.eager_steps == {}
    assert summary.compiled_steps == {"training": 3}
    assert dynamo_stats().max_entries_per_code <= 1  # each block compiled once, on its own
    assert "12 blocks of `IndexedBlock`, compiled one by one, since they differ in `layer_idx`" in caplog.text


@pytest.mark.parametrize("fullgraph", [True, None])
def test_fullgraph_applies_to_each_region_and_the_log_says_the_step_is_not_one_graph(caplog, fullgraph):
    """The step calls each region as an opaque function: it is compiled with `fullgraph=False`, and says so."""
    use_compile = {**EAGER, "regions": "auto", **({"fullgraph": fullgraph} if fullgraph else {})}
    trainer = Trainer(use_compile=use_compile, max_steps=2, limit_val_batches=0, **QUIET)
    with caplog.at_level(logging.INFO):
        trainer.fit(small_gpt(n_layer=4))
    summary = last_summary(trainer)
    assert summary.notes == ["regions: 4 blocks sharing one compiled graph"]
    assert summary.eager_steps == {}
    line = "`fullgraph=True` applies to each region; the step is compiled with `fullgraph=False`"
    assert (line in caplog.text) is bool(fullgraph)
