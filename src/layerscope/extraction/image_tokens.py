"""The token-level half of an image extraction (``extract-images --tokens``): every token of every image.

A vision tower's sequence has the same length for every image: ``prefix`` tokens (CLS, then DINOv2's
register tokens; none in SigLIP) followed by the patch grid, row by row.  The arrays are the text token
stores' (store/token_store.py), so ``store.tokens(layer)`` reads both alike; for an image:

* ``ids``: what the token is, ``0`` CLS, ``1`` a register token, ``2`` a patch (``strings.json`` names them);
* ``special``: 1 for CLS and register tokens;
* ``grid.npy``: a patch's (row, col) in the grid, (-1, -1) for CLS and register tokens;
* ``spans``: (0, 0) (an image has no characters).

These follow from the tower's geometry alone, so they are written whole when the arrays are reserved; each
batch then writes its images' token vectors into their own rows, flushed before the rows are marked done.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from layerscope.errors import StoreError
from layerscope.store.token_store import (GRID, IDS, SPECIAL, STRINGS, TokenSection, TokenWriter,
                                            create_token_arrays, describe_cost, layer_file)

CLS, REGISTER, PATCH = 0, 1, 2
TOKEN_STRINGS = {str(CLS): "<cls>", str(REGISTER): "<register>", str(PATCH): "<patch>"}


def image_layout(image) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, special, grid)`` of one image's tokens for a tower of geometry ``image`` (``manifest.image``)."""
    rows, cols = image.height // image.patch_size, image.width // image.patch_size
    prefix = image.prefix_tokens
    if prefix + rows * cols != image.tokens:
        raise StoreError(f"the export records {image.tokens} tokens per image, but {prefix} prefix tokens and a "
                         f"{rows}x{cols} patch grid make {prefix + rows * cols}; export the model again")
    cls = prefix - image.register_tokens  # 1, or 0 for a tower without a CLS token
    ids = np.array([CLS] * cls + [REGISTER] * image.register_tokens + [PATCH] * (rows * cols), dtype=np.int32)
    special = (ids != PATCH).astype(np.uint8)
    r, c = np.divmod(np.arange(rows * cols, dtype=np.int32), cols)
    grid = np.concatenate([np.full((prefix, 2), -1, np.int32), np.stack([r, c], axis=1)]).astype(np.int32)
    return ids, special, grid


class ImageTokenWriter(TokenWriter):
    """Writes a batch's token states (``[batch, tokens, hidden]`` per layer) into its images' rows: every token
    of an image is real, so a batch needs no check before it runs (``keep`` holds the engine to the export's
    token count)."""

    def __init__(self, root: Path, section: TokenSection, per_image: int):
        super().__init__(root, section)
        self.per_image = int(per_image)

    def keep(self, batch, layer: str, state: np.ndarray) -> np.ndarray:
        """The layer's ``[batch, tokens, hidden]`` states as ``[batch * tokens, hidden]`` in the storage type,
        image by image; a token count other than the export's is refused in one line."""
        state = np.asarray(state)
        if state.shape[1] != self.per_image:
            raise StoreError(f"the engine gave {state.shape[1]} tokens per image at layer {layer}, the export "
                             f"records {self.per_image}")
        return self.encode(state.reshape(-1, state.shape[-1]), layer)

    def write(self, batch, kept: list[np.ndarray]) -> None:
        rows = np.asarray(batch.index, dtype=np.int64)
        where = (rows[:, None] * self.per_image + np.arange(self.per_image)).ravel()
        for layer, values in zip(self.section.layers, kept):
            self._array(layer_file(layer))[where] = values

    def write_strings(self, tokenizer=None) -> None:
        from layerscope.atomic import write_json_atomic

        write_json_atomic(self.root / STRINGS, TOKEN_STRINGS)


def start_image_tokens(store, image, layers: list[str]):
    """The token half of this image run (``TokenRun``, store/token_write.py), or None when the store holds
    no tokens.  A new store's arrays are reserved and their layout written; a resumed one's reopened."""
    from layerscope.ownership import note
    from layerscope.store.token_write import TokenRun, log

    want = store.spec.tokens
    if want is None:
        return None
    section = store.record.token_arrays
    if section is None:
        if int(store.done_mask().sum()):
            raise StoreError(f"{store.path} has rows done but no token arrays; re-run with --force")
        n, per_image = store.n, image.tokens
        log.info(describe_cost(n * per_image, n, layers, store.hidden_size, want.dtype))
        note(Path(store.path), files=[GRID])
        ids, special, grid = image_layout(image)
        section = create_token_arrays(Path(store.path), np.full(n, per_image), per_image, layers,
                                      store.hidden_size, want.dtype)
        root = Path(store.path)
        for rel, one in ((IDS, ids), (SPECIAL, special)):
            arr = np.load(root / rel, mmap_mode="r+")
            arr[:] = np.tile(one, n)
            arr.flush()
        np.save(root / GRID, np.tile(grid, (n, 1)))
        store.add_token_arrays(section)
    return TokenRun(ImageTokenWriter(Path(store.path), section, image.tokens))
