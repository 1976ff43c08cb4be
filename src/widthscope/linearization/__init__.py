"""The linearization commands: what ``widthscope linearize`` and ``widthscope activations`` do.

They read data, build and train models and write results, so they live in the pipelines layer;
the maths they run (linear models, NTK, correlations, side-by-side training, power-law fits) is
:mod:`widthscope.linear`, which does no I/O.

- ``config``: the sweep config (defaults, checks, cells; :data:`~widthscope.linearization.config.DEMO_CONFIG`);
- ``run``: the sweep (:func:`~widthscope.linearization.run.run_sweep`, ``run_file``, ``run_linearize``) and
  its options (:class:`~widthscope.linearization.run.LinearizeOptions`);
- ``summary``: slopes over width against the reference and published slopes (read by the report);
- ``activations``: the activation-derivative audit (:func:`~widthscope.linearization.activations.audit`).

Submodules are imported on use (this package imports nothing), so the report can read
``summary`` without loading the training code.
"""
