"""The linearization commands: the sweep's ``config``, ``run`` (``widthscope linearize``), ``summary`` (slopes
over width) and ``activations`` (``widthscope activations``); the maths is :mod:`widthscope.linear`.
"""
