"""One probed example, counted (for :mod:`widthscope.certification.plan`): FLOPs, saved bytes, live peak.

The counting core is :mod:`widthscope.probe.cost` (shared with the training plans of ``grow``,
``linearize``, ...); this module keeps the name certify's plan has always imported.
"""

from __future__ import annotations

from ..probe.cost import count_pass

__all__ = ["count_pass"]
