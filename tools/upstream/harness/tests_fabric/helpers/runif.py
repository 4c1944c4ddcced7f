"""``RunIf`` for running the series' upstream Fabric tests outside Lightning's repository (as ``tests_pytorch``'s).

It defers to ``lightning.fabric.utilities.testing._runif_reasons``, which is what Lightning's own helper does.
"""

import pytest

from lightning.fabric.utilities.testing import _runif_reasons


def RunIf(**kwargs):
    reasons, marker_kwargs = _runif_reasons(**kwargs)
    return pytest.mark.skipif(condition=len(reasons) > 0, reason=f"Requires: [{' + '.join(reasons)}]", **marker_kwargs)
