"""Extraction: requests, preparation, corpus spooling, batching, and the in-process, --shard and Ray executors that fill a LayerStore."""
