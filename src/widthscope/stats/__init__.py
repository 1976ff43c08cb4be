"""widthscope.stats (see docs/architecture.md)."""
