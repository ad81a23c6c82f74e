"""Offline datasets, covariate rasters and point patterns (NumPy)."""
