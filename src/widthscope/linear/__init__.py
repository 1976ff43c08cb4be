"""Linearization diagnostics: linear models, empirical NTK, derivative correlations, side-by-side
training, power-law fits and the activation audit (see docs/linearization.md).

Example::

    >>> import torch, widthscope
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    >>> lin = widthscope.linearize(net)
    >>> K = widthscope.ntk(net, torch.randn(4, 3))
"""

from .correlation import correlation, correlation_summary
from .empirical import ntk, structured_ntk
from .kernels import nngp
from .model import LinearizedModel, linearize
from .powerlaw import SlopeFit, fit_slope
from .trainer import function_space_gd, kernel_predict, train_side_by_side

__all__ = [
    "LinearizedModel",
    "linearize",
    "ntk",
    "nngp",
    "correlation",
    "correlation_summary",
    "train_side_by_side",
    "function_space_gd",
    "fit_slope",
    "SlopeFit",
    "structured_ntk",
    "kernel_predict",
]
