"""``RunIf`` for running the series' upstream tests outside Lightning's repository (Lightning's helper is not on PyPI).

It defers to ``lightning.pytorch.utilities.testing._runif_reasons``, which is what Lightning's own helper does.
"""

import pytest

from lightning.pytorch.utilities.testing import _runif_reasons


def RunIf(**kwargs):
    reasons, marker_kwargs = _runif_reasons(**kwargs)
    return pytest.mark.skipif(condition=len(reasons) > 0, reason=f"Requires: [{' + '.join(reasons)}]", **marker_kwargs)
