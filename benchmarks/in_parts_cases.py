"""The cases of ``tests/test_in_parts.py``, as a table: steps compiled whole, in parts and eager, graphs, and the
largest difference of the weights to eager's.

    python benchmarks/in_parts_cases.py
    PYTHONPATH=OLD_CHECKOUT/src python benchmarks/in_parts_cases.py   # the package of another commit, for "before"

Each case trains eagerly, then with ``use_compile={"backend": "aot_eager"}`` (and ``fallback="eager"`` where named),
in this process; the package imported is the one the first line names. A commit without ``in_parts`` counts a step
whose own code ran eagerly as eager, whatever ran compiled inside it.
"""

import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch

import lightning_compile_patch
import test_in_parts as cases
from helpers import last_summary

CASES = [
    ("truncated BPTT as `common/tbptt.rst` writes it", cases.TruncatedBPTT, {}),
    ("a loop over chunks with a `print` in it", cases.ChunkLoop, {}),
    ('"Observed exception" (a subclass\'s `super().shape`)', cases.ObservedException, {}),
    ("an LSTM between two modules", cases.LSTMBesideOthers, {}),
    ('a Dynamo error, `fallback="eager"`', cases.DynamoError, {"fallback": "eager"}),
    ("image-subclass batches", cases.ImageBatches, {}),
]


def main() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(f"torch {torch.__version__}; the package from {Path(lightning_compile_patch.__file__).parent}")
    print("| case | training: compiled / in parts / eager | evaluation | graphs | largest difference to eager |")
    print("|---|---|---|---|---|")
    for name, model_class, extra in CASES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eager, *_ = cases.train(model_class, None)
            torch._dynamo.reset()
            try:
                model, trainer, *_ = cases.train(model_class, {"backend": "aot_eager", **extra})
            except Exception as error:
                print(f"| {name} | stops: {type(error).__name__} | | | |")
                continue
        summary = last_summary(trainer)
        parts = getattr(summary, "parts_steps", {})

        def steps(kind: str, summary=summary, parts=parts) -> str:
            return f"{summary.compiled_steps.get(kind, 0)} / {parts.get(kind, 0)} / {summary.eager_steps.get(kind, 0)}"

        pairs = zip(model.parameters(), eager.parameters(), strict=True)
        difference = max((ours - theirs).abs().max().item() for ours, theirs in pairs)
        print(f"| {name} | {steps('training')} | {steps('evaluation')} | {summary.graphs} | {difference:.1e} |")


if __name__ == "__main__":
    main()
