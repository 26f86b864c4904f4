"""FAISS nearest-neighbour indexes, built on :mod:`layerscope.metrics.neighbors`.

* ``backend``      where search runs (FAISS GPU/CPU, exact PyTorch top-k on a GPU)
* ``vector_index`` one index: build, search, save, load; recall against exact search
* ``store_index``  an index over one (pooling, layer) of a LayerStore, and text queries against it
* ``search``       retrieval ranks and self k-NN through an index
* ``alignment``    the alignment figures of two paired vector sets (z, retrieval, mutual k-NN, PCA)
* ``bench``        ``python -m layerscope.index.bench``: build/query times and alignment at scale
"""
