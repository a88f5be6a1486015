"""Figures for the notebooks, one module per part. Shared style lives in :mod:`.style`."""
from .style import use_style

__all__ = ["use_style"]
