"""The statistics: pure computation over runs (no SQLAlchemy, no plotting, no printing)."""
