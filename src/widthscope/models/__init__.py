"""widthscope.models (see docs/architecture.md)."""
