"""The linearization commands (pipelines: they read data, train and write results): ``config`` (the sweep
config), ``run`` (``widthscope linearize``), ``summary`` (slopes over width, read by the report) and
``activations`` (``widthscope activations``). The maths is :mod:`widthscope.linear`. Submodules are imported
on use, so the report can read ``summary`` without loading the training code.
"""
