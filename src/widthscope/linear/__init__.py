"""widthscope.linear (see docs/architecture.md)."""
