"""The features the package turns on for every ``Trainer(use_compile=...)``.

Upstream (``patches/``), each feature beyond the core does nothing unless its own key is set, so that applying it
changes nothing for a user who did not ask for it. The package is a distribution of the whole ladder, and turns these
on whenever ``use_compile`` is set; a key the user sets wins (``use_compile={"summary": False}``). A compiled model
passed in without ``use_compile`` is compiled again after the wrap with its own arguments, and gets only the features
that change nothing beyond the model and its Trainer (``INPUT_DEFAULTS``): no backend is replaced (so no summary) and
no torch setting changed (the shared code the run crowded is still reset at its end).

"""

import types

FEATURE_DEFAULTS = types.MappingProxyType(
    {
        "summary": True,  # count compiled and eager steps, and warn of each eager step's cause
        "compile_errors": True,  # a compile error names the run and the fix; the next run compiles afresh
        "defer_logging": True,  # `self.log` outside the graph (Lightning 2.6 traces it)
        "eager_metrics": True,  # torchmetrics outside the graph
        "dynamic_loop_counters": True,  # `current_epoch` and `global_step` do not recompile the step
        "compile_budget": True,  # each Trainer's runs get their own recompile budget (sweeps in one process)
        "stage_guards": True,  # a step that reads `trainer.state` compiles once per stage (an Enum key is unguarded)
        "no_grad_evaluation": True,  # evaluation under `no_grad` (Dynamo fails on some inference-mode steps)
        "list_outputs": True,  # `self.outputs.append(...)` in a step does not recompile it as the list grows
        "check_tensor_parallel": True,  # refuse what tensor parallelism cannot compile whole, before the first step
        "dynamic_lr": True,  # the learning rate a step reads from `self.optimizers()` does not recompile it
        "eager_optimizer_steps": True,  # manual optimization's `opt.step()`/`sch.step()` run outside the graph
        "in_parts": True,  # where Dynamo cannot compile a step whole, the modules it calls still run compiled
        "optimize_ddp": "auto",  # DDP's graph split only with more than one process
    }
)

#: The features a compiled model passed in without ``use_compile`` gets: each changes the model or its Trainer only.
INPUT_DEFAULTS = types.MappingProxyType(
    {
        key: FEATURE_DEFAULTS[key]
        for key in (
            "defer_logging",  # the module's `log`/`log_dict`
            "eager_metrics",  # the model's metrics
            "stage_guards",  # the Trainer's state
            "no_grad_evaluation",  # the Trainer's evaluation loops
            "list_outputs",  # the module's lists
            "dynamic_lr",  # the module's `optimizers`
            "eager_optimizer_steps",  # the run's own optimizer and scheduler classes, the module's toggles
            "check_tensor_parallel",  # a check
        )
    }
)
