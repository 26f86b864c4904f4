"""The vocabulary every floor shares: layer names and their resolution (``layers``), pooling
names and each pooling's numpy, torch and in-graph renderings (``pooling``), and the names of
the exported graph's outputs (``outputs``).  Imports only ``layerscope.errors``; numpy, torch
and onnx are imported where a rendering needs them."""
