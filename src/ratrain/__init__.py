"""ratrain: resource-aware lifecycle-scheduled pipeline training (RATrain, arXiv 2606.10415)."""

__version__ = "0.1.0"
