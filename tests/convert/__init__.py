"""Whole-cache layout conversion: kv.convert and ``kvnumba convert`` on arrays and files."""
