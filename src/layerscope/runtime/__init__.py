"""Runtime: corpus readers, batching, the extraction pipeline, pooling and the LayerStore."""
