"""widthscope.sweep (see docs/architecture.md)."""
