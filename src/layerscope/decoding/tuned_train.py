"""Training a tuned lens from a token store (``layerscope train-lens``): the paper's recipe on stored vectors.

Belrose et al. (2023) and tuned-lens 0.2 train each layer's translator to make the layer's decoded distribution
match the model's final one: the loss of layer ``l`` is ``KL(final || lens_l)`` averaged over positions, the
final distribution the model's own logits at the same position. Here the hidden states are not recomputed: every
layer's token vectors come from a LayerStore made with ``extract --tokens`` (every layer, ``0..L``), the final
distribution is the model's head applied to the stored layer ``L``, and each step draws ``tokens_per_step``
stored tokens (a fresh seeded permutation of all of them per epoch, so a step is a function of the seed and its
number alone: nothing but the translators and their momentum needs saving to resume).

The recipe (``TrainSettings``: tuned-lens's defaults): translators initialised to the identity, SGD with Nesterov
momentum 0.9 and learning rate ``lr_scale * (1 - momentum)``, weight decay 1e-3, gradients of all translators
clipped to norm 1 together, no warmup, the rate decaying linearly to zero over the steps. Where this differs from
tuned-lens: it computes in float32 (tuned-lens's training autocasts to bfloat16 on a GPU), so its loss and a
hand computation agree to float32's digits; its tokens are drawn at random from the store, not read as 2,048-token
chunks (the loss is a mean over positions, so the expectation is the same); and a store holding fewer tokens than
``steps x tokens_per_step`` is read for several epochs, where tuned-lens reads fresh text from the Pile.

Each step's tokens are decoded in micro-batches whose logits stay within ``LOGIT_BYTES`` (the head's backward
holds about six vocabulary-wide float32 rows per token), gradients accumulated. A checkpoint
(``checkpoints/last.safetensors``: translators, momentum, step, loss so far and the run's identity, safetensors
only) is written every ``checkpoint_every`` steps (default: once ``CHECKPOINT_S`` seconds have passed since the
last), and at Ctrl-C the steps finished so far are kept; ``--resume`` continues from it exactly, refusing in one
line a checkpoint of another model, store or recipe.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from layerscope.decoding.tuned_record import TrainRecord, TrainSettings
from layerscope.errors import InputError, Interrupted, StoreError

LOGIT_BYTES = 1 << 30  # vocabulary-wide float32 rows held at once by a micro-batch, forward and backward
ROW_BYTES = 6 * 4  # bytes per token and vocabulary entry while one layer's loss is differentiated
MAX_MICRO = 4096  # tokens per micro-batch at most (small vocabularies)
CHECKPOINT_S = 300.0
CHECKPOINTS, LAST = "checkpoints", "last.safetensors"
CHECKPOINT_FORMAT = "1"


@dataclass(frozen=True)
class TrainInputs:
    """What a training run reads, opened and checked: the store, its model, and the model's head."""

    store: object  # LayerStore
    handle: object  # ModelHandle
    decoding: object  # DecodingModel
    layers: list  # TokenLayer per layer 0..L

    @property
    def num_layers(self) -> int:
        return int(self.handle.manifest.num_layers)


def micro_batch(vocab: int, budget: int = LOGIT_BYTES) -> int:
    """Tokens per micro-batch: their vocabulary-wide rows within ``budget`` bytes."""
    return int(max(1, min(MAX_MICRO, budget // (ROW_BYTES * max(1, int(vocab))))))


class TokenSampler:
    """The store's token rows for each step: step ``s`` takes rows ``s*B .. (s+1)*B`` of an endless sequence of
    seeded permutations of all ``total`` rows (one per epoch), so any step can be drawn again from its number."""

    def __init__(self, total: int, per_step: int, seed: int):
        self.total, self.per_step, self.seed = int(total), int(per_step), int(seed)
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.total)
        return self._perms[epoch]

    def rows(self, step: int) -> np.ndarray:
        start, stop = step * self.per_step, (step + 1) * self.per_step
        out, g = [], start
        while g < stop:
            epoch, at = divmod(g, self.total)
            take = min(stop - g, self.total - at)
            out.append(self._perm(epoch)[at:at + take])
            g += take
        return np.concatenate(out).astype(np.int64)


def open_inputs(store_path: str | Path, model: str | None = None) -> TrainInputs:
    """The store and model a lens is trained from, each refused in one line before any weight is read where it
    cannot serve: a store without every layer's tokens, an image store, another model's weights, a model without
    a trained LM head."""
    from layerscope.store.store import LayerStore

    store = LayerStore.open(store_path)
    manifest = store.manifest
    if manifest.modality == "image":
        raise InputError(f"{store_path} holds an image tower's vectors; a tuned lens decodes into a vocabulary, "
                         "which an image tower has none of")
    tokens = store.token_layers
    if not tokens:
        raise StoreError(f"{store_path} holds no token vectors; the tuned lens trains on every token: make the store "
                         "with layerscope extract ... --tokens --layers all")
    wanted = [str(i) for i in range(int(manifest.num_layers) + 1)]
    missing = [x for x in wanted if x not in tokens]
    if missing:
        raise StoreError(f"{store_path} holds token vectors of layers {', '.join(tokens)}, not of {', '.join(missing)}; "
                         f"the tuned lens needs every layer 0..{manifest.num_layers}: extract with --tokens "
                         "--layers all")
    from layerscope.model.handle import ModelHandle

    spec = model or store.spec.model
    if not spec:
        raise StoreError(f"{store_path} does not record its model; pass --model")
    handle = ModelHandle.resolve(spec)
    if handle.key != (store.spec.model_key or manifest.key):
        raise InputError(f"--model {spec} is not the model {store_path} was extracted with "
                         f"({store.spec.model or manifest.source.path_or_id}); give that model")
    from layerscope.decoding.heads import TIED, load_decoding_model

    anatomy = handle.manifest.anatomy  # an export's record says so before any weight is read
    if anatomy is not None and not anatomy.head:
        raise InputError(f"{spec} has no LM head; a tuned lens learns to match the model's own output "
                         "distribution, which needs one")
    decoding = load_decoding_model(handle)
    if decoding.info.kind == TIED:
        raise InputError(f"{spec} has no trained LM head ({decoding.info.description.split(': ', 1)[-1]}); a "
                         "tuned lens learns to match the model's own output distribution, which needs that head")
    layers = [store.tokens(x) for x in wanted]
    return TrainInputs(store, handle, decoding, layers)


def train_lens(store_path: str | Path, out: str | Path, *, model: str | None = None,
               settings: TrainSettings = TrainSettings(), resume: bool = False, force: bool = False,
               checkpoint_every: int | None = None, say: Callable[[str], None] | None = None) -> TrainRecord:
    """Train a tuned lens on the token store at ``store_path`` and save it in ``out`` (tuned-lens's layout plus
    ``lens.json``); returns its record. ``resume``: continue ``out``'s checkpoint. Holds ``out``'s write lock."""
    from layerscope.out_lock import out_lock

    settings.check()
    if checkpoint_every is not None and checkpoint_every < 1:
        raise InputError(f"--checkpoint-every must be at least 1 step, not {checkpoint_every}")
    with out_lock(out):
        return _train(store_path, Path(out), model=model, settings=settings, resume=resume, force=force,
                      checkpoint_every=checkpoint_every, say=say or (lambda _line: None))


def _identity(inputs: TrainInputs, settings: TrainSettings) -> dict:
    store, m = inputs.store, inputs.handle.manifest
    return {"model_key": m.key, "store_id": store.store_id, "corpus_sha256": store.spec.corpus_sha256,
            "tokens": int(inputs.layers[0].total_tokens), "num_layers": int(m.num_layers),
            "hidden_size": int(m.hidden_size), "settings": settings.to_dict()}


def _train(store_path, out: Path, *, model, settings: TrainSettings, resume: bool, force: bool,
           checkpoint_every, say) -> TrainRecord:
    import torch

    from layerscope.decoding.tuned_lens import (LensConfig, Translators, head_unembedding, translated_head,
                                                unembedding_hash, write_lens)
    from layerscope.ownership import claim, remove, writing
    from layerscope.progress import LINE_EVERY_S, steps as progress

    where = claim(out, "lens", force=force, keep=resume, inputs=[store_path])
    inputs = open_inputs(store_path, model)
    manifest = inputs.handle.manifest
    n_layers, width, vocab = inputs.num_layers, int(manifest.hidden_size), int(manifest.vocab_size)
    identity = _identity(inputs, settings)
    start = _Progress.fresh(n_layers, width)
    ckpt = out / CHECKPOINTS / LAST
    if resume and ckpt.is_file():
        start = _Progress.read(ckpt, identity, n_layers, width)
        say(f"resuming from step {start.step} of {settings.steps} ({ckpt})")
    elif resume and where.existed and where.kind == "lens":
        raise InputError(f"{out} holds no checkpoint to resume (a lens whose training finished, or none started); "
                         "pass --force to train it again")
    if where.replace:
        remove(out, "lens")
    total = int(inputs.layers[0].total_tokens)
    lens = translated_head(inputs.decoding.head, start.translators, trainable=True)
    params = [p for p in lens.translators.parameters()]
    opt = torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum, nesterov=True,
                          weight_decay=settings.weight_decay)
    start.restore_momentum(opt, lens)
    sampler = TokenSampler(total, settings.tokens_per_step, settings.seed)
    micro = micro_batch(vocab)
    say(f"tuned lens: {n_layers} translators of {width} x {width}, {settings.steps} steps of "
        f"{settings.tokens_per_step:,} tokens drawn from {total:,} stored tokens, micro-batches of {micro:,}")
    state = start
    last_saved = said = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with writing(out, "lens") as wrote:
        bar = progress("tuned lens: tokens trained on", (settings.steps - state.step) * settings.tokens_per_step)
        t0 = time.perf_counter()
        try:
            for step in range(state.step, settings.steps):
                losses = _one_step(lens, inputs, sampler.rows(step), micro, settings, step, opt, params, bar)
                state = state.after(losses, settings.tokens_per_step, time.perf_counter() - t0)
                t0 = time.perf_counter()
                if step in (start.step, settings.steps - 1) or time.perf_counter() - said >= LINE_EVERY_S:
                    say(f"step {step + 1}/{settings.steps}: KL to the final layer {np.mean(losses):.4f} nats "
                        f"(layer 0 {losses[0]:.4f}, layer {n_layers - 1} {losses[-1]:.4f})")
                    said = time.perf_counter()
                due = (step + 1) % checkpoint_every == 0 if checkpoint_every else \
                    time.perf_counter() - last_saved >= CHECKPOINT_S
                if due and step + 1 < settings.steps:
                    state.with_translators(lens).write(ckpt, identity, opt, lens, wrote)
                    last_saved = time.perf_counter()
        except KeyboardInterrupt:
            bar.close()
            kept = _Progress.read(ckpt, identity, n_layers, width).step if ckpt.is_file() else 0
            raise Interrupted(f"interrupted at step {state.step + 1} of {settings.steps}; {kept} steps are kept in "
                              f"{ckpt if kept else out}: continue with layerscope train-lens ... --resume"
                              if kept else f"interrupted at step {state.step + 1}; no checkpoint was due yet, "
                              "nothing was kept") from None
        bar.close()
        final = lens.translators_now()
        head = inputs.decoding
        unembedding = head_unembedding(head)
        source = manifest.source
        config = LensConfig(base_model_name_or_path=str(source.path_or_id), d_model=width,
                            num_hidden_layers=n_layers, bias=True, base_model_revision=source.revision,
                            unembed_hash=unembedding_hash(unembedding) if unembedding is not None else None)
        sha, own_sha = write_lens(out, final, config, wrote)
        store = inputs.store
        record = TrainRecord(model=str(inputs.handle.spec), model_key=manifest.key, family=str(manifest.family),
                             num_layers=n_layers, hidden_size=width, vocab_size=vocab, head=head.info.kind,
                             store=str(Path(store_path).resolve()), store_id=store.store_id,
                             corpus_sha256=store.spec.corpus_sha256, texts=int(store.n), tokens=total,
                             settings=settings, steps_done=state.step, tokens_seen=state.tokens_seen,
                             seconds=round(state.seconds, 3), loss_first=state.loss_first,
                             loss_last=state.loss_last, loss_by_step=state.loss_by_step, params_sha256=sha,
                             safetensors_sha256=own_sha)
        from layerscope.decoding.tuned_record import RECORD

        wrote.add(RECORD)
        record.to_disk(out)
    _drop_checkpoint(out)
    return record


def _one_step(lens, inputs: TrainInputs, rows: np.ndarray, micro: int, settings: TrainSettings, step: int, opt,
              params, bar) -> list[float]:
    """One optimiser step over ``rows`` (token rows of the store): every layer's KL to the final distribution,
    summed over micro-batches of ``micro`` tokens; returns each layer's mean KL (nats) before the update."""
    import torch

    n_layers = inputs.num_layers
    total = len(rows)
    sums = [0.0] * n_layers
    for a in range(0, total, micro):
        idx = np.sort(rows[a:a + micro])
        with torch.no_grad():
            final = torch.from_numpy(inputs.layers[n_layers].take(idx))
            target = torch.log_softmax(lens.head(final, n_layers).float(), dim=-1)
            p = target.exp()
        for layer in range(n_layers):
            h = torch.from_numpy(inputs.layers[layer].take(idx))
            kl = (p * (target - torch.log_softmax(lens(h, layer).float(), dim=-1))).sum(-1)
            (kl.sum() / total).backward()
            sums[layer] += float(kl.detach().sum())
        bar.advance(len(idx))
    torch.nn.utils.clip_grad_norm_(params, settings.clip_grad_norm)
    for group in opt.param_groups:
        group["lr"] = settings.lr * settings.lr_factor(step)
    opt.step()
    opt.zero_grad(set_to_none=False)
    return [s / total for s in sums]


@dataclass(frozen=True)
class _Progress:
    """Where training stands: the translators, the steps done, tokens and seconds so far, the loss history,
    and (read from a checkpoint) the optimiser's momentum buffers."""

    translators: object  # Translators
    step: int
    tokens_seen: int
    seconds: float
    loss_first: tuple[float, ...]
    loss_last: tuple[float, ...]
    loss_by_step: tuple[float, ...]
    momentum: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def fresh(cls, layers: int, width: int) -> _Progress:
        from layerscope.decoding.tuned_lens import Translators

        return cls(Translators.identity(layers, width), 0, 0, 0.0, (), (), ())

    def after(self, losses: list[float], tokens: int, seconds: float) -> _Progress:
        import dataclasses

        return dataclasses.replace(self, step=self.step + 1, tokens_seen=self.tokens_seen + tokens,
                                   seconds=self.seconds + seconds, loss_first=self.loss_first or tuple(losses),
                                   loss_last=tuple(losses), loss_by_step=(*self.loss_by_step, float(np.mean(losses))))

    def with_translators(self, lens) -> _Progress:
        import dataclasses

        return dataclasses.replace(self, translators=lens.translators_now())

    def restore_momentum(self, opt, lens) -> None:
        import torch

        if self.momentum is None:
            return
        weights, biases = self.momentum
        for i, t in enumerate(lens.translators):
            opt.state[t.weight]["momentum_buffer"] = torch.from_numpy(weights[i].copy())
            opt.state[t.bias]["momentum_buffer"] = torch.from_numpy(biases[i].copy())

    def write(self, path: Path, identity: dict, opt, lens, wrote) -> None:
        """The checkpoint (safetensors): translators, momentum buffers, and in its metadata the identity and
        progress; written to a temporary sibling and renamed over the last one."""
        from safetensors.numpy import save_file

        t = self.translators
        zeros = (np.zeros_like(t.weight), np.zeros_like(t.bias))
        buffers = [opt.state.get(p, {}).get("momentum_buffer") for tr in lens.translators for p in (tr.weight, tr.bias)]
        if all(b is not None for b in buffers):
            mw = np.stack([b.numpy() for b in buffers[0::2]]).astype(np.float32)
            mb = np.stack([b.numpy() for b in buffers[1::2]]).astype(np.float32)
        else:
            mw, mb = zeros
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        rel = f"{CHECKPOINTS}/{path.name}"
        wrote.add(CHECKPOINTS, rel, f"{CHECKPOINTS}/{tmp.name}")
        meta = {"format": CHECKPOINT_FORMAT, "identity": json.dumps(identity, sort_keys=True),
                "step": str(self.step), "tokens_seen": str(self.tokens_seen), "seconds": repr(self.seconds),
                "loss_first": json.dumps(self.loss_first), "loss_last": json.dumps(self.loss_last),
                "loss_by_step": json.dumps(self.loss_by_step)}
        save_file({"weight": t.weight, "bias": t.bias, "momentum.weight": mw, "momentum.bias": mb}, str(tmp),
                  metadata=meta)
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path, identity: dict, layers: int, width: int) -> _Progress:
        """The checkpoint at ``path``, refused in one line where it is of another run (model, store, recipe) or
        damaged."""
        from safetensors import SafetensorError, safe_open

        from layerscope.decoding.tuned_lens import Translators

        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
                arrays = {k: f.get_tensor(k) for k in ("weight", "bias", "momentum.weight", "momentum.bias")}
        except (SafetensorError, OSError, KeyError, ValueError) as exc:
            raise InputError(f"{path} cannot be read as a training checkpoint ({str(exc)[:160]}); train again "
                             "with --force") from None
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise InputError(f"{path} is a checkpoint of another format; train again with --force")
        try:
            then = json.loads(meta["identity"])
            step, seen, seconds = int(meta["step"]), int(meta["tokens_seen"]), float(meta["seconds"])
            history = [tuple(float(v) for v in json.loads(meta[k])) for k in ("loss_first", "loss_last", "loss_by_step")]
        except (KeyError, ValueError, TypeError) as exc:
            raise InputError(f"{path}'s metadata is damaged ({exc}); train again with --force") from None
        changed = sorted(k for k in set(then) | set(identity) if then.get(k) != identity.get(k))
        if changed:
            key = changed[0]
            raise InputError(f"{path} was made by another run: its {key} was {then.get(key)!r}, this run's is "
                             f"{identity.get(key)!r}; run with the same store, model and settings, or --force to "
                             "start again")
        shapes = {"weight": (layers, width, width), "bias": (layers, width)}
        for k, shape in {**shapes, **{f"momentum.{n}": s for n, s in shapes.items()}}.items():
            if arrays[k].shape != shape or arrays[k].dtype != np.float32 or not np.isfinite(arrays[k]).all():
                raise InputError(f"{path}: {k} is not finite float32 of shape {shape}; train again with --force")
        return cls(Translators(arrays["weight"], arrays["bias"]), step, seen, seconds, *history,
                   momentum=(arrays["momentum.weight"], arrays["momentum.bias"]))


def _drop_checkpoint(out: Path) -> None:
    """The checkpoint of a finished run (the lens itself is written): removed, and the folder's record brought
    up to date (entries gone from disk are dropped); anything else in ``checkpoints/`` is left as it is."""
    from layerscope.owned_record import record

    folder = out / CHECKPOINTS
    (folder / LAST).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass
    record(out, "lens")
