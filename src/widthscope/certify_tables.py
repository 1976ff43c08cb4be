"""Deprecated module path: moved to :mod:`widthscope.certify.per_point` (issue 20: pipelines as packages).
Kept for one release; import from the new path."""
from ._moved import moved

__getattr__ = moved(__name__, "widthscope.certify.per_point")
