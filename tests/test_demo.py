"""The demo (``examples/demo.py``) measures what it says it measures.

Its table compares steady steps taken in separate processes on a machine that may be busy, so each process must run
its steps with one torch thread. Lightning's DDP strategy resets torch's threads to cores / processes unless
``OMP_NUM_THREADS`` is set, which undid the demo's own ``torch.set_num_threads(1)``: beside another job, its eager
step then took 33 times as long, and its steady figures were noise. And the rows that are not ``use_compile``'s run
without the package, which once imported changes what ``fit(torch.compile(model))`` does.
"""

import statistics

import pytest

from helpers import QUIET, example


@pytest.mark.slow
def test_each_configuration_trains_its_ddp_steps_with_one_torch_thread(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # as in a user's shell; Lightning's tests may have set it
    demo = example("demo")
    configuration = demo._Configuration("eager", layers=1, workdir=tmp_path, warm=False)
    try:
        configuration.wait()  # set up
        configuration.tell("go")
        configuration.wait()  # its first steps
        configuration.tell("go")
        configuration.windows.append(statistics.median(configuration.wait()))  # one steady window
    finally:
        if configuration.process.poll() is None:  # a process that died has said why in `wait`'s error
            configuration.tell("stop")
    result = configuration.result()
    assert result["strategy_model"] == "DistributedDataParallel"
    assert result["threads"] == 1
    # eager, like Lightning's `fit(torch.compile(model))`, runs Lightning as it is: the package, once imported, would
    # also compile a compiled model passed in after the wrap, and that row would not be Lightning's own path
    assert result["patched"] is False


def test_a_step_is_timed_with_the_module_hooks_that_run_after_the_callbacks(monkeypatch, capsys):
    """Lightning's path logs in the module's ``on_train_batch_end``, which runs after every callback's: a timer that
    stopped in its own ``on_train_batch_end`` left that logging out of Lightning's steps and in ``use_compile``'s."""
    import io
    import json
    import time

    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    class SlowHook(BoringModel):
        def on_train_batch_end(self, *args):
            start = time.process_time()
            while time.process_time() - start < 0.03:  # CPU time, which the demo compares
                pass

    demo = example("demo")
    steps = demo.WARMUP_STEPS + 3
    monkeypatch.setattr("sys.stdin", io.StringIO("go\n" * steps))
    timer = demo.step_timer()
    trainer = Trainer(max_steps=steps, callbacks=[timer], **QUIET)
    trainer.fit(SlowHook())
    windows = [json.loads(line)["window"] for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    steady = [time for window in windows for time in window]
    assert len(steady) == 2  # the windows after the first steps: each step, once the next one starts
    assert min(steady) >= 0.03
