"""The planning wing: what kvnumba builds once per geometry, before any call launches (one module a job: see
docs/architecture.md). It sits between the kernels and the public calls: ``driver <- kernels <- plan <- api <-
tools`` (``tests/test_layers.py`` holds the package to it).
"""
