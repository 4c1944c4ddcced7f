"""`use_compile={"cache": DIR}`: the second run loads what the first compiled; a bad cache file never stops a run."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import QUIET, feature, lightning_side
from lightning.pytorch import Callback, Trainer

TESTS = Path(__file__).parent
pytestmark = pytest.mark.skipif(
    not hasattr(torch.compiler, "save_cache_artifacts"), reason="the cache needs torch 2.7 or newer"
)

RUN = """
import json, sys, time
sys.path.insert(0, {tests!r})
{import_line}
import torch
from torch._dynamo.utils import counters
from helpers import QUIET, demo_gpt
from lightning.pytorch import Callback, Trainer

gpt = demo_gpt()

class FirstStep(Callback):
    def on_train_batch_start(self, *args):
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 1:
            self.seconds = time.perf_counter() - self.start

timer = FirstStep()
model = gpt.GPTModule(gpt.GPTConfig(n_layer=1, n_embd=16, block_size=8, vocab_size=32, samples=16))
trainer = Trainer(use_compile={{"cache": {cache!r}}}, max_steps=2, limit_val_batches=0, callbacks=[timer], **QUIET)
trainer.fit(model)
print("RESULT", json.dumps({{"first_step": timer.seconds, "inductor": dict(counters["inductor"]),
                             "aot": dict(counters["aot_autograd"])}}))
"""


def run(cache: Path, workdir: Path) -> tuple[dict, str]:
    from conftest import TARGET

    script = workdir / "run.py"
    import_line = "import lightning_compile_patch" if TARGET == "package" else ""
    script.write_text(textwrap.dedent(RUN.format(tests=str(TESTS), import_line=import_line, cache=str(cache))))
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=workdir, capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), result.stdout + result.stderr


@pytest.mark.slow
def test_second_run_loads_what_the_first_compiled_and_survives_a_corrupt_file(tmp_path):
    cache = tmp_path / "cache"
    cold, _ = run(cache, tmp_path)
    assert cold["inductor"].get("fxgraph_cache_miss", 0) > 0
    [folder] = cache.iterdir()
    assert (folder / "rank0.bin").read_bytes().startswith(b"LIGHTNING-COMPILE-CACHE 1\n")

    # the portable file alone brings the graphs back: drop inductor's own directory first
    import shutil

    shutil.rmtree(folder / "inductor")
    warm, log = run(cache, tmp_path)
    assert "compiled artifacts from" in log
    assert warm["inductor"].get("fxgraph_cache_hit", 0) > 0
    assert warm["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert warm["aot"].get("autograd_cache_hit", 0) > 0

    (folder / "rank0.bin").write_bytes(b"LIGHTNING-COMPILE-CACHE 1\n{not json")
    _, log = run(cache, tmp_path)
    assert "cannot be read" in log
    assert "compiling cold" in log
    assert (folder / "rank0.bin").read_bytes().startswith(b"LIGHTNING-COMPILE-CACHE 1\n{")  # written again
    assert json.loads((folder / "rank0.bin").read_bytes().split(b"\n")[1])["torch"]


def test_a_cache_of_another_configuration_is_ignored_with_a_warning(tmp_path):
    cache = lightning_side("cache")
    trainer = Trainer(use_compile={"backend": "eager", "cache": str(tmp_path)}, max_steps=1, **QUIET)
    from lightning.pytorch.demos.boring_classes import BoringModel

    model = BoringModel()
    trainer.strategy._lightning_module = model
    configuration = cache._configuration(trainer, {"backend": "eager"}, {})
    path = tmp_path / "rank0.bin"
    path.write_bytes(cache._MAGIC + json.dumps({**configuration, "torch": "1.0"}).encode() + b"\n" + b"payload")
    with pytest.warns(UserWarning, match="written for another configuration \\(it differs in torch\\); compiling cold"):
        cache._load(path, configuration)


def test_the_other_keys_of_use_compile_are_part_of_the_configuration():
    # what `regions` compiles differs from the whole model's graphs: a cache of one is not loaded for the other
    trainer = Trainer(**QUIET)
    trainer.strategy._lightning_module = __import__("helpers").LoggingModel()
    configuration = lightning_side("cache")._configuration
    whole, regional = (configuration(trainer, {}, keys) for keys in ({}, {"regions": "auto"}))
    assert whole != regional


def test_a_file_that_is_not_a_cache_is_ignored_with_a_warning(tmp_path):
    path = tmp_path / "rank0.bin"
    path.write_bytes(b"\x00garbage")
    with pytest.warns(UserWarning, match="cannot be read \\(not a compile cache file\\); compiling cold"):
        lightning_side("cache")._load(path, {})


def test_true_means_the_default_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    trainer = Trainer(use_compile={"cache": True}, **QUIET)
    assert feature(trainer, "cache").cache == str(tmp_path / "lightning" / "compile")


@pytest.mark.parametrize("cache", [1, "", ["dir"], 0.5])
def test_bad_cache_values_fail_at_construction(cache):
    with pytest.raises(TypeError, match="cache"):
        Trainer(use_compile={"cache": cache}, **QUIET)


def test_the_run_leaves_torchinductor_cache_dir_as_it_was(tmp_path, monkeypatch):
    """The cache points inductor at its own folder during the run only; a directory the user chose is kept."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    seen = []

    class Probe(Callback):
        def on_train_start(self, *args):
            seen.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))

    trainer = Trainer(
        use_compile={"backend": "eager", "cache": str(tmp_path)}, max_steps=1, callbacks=[Probe()], **QUIET
    )
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # torch sets its default when torch.compile is first called
    trainer.fit(BoringModel())
    assert seen[-1].startswith(str(tmp_path))
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    trainer = Trainer(
        use_compile={"backend": "eager", "cache": str(tmp_path)}, max_steps=1, callbacks=[Probe()], **QUIET
    )
    trainer.fit(BoringModel())
    assert seen[-1] == str(tmp_path / "mine")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
