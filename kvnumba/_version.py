"""kvnumba's version, written here only: pyproject.toml reads it (``[tool.setuptools.dynamic]``)."""
__version__ = "0.1.0"
