"""Writers for what people read: console tables, plots and reports (from saved results only)."""
