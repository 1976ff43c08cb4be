"""widthscope.probe (see docs/architecture.md)."""
