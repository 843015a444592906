"""The planning wing: what kvnumba builds once per geometry, before any call launches.

- ``spec``: the table of entry points (arguments, roles, layouts);
- ``cache``: plans found by the value of their buffers (one key function);
- ``kernel_plan``: a kernel entry point's validated plan and its per-call ``run``;
- ``fast_path``: a kernel plan's fast call (``KernelPlan.fast``);
- ``copy_plan``: ``kv.copy``'s plan, read from two cache views;
- ``staged_plan`` and ``tensor_maps``: whether loads take the staged (bulk-copy) kernel, and its maps;
- ``direct_plan``: the copy-engine entry points' plan and per-call path;
- ``device_tables``: address tables placed where the kernels read them.

It sits between the kernels and the public calls: ``driver <- kernels <- plan <- api <- tools``
(``tests/test_layers.py`` holds the package to it).
"""
