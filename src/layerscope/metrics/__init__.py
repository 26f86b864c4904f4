"""Pure metric functions: numpy arrays in, plain numbers / arrays / dicts out.

No I/O, no torch, no onnxruntime; faiss is imported lazily by
:func:`layerscope.metrics.neighbors.knn_indices` only. One module a topic:

* ``checks``       input checks and row-block iteration shared by all of them
* ``vectors``      L2 normalisation, paired cosines, float64 column moments
* ``correlation``  Pearson / Spearman with a percentile bootstrap interval
* ``comparison``   sign test, paired differences, the compositionality summary
* ``proportion``   Wilson and Clopper-Pearson intervals of a share (valid at 0 and 1)
* ``permutation``  matched vs scrambled pairs: z-scores (exact, exhaustive, Monte Carlo with its SE)
* ``neighbors``    nearest neighbours: exact k-NN, mutual k-NN, retrieval ranks and figures
* ``cka``          linear CKA (in memory and streamed) and unbiased CKA
* ``representation`` SVCCA, PWCCA, Procrustes, RSA, Gram-form CKA; permutation-calibrated scores
* ``geometry``     intrinsic dimension (TwoNN, GRIDE), anisotropy, effective rank, matrix entropy
* ``pca``          PCA summary and Cohen's d
* ``quantization`` binary / int8 codes, Hamming similarity, truncation, retention

Conventions used throughout:

* Rows are items, columns are features (``[n, d]``).
* Sums that decide a result (dot products, Gram matrices, moments) are
  accumulated in float64, in row blocks, so float32 stores of any size never
  need a full float64 copy.
* A metric that is not defined for its input either raises ``ValueError``
  with the reason (functions that return a bare float) or reports the reason
  in an ``undefined`` field and leaves the value ``None`` (correlations,
  z-scores). Nothing returns NaN.

Statistics come from SciPy where it has them (``pearsonr``, ``spearmanr``,
``rankdata``, ``binomtest``, ``bootstrap``); the rest is written here and
tested against hand-computed values in ``tests/metrics/``.
"""
