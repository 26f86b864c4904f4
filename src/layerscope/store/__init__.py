"""The LayerStore: its layout, typed spec, checks, lock, disk space, dtypes, ranges, token sections and exporters."""
