"""The features of ``Trainer(use_compile=...)``: one module per key of the ``use_compile`` dict, named after it.

Each module names its ``_CompileFeature`` as ``FEATURE``. Their hooks run in the order of :data:`FEATURES`
(``teardown`` in reverse); each feature's ``order`` says how its ``wrap`` nests around the compiled call. The list
names every feature; a Lightning that has some of their modules only (a fork that took some of the patches that add
them) runs those, in this order.

"""

#: The feature modules, in the order their hooks run.
FEATURES: tuple[str, ...] = (
    "cache",
    "compile_budget",
    "compile_errors",
    "compiled_autograd",  # before `optimize_ddp`, whose "auto" keeps the python reducer that this one sets
    "no_grad_evaluation",
    "fallback",
    "defer_logging",
    "dynamic_loop_counters",
    "eager_metrics",
    "optimize_ddp",
    "eager_optimizer_steps",
    "dynamic_lr",
    "regions",
    "in_parts",  # after `regions`: a module a region compiled is left as it is
    "summary",
    "list_outputs",
    "check_tensor_parallel",  # after `regions`: what a region compiles with its hooks passes the check
    "stage_guards",
)
