"""Figures for the notebooks, one module per part. Shared style lives in :mod:`.style`."""
