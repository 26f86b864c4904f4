"""What an export records of the model's anatomy (model/anatomy.py): resolved on the loaded model, and the
manifest's entries it decides, held to the graph that was exported."""

from __future__ import annotations

from typing import Any

from layerscope.errors import ExportError
from layerscope.model.manifest_type import Manifest
from layerscope.vocab.outputs import OWN_LAST


def model_anatomy(net, family, num_layers: int, head: dict[str, Any] | None):
    """The anatomy of the loaded base model ``net`` (model/anatomy.py), checked by a forward pass, with the head's
    part ``save_head`` found on the with-head model."""
    from layerscope.model.anatomy import resolve_anatomy, with_head

    anatomy = resolve_anatomy(net, family, num_layers)
    return with_head(anatomy, **head) if head else anatomy


def anatomy_facts(anatomy, model: Manifest, outputs) -> dict[str, Any]:
    """The manifest's entries the anatomy decides: itself, whether layer L has the final norm, and what layer L
    and the model's own last hidden state are (a note the description made, OPT's projection, is kept); the
    graph must carry the model's own last hidden state exactly where the anatomy says it is not layer L."""
    carried = OWN_LAST in outputs
    if carried != (anatomy.last_hidden_state == "final_norm"):
        raise ExportError(f"the exported graph {'carries' if carried else 'lacks'} the model's own last hidden state "
                          f"({OWN_LAST}) where its anatomy says it is {anatomy.last_hidden_state!r}; nothing was written")
    return {"anatomy": anatomy.to_dict(), "final_norm_in_last_layer": anatomy.final_norm_in_hidden_states,
            "last_layer_note": model.raw.get("last_layer_note") or anatomy.last_layer_note(carried=carried)}
