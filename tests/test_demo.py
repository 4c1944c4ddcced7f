"""The demo (``examples/demo.py``) measures what it says it measures.

Its table compares steady steps taken in separate processes on a machine that may be busy, so each process must run
its steps with one torch thread. Lightning's DDP strategy resets torch's threads to cores / processes unless
``OMP_NUM_THREADS`` is set, which undid the demo's own ``torch.set_num_threads(1)``: beside another job, its eager
step then took 33 times as long, and its steady figures were noise. And the rows that are not ``use_compile``'s run
without the package, which once imported changes what ``fit(torch.compile(model))`` does.
"""

import statistics

import pytest

from helpers import example


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
