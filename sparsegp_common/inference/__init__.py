"""Training (``fit``), prediction and diagnostics, written once for both backends."""
