"""The planning wing: what kvnumba builds once per geometry, before any call launches.

- ``spec``: the table of entry points (arguments, roles, layouts);
- ``sides``: the one ``Side`` (one end of a copy as plain numbers) and the checks every buffer and table
  goes through;
- ``seed_args``: a seed entry point's arguments read as two sides (sizes validated once per value);
- ``copy_plan``: ``kv.copy``'s two cache views read as two sides;
- ``kernel_plan``: a kernel transfer's plan, built from two sides;
- ``fp8_plan``: an FP8 ``kv.copy``'s plan (a ``kv.Fp8View`` on a side);
- ``per_call``: what every call of a kernel plan does, ``run`` and the one fast call (``KernelPlan.fast``);
- ``build``: where a call's plan comes from (its cache, a rebind, a new plan of any kind), and a plain
  entry point's per-call function: a miss calls down from here, never back up to ``api``;
- ``cache``: plans found by the value of their buffers (one key function, one lookup), and the one registry
  of plan memos;
- ``routes``: ``kv.copy``'s kernel and copy-engine routes;
- ``memo``: the one bounded memo;
- ``staged_plan`` and ``tensor_maps``: whether loads take the staged (bulk-copy) kernel, and its maps;
- ``direct_plan``: the copy-engine entry points' plan and per-call path;
- ``device_tables``: address tables placed where the kernels read them.

It sits between the kernels and the public calls: ``driver <- kernels <- plan <- api <- tools``
(``tests/test_layers.py`` holds the package to it).
"""
