"""The compile cache holds code that runs in the training process: it is only used where no one else can write it."""

import os
import stat
import warnings

import pytest
import torch

from helpers import QUIET, demo_gpt
from lightning.pytorch import Trainer

HAS_CACHE = hasattr(torch.compiler, "save_cache_artifacts")
needs_cache = pytest.mark.skipif(not HAS_CACHE, reason="the cache needs torch 2.7 or newer")
FIT = {**QUIET, "max_steps": 1, "limit_val_batches": 0}


def small_gpt(width=16):
    gpt = demo_gpt()
    return gpt.GPTModule(gpt.GPTConfig(n_layer=1, n_embd=width, block_size=8, vocab_size=32, samples=16))


def fit(cache, **extra):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(use_compile={"backend": "inductor", "cache": str(cache), **extra}, **FIT).fit(small_gpt())
    return [str(w.message) for w in caught if "compile cache is not used" in str(w.message)]


def files(root):
    return sorted(p for p in root.rglob("*") if p.is_file() and "inductor" not in p.parts)


@needs_cache
@pytest.mark.slow
def test_a_cache_of_ones_own_is_written_for_the_owner_only(tmp_path):
    cache = tmp_path / "cache"
    assert fit(cache) == []
    [artifacts] = files(cache)
    assert stat.S_IMODE(artifacts.stat().st_mode) == 0o600
    assert stat.S_IMODE(artifacts.parent.stat().st_mode) == 0o700


@needs_cache
@pytest.mark.slow
def test_a_world_writable_directory_is_neither_read_nor_written(tmp_path):
    # bug: any user who could write the directory could put code into everyone's training process
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    messages = fit(cache)
    assert len(messages) == 1
    assert "writable by group or others" in messages[0]
    assert str(cache) in messages[0]
    assert "'cache_shared': True" in messages[0]
    assert list(cache.iterdir()) == []  # nothing read, nothing written: a cold compile


@needs_cache
@pytest.mark.slow
def test_a_symlinked_cache_file_is_not_loaded(tmp_path):
    cache = tmp_path / "cache"
    assert fit(cache) == []
    [artifacts] = files(cache)
    elsewhere = tmp_path / "elsewhere.bin"
    artifacts.rename(elsewhere)
    artifacts.symlink_to(elsewhere)
    messages = fit(cache)
    assert len(messages) == 1
    assert "is a symbolic link" in messages[0]


@needs_cache
@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making another user's file needs root")
def test_a_cache_file_of_another_user_is_not_loaded(tmp_path):
    cache = tmp_path / "cache"
    assert fit(cache) == []
    [artifacts] = files(cache)
    os.chown(artifacts, 4321, -1)
    messages = fit(cache)
    assert len(messages) == 1
    assert "belongs to another user (uid 4321)" in messages[0]


@needs_cache
@pytest.mark.slow
def test_a_shared_cache_is_an_explicit_opt_in(tmp_path):
    cache = tmp_path / "team"
    cache.mkdir()
    cache.chmod(0o777)
    assert fit(cache, cache_shared=True) == []
    assert len(files(cache)) == 1


@needs_cache
def test_two_sizes_of_one_model_class_get_two_configurations(tmp_path):
    # bug: the cache key ignored the model's structure, so two sizes of one class overwrote each other's file
    configuration = __import__("helpers").lightning_side("cache")._configuration
    keys = []
    for width in (16, 32):
        trainer = Trainer(**FIT)
        trainer.strategy._lightning_module = small_gpt(width)
        keys.append(configuration(trainer, {}, {}))
    assert keys[0]["model"] == keys[1]["model"]
    assert keys[0]["parameters"] != keys[1]["parameters"]


@pytest.mark.skipif(HAS_CACHE, reason="this torch has `save_cache_artifacts`")
def test_the_cache_on_a_torch_without_it_fails_at_construction_naming_the_torch_it_needs():
    with pytest.raises(RuntimeError, match=r"'cache'.*needs torch 2.7 or newer.*Upgrade torch, or leave 'cache' out"):
        Trainer(use_compile={"cache": "dir"})


@needs_cache
def test_cache_shared_must_be_a_bool():
    with pytest.raises(TypeError, match=r"'cache_shared': 'yes'.*must be a bool"):
        Trainer(use_compile={"cache": "dir", "cache_shared": "yes"})
