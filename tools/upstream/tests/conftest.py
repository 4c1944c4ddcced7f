"""The fixtures of Lightning's ``tests/tests_pytorch/conftest.py`` that the series' tests rely on.

In Lightning's repository these tests run under that conftest; here they run outside it, so this file does the same.
Each test's environment variables are put back (Lightning's launchers set ``MASTER_PORT`` for the process), and its
process group is closed: without that, a ``ddp_spawn`` test after an in-process DDP test in the same worker inherits a
``MASTER_PORT`` whose store that worker still holds, and fails with ``EADDRINUSE``. ``caplog`` sees Lightning's
loggers, which do not propagate when Lightning is imported before pytest's handlers exist.
"""

import logging
import os

import pytest


@pytest.fixture(autouse=True)
def restore_env_variables():
    env_backup = os.environ.copy()
    yield
    os.environ.clear()
    os.environ.update(env_backup)


@pytest.fixture(autouse=True)
def reset_dynamo():
    """Each test compiles afresh: Dynamo's recompile budget is per code object for the process, and the tests of many
    models in one worker share DDP's `_call_impl` (the fork's `compile_budget` rung handles that for users)."""
    import torch._dynamo

    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def teardown_process_group():
    yield
    from lightning.fabric.utilities.distributed import _destroy_dist_connection

    _destroy_dist_connection()


@pytest.fixture
def caplog(caplog):
    loggers = [logging.getLogger()]
    loggers += [logging.getLogger(n) for n in logging.root.manager.loggerDict if n.startswith("lightning.pytorch")]
    propagate = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.propagate = True
    yield caplog
    for logger, value in zip(loggers, propagate, strict=True):
        logger.propagate = value
