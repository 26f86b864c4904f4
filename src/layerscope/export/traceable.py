"""Model code that torch.onnx would trace into a graph an engine cannot compile, replaced while tracing.

DeBERTa-v2's ``build_rpos`` is a ``torch.jit.script`` function, so its ``if`` (key length != query length)
is exported as an ONNX ``If`` whose branches have different ranks, which OpenVINO's CPU plug-in refuses to
compile ("If operation with dynamic rank"). In self-attention both lengths are those of the same hidden
states, so the branch taken is always the same; a plain Python function in its place is traced to that
branch alone, with the same outputs.
"""

from __future__ import annotations

import contextlib
import sys


def _plain_build_rpos(module):
    def build_rpos(query_layer, key_layer, relative_pos, position_buckets: int, max_relative_positions: int):
        if key_layer.size(-2) != query_layer.size(-2):  # plain ints while tracing: decided once, not in the graph
            return module.build_relative_position(key_layer, key_layer, bucket_size=position_buckets,
                                                  max_position=max_relative_positions)
        return relative_pos

    return build_rpos


@contextlib.contextmanager
def traceable():
    """Within: the loaded model code that would export an engine-hostile graph is plain Python."""
    from unittest.mock import patch

    with contextlib.ExitStack() as stack:
        deberta = sys.modules.get("transformers.models.deberta_v2.modeling_deberta_v2")
        if deberta is not None and hasattr(deberta, "build_rpos"):
            stack.enter_context(patch.object(deberta, "build_rpos", _plain_build_rpos(deberta)))
        yield
