"""The model floor: what a model is, before any engine runs it.

Families (every per-family fact), source loading, the manifest of an export and its checks, the
``ModelHandle``, tokenization and the sentence-transformers recipe.  Nothing here imports
onnxruntime, and torch/transformers are imported only inside the functions that load a model.
"""
