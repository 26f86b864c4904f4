"""Regenerate DADApy's GRIDE and TwoNN values on small point sets, the reference tests/metrics/test_geometry.py
holds layerscope's GRIDE to.

DADApy pins numpy<2, so it cannot share layerscope's environment; run this in a throwaway one:

    python -m venv /tmp/dadapy-env
    /tmp/dadapy-env/bin/pip install dadapy==0.3.4
    /tmp/dadapy-env/bin/python scripts/gride_reference.py tests/metrics/data/gride_dadapy.json

The points are made here (seeded) and rounded to 6 decimals, and written beside DADApy's figures, so the test
reads exactly the vectors DADApy saw.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def point_sets() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20260)
    plane = rng.normal(size=(160, 2)) @ rng.normal(size=(2, 6))  # a 2-d plane in 6-d
    gauss = rng.normal(size=(140, 5))  # 5-d Gaussian
    t = rng.uniform(1.5 * np.pi, 4.5 * np.pi, 150)  # a noisy swiss roll (2-d, curved) in 3-d
    roll = np.stack([t * np.cos(t), rng.uniform(0, 10, 150), t * np.sin(t)], 1) + rng.normal(0, 0.2, (150, 3))
    return {name: np.round(x, 6) for name, x in (("plane", plane), ("gauss", gauss), ("roll", roll))}


def main(out: str) -> None:
    import dadapy
    from dadapy import Data

    sets = {}
    for name, x in point_sets().items():
        data = Data(coordinates=x, verbose=False, n_jobs=1)
        ids, errs, ranks = data.return_id_scaling_gride(range_max=16, return_ranks=True)
        twonn = Data(coordinates=x, verbose=False, n_jobs=1).compute_id_2NN(algorithm="ml", mu_fraction=1.0)[0]
        sets[name] = {"points": x.tolist(), "n2": [int(r) for r in ranks], "gride": [float(v) for v in ids],
                      "gride_error": [float(v) for v in errs], "twonn_ml": float(twonn)}
    doc = {"made_by": f"dadapy {dadapy.__version__ if hasattr(dadapy, '__version__') else '0.3.4'}, "
                      f"numpy {np.__version__}; scripts/gride_reference.py", "sets": sets}
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
        fh.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
