"""Training a tuned lens from a token store: each step is tuned-lens 0.2's own recipe (its optimiser and scheduler
from its ``Optimizer`` config, its lens and its KL loss) fed the same stored tokens; an interrupted run resumed
from its checkpoint ends where an uninterrupted one does; bad input is one line before any training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cli_helpers import one_error, run_cli
from hang_guard import HANG_S
from layerscope.decoding.tuned_lens import read_lens
from layerscope.decoding.tuned_record import TrainSettings
from layerscope.decoding.tuned_train import TokenSampler, train_lens
from layerscope.errors import InputError, Interrupted, StoreError

WORDS = "the cat sat on a mat while rivers flow past old towns and birds sing over quiet hills".split()


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 12)))) for _ in range(n)]


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    """A peaked tiny GPT-2 and a token store of every layer made from it."""
    from layerscope.extraction.pipeline import extract
    from tuned_models import sharpened

    root = tmp_path_factory.mktemp("tuned-train")
    model = sharpened(tiny_model("gpt2"), root / "model", "decoder")
    store = root / "store"
    extract(str(model), _texts(24), store, engine="torch", layers="all", poolings=["mean"], tokens=True)
    return model, store


@pytest.mark.usefixtures("tuned_lens_scripts")
def test_each_step_is_tuned_lens_recipe_on_the_same_tokens(setup, tmp_path):
    """Catches: SGD without Nesterov momentum or with tuned-lens's learning rate not scaled by 1 - momentum, the
    warmup or the linear decay off by a step, weight decay or the gradient clipping (all translators' norm
    together) left out, the loss a sum where tuned-lens takes the mean over positions, the target the layer's
    own distribution instead of the final one, a translator not starting from the identity."""
    import tuned_lens.scripts.ingredients as ing
    from transformers import AutoModelForCausalLM
    from tuned_lens import TunedLens as TheirLens

    from layerscope.store.store import LayerStore

    model, store_path = setup
    settings = TrainSettings(steps=4, tokens_per_step=96, warmup_steps=1, seed=3)
    record = train_lens(store_path, tmp_path / "lens", settings=settings)
    ours = read_lens(tmp_path / "lens")

    net = AutoModelForCausalLM.from_pretrained(str(model)).eval()
    theirs = TheirLens.from_model(net)
    recipe = ing.Optimizer(warmup_steps=1)
    opt = recipe.create_optim([p for p in theirs.parameters() if p.requires_grad])
    schedule = recipe.create_scheduler(opt, settings.steps)
    store = LayerStore.open(store_path)
    layers = [store.tokens(str(i)) for i in range(net.config.n_layer + 1)]
    sampler = TokenSampler(layers[0].total_tokens, settings.tokens_per_step, settings.seed)
    first = []
    for step in range(settings.steps):  # tuned-lens's train loop, in float32 (no bfloat16 autocast)
        idx = np.sort(sampler.rows(step))
        with torch.no_grad():
            labels = net.lm_head(torch.from_numpy(layers[-1].take(idx))).float().log_softmax(dim=-1)
        for i in range(net.config.n_layer):
            logits = theirs(torch.from_numpy(layers[i].take(idx)), idx=i)
            loss = torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean()
            loss.backward()
            if step == 0:
                first.append(float(loss.detach()))
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        schedule.step()
    np.testing.assert_allclose(record.loss_first, first, rtol=1e-5)
    for i, t in enumerate(theirs.layer_translators):
        np.testing.assert_allclose(ours.translators.weight[i], t.weight.detach().numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(ours.translators.bias[i], t.bias.detach().numpy(), rtol=1e-4, atol=1e-6)
    assert np.abs(ours.translators.weight).max() > 1e-3  # not vacuous: the translators moved
    assert record.steps_done == 4 and record.tokens_seen == 4 * 96 and len(record.loss_by_step) == 4
    assert not (tmp_path / "lens" / "checkpoints").exists()  # a finished run keeps the lens, not its checkpoint


@pytest.fixture
def tuned_lens_scripts():
    from tuned_models import tuned_lens_scripts as importable

    with importable():
        yield


def test_an_interrupted_run_resumes_to_the_same_lens(setup, tmp_path, monkeypatch):
    """Catches: momentum buffers not restored (the resumed steps then differ), a step's tokens drawn from a
    sampler that restarts, the learning-rate schedule restarting at step 0, a checkpoint of other settings
    continued, and a lens folder overwritten without --force or --resume."""
    from layerscope.decoding import tuned_train

    _, store = setup
    settings = TrainSettings(steps=5, tokens_per_step=48, seed=1)
    whole = train_lens(store, tmp_path / "whole", settings=settings)
    real = tuned_train._one_step
    calls = []

    def stop_at_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(tuned_train, "_one_step", stop_at_the_fourth)
    with pytest.raises(Interrupted, match="interrupted at step 4 of 5; 2 steps are kept"):
        train_lens(store, tmp_path / "cut", settings=settings, checkpoint_every=2)
    monkeypatch.setattr(tuned_train, "_one_step", real)
    with pytest.raises(InputError, match="already holds a tuned lens; pass --resume to continue it, --force"):
        train_lens(store, tmp_path / "cut", settings=settings)
    with pytest.raises(InputError, match="its settings was .*'seed': 1.*this run's is .*'seed': 2"):
        train_lens(store, tmp_path / "cut", settings=TrainSettings(steps=5, tokens_per_step=48, seed=2), resume=True)
    resumed = train_lens(store, tmp_path / "cut", settings=settings, resume=True)
    a, b = read_lens(tmp_path / "whole").translators, read_lens(tmp_path / "cut").translators
    assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
    assert resumed.loss_by_step == whole.loss_by_step and resumed.steps_done == 5
    assert whole.loss_last[0] < whole.loss_first[0]  # training lowers layer 0's KL to the final layer


def test_bad_input_is_one_line_before_training(setup, tiny_model, tmp_path, capsys):
    """Catches: a store without tokens, or without every layer's, failing deep in training (or training on the
    layers it has), a model without a trained LM head trained against tied-embedding "logits", a model other
    than the store's, and nonsense settings."""
    from transformers import AutoModel

    from layerscope.extraction.pipeline import extract

    model, store = setup
    texts = _texts(3)
    extract(str(model), texts, tmp_path / "pooled", engine="torch", layers="all", poolings=["mean"])
    with pytest.raises(StoreError, match="holds no token vectors; .*--tokens --layers all"):
        train_lens(tmp_path / "pooled", tmp_path / "a")
    extract(str(model), texts, tmp_path / "some", engine="torch", layers="0,1", poolings=["mean"], tokens=True)
    with pytest.raises(StoreError, match="token vectors of layers 0, 1, not of 2; the tuned lens needs every layer"):
        train_lens(tmp_path / "some", tmp_path / "a")
    bare = tmp_path / "bare-bert"
    AutoModel.from_pretrained(str(tiny_model("bert"))).save_pretrained(str(bare))
    for f in tiny_model("bert").iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special")):
            (bare / f.name).write_bytes(f.read_bytes())
    extract(str(bare), texts, tmp_path / "headless", engine="torch", layers="all", poolings=["mean"], tokens=True)
    with pytest.raises(InputError, match="has no trained LM head"):
        train_lens(tmp_path / "headless", tmp_path / "a")
    with pytest.raises(InputError, match="is not the model .* was extracted with"):
        train_lens(store, tmp_path / "a", model=str(tiny_model("gpt2")))
    code, text = run_cli(["train-lens", store, "-o", tmp_path / "a", "--warmup-steps", "9", "--steps", "3"], capsys)
    one_error(code, text, "--warmup-steps must be at least 0 and below --steps (3)")
    assert not (tmp_path / "a").exists()
    code, text = run_cli(["train-lens", store, "-o", tmp_path / "cli", "--steps", "2", "--tokens-per-step", "32"],
                         capsys)
    assert code == 0 and "tuned lens" in text and "2 steps, 64 tokens" in text, text
    assert read_lens(tmp_path / "cli").record.steps_done == 2


def test_nothing_of_ours_imports_tuned_lens_or_wandb(setup, tmp_path):
    """Catches: a module of layerscope importing tuned-lens (a test-only dependency) or wandb, which tuned-lens
    pulls in and which reports to a server when started: training and decoding a tuned lens need neither."""
    import os
    import subprocess
    import sys

    _, store = setup
    code = ("import sys; from layerscope.cli import main\n"
            "from layerscope.decoding.tuned_train import train_lens\n"
            "from layerscope.decoding.tuned_record import TrainSettings\n"
            f"train_lens({str(store)!r}, {str(tmp_path / 'lens')!r}, settings=TrainSettings(steps=1, tokens_per_step=8))\n"
            "import layerscope.analyses.lens, layerscope.decoding.lens_onnx\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('wandb', 'tuned_lens')))")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_S)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_lens_we_trained_is_read_back_without_a_pickle(setup, tmp_path, monkeypatch):
    """A lens layerscope trained keeps its translators as safetensors beside tuned-lens's params.pt and is read
    from them. Catches: our own lens read by unpickling params.pt (torch.load, however restricted), the two
    files disagreeing, and an edited params.safetensors decoded as if it were the trained one."""
    import shutil

    import safetensors.numpy
    import torch

    _, store = setup
    record = train_lens(store, tmp_path / "lens", settings=TrainSettings(steps=2, tokens_per_step=32, seed=3))
    pt = torch.load(tmp_path / "lens" / "params.pt", map_location="cpu", weights_only=True)  # what tuned-lens reads
    own = safetensors.numpy.load_file(str(tmp_path / "lens" / "params.safetensors"))
    assert set(pt) == set(own) and all(np.array_equal(pt[k].numpy(), own[k]) for k in pt)
    assert record.safetensors_sha256 is not None
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("our own lens was read through a pickle"))
    lens = read_lens(tmp_path / "lens")
    assert np.array_equal(lens.translators.weight[1], own["1.weight"])
    shutil.copytree(tmp_path / "lens", tmp_path / "edited")
    own["0.bias"] = own["0.bias"] + 1.0
    safetensors.numpy.save_file(own, str(tmp_path / "edited" / "params.safetensors"))
    with pytest.raises(InputError, match="params.safetensors is missing or changed since layerscope trained"):
        read_lens(tmp_path / "edited")
