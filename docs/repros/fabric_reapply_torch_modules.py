"""Fabric's re-apply of ``torch.compile`` over DDP compiles nothing of an ``nn.Sequential`` (torch 2.13, CPU).

    python docs/repros/fabric_reapply_torch_modules.py

``fabric.setup(torch.compile(model))`` under DDP compiles the DDP wrapper (``_reapply_compile=True``, the default since
Lightning #19382). Under DDP's default C++ reducer Dynamo does not trace DDP's forward: it breaks in DDP's own code
(``_inside_ddp_forward`` is skipped on purpose), and resumes by starting a new frame in the module DDP calls. It starts
no frame in torch's own code, so when that module's ``forward`` is torch's (an ``nn.Sequential``), nothing is compiled
and every step runs eagerly. A module class of the user's own is compiled as a frame of its own, and with
``_reapply_compile=False`` (the compiled module inside DDP) both are. DDP's ``forward``, ``_pre_forward`` and
``_post_forward`` run as Python at every step in all four cases (their frames counted with ``sys.setprofile``, which
Dynamo cannot fold away). The Trainer's steps are LightningModule methods, never torch's code, so the re-apply of the
ladder (0005) compiles them in every case. Each case runs in a process of its own (one gloo process). Exit status 1
while the default compiles no graph of the ``nn.Sequential``.

"""

import json
import os
import subprocess
import sys
import types

CASES = [(module, reapply) for module in ("nn.Sequential", "user module") for reapply in (True, False)]


def run(module_kind: str, reapply: bool) -> dict:
    """One case, in this process: what compiled, and which of DDP's frames ran as Python at the last step."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from lightning.fabric import Fabric

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    graphs, runs = [0], [0]

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:  # a function: Fabric deep-copies objects
        graphs[0] += 1

        def call(*args: object) -> object:
            runs[0] += 1
            return gm.forward(*args)

        return call

    codes = {getattr(DistributedDataParallel, n).__code__: n for n in ("forward", "_pre_forward", "_post_forward")}
    python = dict.fromkeys(codes.values(), 0)

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code in codes:
            python[codes[frame.f_code]] += 1

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + CASES.index((module_kind, reapply))))
    fabric = Fabric(accelerator="cpu", devices=1, strategy="ddp")
    fabric.launch()
    layers = (torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = torch.nn.Sequential(*layers) if module_kind == "nn.Sequential" else Net()
    net = fabric.setup(torch.compile(model, backend=backend), _reapply_compile=reapply)
    optimizer = fabric.setup_optimizers(torch.optim.SGD(net.parameters(), lr=0.1))
    steps = 5
    for step in range(steps):
        if step == steps - 1:  # the last step, long after the first compile
            sys.setprofile(profile)
        loss = net(torch.randn(8, 32)).sum()
        sys.setprofile(None)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return {"graphs": graphs[0], "graph runs": runs[0], "steps": steps, "python, last step": python}


def main() -> int:
    """Runs each case in a process of its own and prints the table; 1 while the default compiles no graph."""
    if len(sys.argv) == 3:
        print(json.dumps(run(sys.argv[1], sys.argv[2] == "True")))
        return 0
    import torch

    print(f"torch {torch.__version__}, DDP on one gloo process, 5 steps")
    frames = "DDP `forward` / `_pre_forward` / `_post_forward` as Python, last step"
    print(f"| model | `_reapply_compile` | graphs compiled | graph runs | {frames} |")
    print("|---|---|---|---|---|")
    default_compiles = True
    for module_kind, reapply in CASES:
        out = subprocess.run([sys.executable, __file__, module_kind, str(reapply)], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-3000:])
            return 2
        result = json.loads(out.stdout.strip().splitlines()[-1])  # what `run` printed
        python = " / ".join(str(n) for n in result["python, last step"].values())
        print(f"| {module_kind} | {reapply} | {result['graphs']} | {result['graph runs']} | {python} |")
        if module_kind == "nn.Sequential" and reapply and result["graphs"] == 0:
            default_compiles = False
    return 0 if default_compiles else 1


if __name__ == "__main__":
    sys.exit(main())
