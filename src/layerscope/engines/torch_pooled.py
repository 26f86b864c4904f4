"""Pooled-only runs of the PyTorch engine: each layer is pooled as its block produces it and kept no longer.

A run that asks for pooled vectors only never requests ``output_hidden_states`` (which keeps every layer's
``[batch, tokens, hidden]`` alive until the forward returns) nor a key/value cache. Hooks on the block stack
(the list engines/truncate.py finds, after any truncation) hand each layer to the pooling:

- layer 0, the blocks' input: a forward pre-hook on the first block;
- layer i (1 <= i < K, K blocks in the stack): a forward hook on block i-1 (its output, or ``[0]`` of it);
- layer K: the output of the anatomy's final norm where layer L carries it (decoders, T5: Hugging Face's
  ``hidden_states[K]`` is that tensor; a truncated stack's final norm is an identity), else block K-1's output
  (CLIP text, ModernBERT, BERT-like encoders: ``hidden_states[K]`` is the last block's output).

So at most the layer being pooled, the block's own activations and the next layer's input are alive at once.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Callable

from layerscope.model.anatomy_rules import block_input, block_output
from layerscope.vocab.outputs import OWN_LAST

if TYPE_CHECKING:
    import numpy as np

    from layerscope.model.tokenize import Batch


class HookMissed(RuntimeError):
    """A hook did not see a layer it was placed for: the model's own code feeds its blocks differently."""


def first_input(args: tuple, kwargs: dict):
    """The hidden states a block is called with: its first positional argument, or ``hidden_states=``."""
    states = block_input(args, kwargs)
    if states is None:
        raise HookMissed("the first block was called without its hidden states as the first argument")
    return states


def hooked_layers(net, blocks, feed: dict, wanted: set[int], take: Callable[[int, object], None], *,
                  top_norm: str | None = None, own: Callable[[object], None] | None = None) -> None:
    """Run ``net`` once on ``feed`` (torch tensors) without hidden states, calling ``take(layer, states)`` for
    each layer in ``wanted`` as soon as it exists; ``blocks`` is the (possibly truncated) non-empty stack.
    ``top_norm``: the module whose output is the last layer (the anatomy's final norm where layer L carries it),
    else the last block's output is; ``own``: called with the model's own last hidden state."""
    count = len(blocks)
    seen: set[int] = set()

    def give(index: int, states) -> None:
        seen.add(index)
        if index in wanted:
            take(index, states)

    handles = [blocks[0].register_forward_pre_hook(lambda _m, args, kwargs: give(0, first_input(args, kwargs)),
                                                   with_kwargs=True)]
    last_hooked = count - 1 if top_norm else count
    for i in range(last_hooked):
        handles.append(blocks[i].register_forward_hook(
            lambda _m, _a, out, index=i + 1: give(index, block_output(out))))
    if top_norm:
        handles.append(net.get_submodule(top_norm).register_forward_hook(lambda _m, _a, out: give(count, out)))
    kwargs = {"output_hidden_states": False, "return_dict": True}
    params = inspect.signature(net.forward).parameters
    if "use_cache" in params:  # a key/value cache would keep two activations of every block alive
        kwargs["use_cache"] = False
    try:
        out = net(**feed, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if own is not None:
        own(out.last_hidden_state)
    del out
    missed = sorted(wanted - seen)
    if missed:
        raise HookMissed(f"no block handed over layer {missed[0]}")


def hand_over_layers(engine, blocks, feed: dict, layers: list[str], take: Callable[[str, object], None]) -> None:
    """One forward pass handing each of ``layers`` to ``take(name, states)`` as it is produced (``raw``: the
    rows of the word-embedding matrix, as run_tokens gives them; ``OWN_LAST``: the model's own last hidden
    state, once the forward returns)."""
    torch = engine.torch
    with torch.inference_mode():
        wanted = {int(n) for n in layers if n.isdigit()}
        own = (lambda states: take(OWN_LAST, states)) if OWN_LAST in layers else None
        hooked_layers(engine.net, blocks, feed, wanted, lambda i, s: take(str(i), s), top_norm=engine.top_norm,
                      own=own)
        if "raw" in layers:
            take("raw", torch.nn.functional.embedding(feed["input_ids"], engine.word_embeddings.weight))


def pooled_by_layer(engine, batch: Batch, layers: list[str], poolings: list[str], blocks) -> dict[str, np.ndarray]:
    """``{pooling: [layers, batch, hidden]}`` of a text batch, each layer pooled as it is produced: on the CPU
    in fp32 with ``pool_states`` (numpy, as a run of token states pools), elsewhere with ``pool_torch`` in fp32
    on the device (only the pooled vectors are copied back)."""
    import numpy as np

    from layerscope.engines.base import pool_states
    from layerscope.vocab.pooling import pool_torch

    torch = engine.torch
    device = engine.device
    on_device = device.type != "cpu" or engine.precision != "fp32"
    feed = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in batch.inputs.items()}
    mask = torch.from_numpy(np.ascontiguousarray(batch.mask)).to(device)
    ids = torch.from_numpy(np.ascontiguousarray(batch.input_ids)).to(device)
    eos = engine.manifest.eos_token_id
    pooled: dict[str, dict[str, np.ndarray]] = {}

    def take(name: str, states) -> None:
        if on_device:
            f = states.float()
            pooled[name] = {m: pool_torch(f, mask, m, input_ids=ids, eos_token_id=eos).cpu().numpy()
                            for m in poolings}
        else:
            arr = states.float().cpu().numpy()
            pooled[name] = {m: pool_states(engine.manifest, batch, arr, m) for m in poolings}

    hand_over_layers(engine, blocks, feed, layers, take)
    return {m: np.stack([pooled[n][m] for n in layers]) for m in poolings}


def pooled_and_kept(engine, batch: Batch, layers: list[str], poolings: list[str], token_layers: list[str],
                    keep: Callable[[str, np.ndarray], object], blocks) -> tuple[dict[str, np.ndarray], list]:
    """``({pooling: [layers, batch, hidden]}, [keep(layer, states) for layer in token_layers])`` of a text
    batch from one forward pass, each layer pooled (and, in ``token_layers``, handed to ``keep``) as it is
    produced, as float32 numpy on the CPU: the pooling and the states ``run_with_tokens`` gives, without every
    hidden state alive at the end of the forward."""
    import numpy as np

    from layerscope.engines.base import pool_states

    torch = engine.torch
    feed = {k: torch.from_numpy(np.ascontiguousarray(v)).to(engine.device) for k, v in batch.inputs.items()}
    pooled: dict[str, dict[str, np.ndarray]] = {}
    kept: dict[str, object] = {}
    stored = set(token_layers)

    def take(name: str, states) -> None:
        arr = states.float().cpu().numpy()
        pooled[name] = {m: pool_states(engine.manifest, batch, arr, m) for m in poolings}
        if name in stored:
            kept[name] = keep(name, arr)

    hand_over_layers(engine, blocks, feed, layers, take)
    return {m: np.stack([pooled[n][m] for n in layers]) for m in poolings}, [kept[n] for n in token_layers]
