"""widthscope.data (see docs/architecture.md)."""
