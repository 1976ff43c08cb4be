"""widthscope.report (see docs/architecture.md)."""
