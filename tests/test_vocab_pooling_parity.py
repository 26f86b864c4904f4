"""Every pooling through its three renderings (numpy, torch, in-graph ONNX run by ONNX Runtime) on the
same random states and masks: right and left padding, single-token rows, and for ``eos`` the three
ways the position is found (argmax of the ids when there is no EOS id or the old CLIP id 2, else the
first EOS token, or position 0 when a row has none).  They must agree to 1e-6.

A change to one rendering of one pooling (say torch's ``last`` reading ``mask.sum(1) - 1``, which is
wrong under left padding) makes that pooling's case fail here.
"""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.vocab.pooling import GRAPH_POOLINGS, POOLINGS, ST, check_poolings, pool, pool_torch, with_st

L, B, S, H = 3, 8, 6, 5
EOS_CASES = (None, 2, 7)  # argmax of ids, old CLIP (argmax), the first id 7
# 1 = real token; rows 0-3 right-padded, 4-6 left-padded, single-token rows on both sides
MASK = np.array([[1, 1, 1, 1, 1, 1],
                 [1, 1, 1, 0, 0, 0],
                 [1, 0, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0, 0],
                 [0, 0, 1, 1, 1, 1],
                 [0, 0, 0, 0, 0, 1],
                 [0, 1, 1, 1, 1, 1],
                 [1, 1, 1, 1, 1, 1]], dtype=np.int64)


def _inputs():
    rng = np.random.default_rng(11)
    states = rng.standard_normal((L, B, S, H)).astype(np.float32)
    states[:, MASK == 0, :] = 50.0  # a pooling that reads padding is far off
    ids = rng.integers(10, 40, size=(B, S)).astype(np.int64)
    ids[0, 2] = ids[0, 4] = 7  # two EOS tokens: the first counts
    ids[4, 5] = 7  # left-padded row, EOS last
    ids[6, 3] = ids[5, 5] = 7  # every left-padded row has one: position 0 is padding there
    ids[MASK == 0] = 0  # padding id; the right-padded rows without 7 read position 0
    return states, ids


def _graph_session(modes, eos_token_id, opset=18):
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    from layerscope.export.graph import add_pooled_outputs

    inputs = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])]
    inputs += [helper.make_tensor_value_info(f"h{i}", TensorProto.FLOAT, ["batch", "seq", H]) for i in range(L)]
    model = helper.make_model(helper.make_graph([], "pool", inputs, []), opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    add_pooled_outputs(model, list(modes), [f"h{i}" for i in range(L)], H, eos_token_id)
    onnx.checker.check_model(model)
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def renderings():
    """{(mode, eos_token_id): (numpy, torch, onnx)} pooled arrays [L, B, H]."""
    import torch

    from layerscope.vocab.outputs import pooled_output

    states, ids = _inputs()
    out = {}
    for eos in EOS_CASES:
        modes = GRAPH_POOLINGS if eos == EOS_CASES[0] else ("eos",)
        session = _graph_session(modes, eos)
        feed = {"attention_mask": MASK, "input_ids": ids, **{f"h{i}": states[i] for i in range(L)}}
        graph = dict(zip(modes, session.run([pooled_output(m) for m in modes], feed)))
        for mode in modes:
            np_out = pool(states, MASK, mode, input_ids=ids, eos_token_id=eos)
            torch_out = pool_torch(torch.from_numpy(states), torch.from_numpy(MASK), mode,
                                   input_ids=torch.from_numpy(ids), eos_token_id=eos).numpy()
            out[mode, eos] = (np_out, torch_out, graph[mode])
    return out


def test_the_graph_rendering_before_opset_18_agrees_too(renderings):
    """Before opset 18 ReduceMax takes its axes as an attribute: the other branch of the in-graph max."""
    from layerscope.vocab.outputs import pooled_output

    states, ids = _inputs()
    session = _graph_session(GRAPH_POOLINGS, None, opset=13)
    feed = {"attention_mask": MASK, "input_ids": ids, **{f"h{i}": states[i] for i in range(L)}}
    for mode, got in zip(GRAPH_POOLINGS, session.run([pooled_output(m) for m in GRAPH_POOLINGS], feed)):
        np.testing.assert_allclose(got, renderings[mode, None][0], rtol=0, atol=1e-6, err_msg=mode)


def test_every_pooling_but_st_has_the_three_renderings():
    """The one list of names: st is the only name without a rendering of its own (it is a recipe)."""
    assert set(POOLINGS) - set(GRAPH_POOLINGS) == {ST}
    assert len(set(POOLINGS)) == len(POOLINGS)


@pytest.mark.parametrize("case", [(m, EOS_CASES[0]) for m in GRAPH_POOLINGS if m != "eos"]
                         + [("eos", e) for e in EOS_CASES], ids=lambda c: f"{c[0]}-eos{c[1]}")
def test_numpy_torch_and_graph_agree(renderings, case):
    np_out, torch_out, graph_out = renderings[case]
    assert np_out.shape == torch_out.shape == graph_out.shape == (L, B, H)
    assert np.abs(np_out).max() < 10, "a rendering read the padding"
    np.testing.assert_allclose(torch_out, np_out, rtol=0, atol=1e-6, err_msg=f"torch vs numpy, {case}")
    np.testing.assert_allclose(graph_out, np_out, rtol=0, atol=1e-6, err_msg=f"ONNX vs numpy, {case}")


def test_the_cases_tell_the_poolings_apart(renderings):
    """Agreement means something: no two poolings (nor two eos rules) give the same vectors here,
    and the single-token rows give zeros for mean-nobos and the token itself for the others."""
    keys = list(renderings)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if a[0] == "eos" and b[0] == "eos" and {a[1], b[1]} == {None, 2}:
                continue  # the same rule by design (argmax of the ids)
            assert not np.allclose(renderings[a][0], renderings[b][0]), (a, b)
    states, _ = _inputs()
    for row, pos in ((2, 0), (5, 5)):
        for mode in ("mean", "cls", "last", "max"):
            np.testing.assert_allclose(renderings[mode, None][0][:, row], states[:, row, pos], atol=1e-6)
        np.testing.assert_array_equal(renderings["mean-nobos", None][0][:, row], 0.0)


def test_torch_rendering_is_differentiable():
    """Saliency objectives take gradients through it: d(mean)/d(states) is the mask over the token count."""
    import torch

    states, _ = _inputs()
    h = torch.from_numpy(states[0]).requires_grad_(True)
    pool_torch(h, torch.from_numpy(MASK), "mean").sum().backward()
    want = MASK / MASK.sum(1, keepdims=True)
    np.testing.assert_allclose(h.grad.numpy(), np.repeat(want[..., None], H, axis=-1), atol=1e-7)


def test_st_is_the_recipe_pooling_normalized():
    """with_st swaps st for the recipe's pooling, L2-normalized when the recipe says so; no recipe: one error."""
    from layerscope.errors import InputError

    vec = np.array([[3.0, 4.0]], dtype=np.float32)
    asked = []

    def compute(modes):
        asked.append(list(modes))
        return {m: vec * (2 if m == "cls" else 1) for m in modes}

    got = with_st(["cls", ST], compute, {"pooling": "mean", "normalize": True})
    assert asked == [["cls", "mean"]] and list(got) == ["cls", ST]
    np.testing.assert_allclose(got[ST], [[0.6, 0.8]], atol=1e-7)
    np.testing.assert_array_equal(with_st([ST], compute, {"pooling": "cls", "normalize": False})[ST], vec * 2)
    with pytest.raises(InputError, match="sentence-transformers recipe"):
        with_st([ST], compute, None)
    with pytest.raises(InputError, match="did you mean 'mean-nobos'"):
        check_poolings(["mean-nobo"])


def test_graph_last_finds_the_last_token_of_a_long_row_when_floats_run_in_bf16():
    """OpenVINO's bf16 inference precision computes float ops in bf16, whose integers are exact only up to 256:
    a position arithmetic in floats picks an earlier token of a 300-token text (pooled 'last' of a Qwen export
    came out at cosine -0.02 to torch). The graph must find the index in integers."""
    import onnx
    from onnx import TensorProto, helper

    from layerscope.engines.ov import cpu_capabilities, ov_core
    from layerscope.export.graph import add_pooled_outputs

    if "BF16" not in cpu_capabilities():
        pytest.skip("this CPU has no bf16 compute for OpenVINO")
    seq, hidden = 400, 8
    inputs = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["batch", "seq", hidden])]
    model = helper.make_model(helper.make_graph([], "pool", inputs, []), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    add_pooled_outputs(model, ["last"], ["h0"], hidden, None)
    lengths = [400, 387, 301, 257, 5]
    mask = np.array([[1] * n + [0] * (seq - n) for n in lengths], dtype=np.int64)
    states = np.zeros((len(lengths), seq, hidden), dtype=np.float32)
    states[np.arange(len(lengths)), np.array(lengths) - 1, :] = 1.0  # only the last real token is non-zero
    core = ov_core()
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "bf16"})
    out = compiled({"attention_mask": mask, "h0": states})  # "last" reads no ids
    pooled = np.asarray(next(iter(out.values())))
    np.testing.assert_array_equal(pooled.reshape(len(lengths), hidden), np.ones((len(lengths), hidden)))


def _last_graph(hidden: int):
    import onnx
    from onnx import TensorProto, helper

    from layerscope.export.graph import add_pooled_outputs

    inputs = [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["batch", "seq", hidden])]
    model = helper.make_model(helper.make_graph([], "pool", inputs, []), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    add_pooled_outputs(model, ["last"], ["h0"], hidden, None)
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model)


def _elem_types(model) -> dict[str, int]:
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    for n in g.node:  # constants made by Constant nodes
        if n.op_type == "Constant":
            types[n.output[0]] = n.attribute[0].t.data_type
    return types


def test_graph_last_index_is_computed_in_integers_alone():
    """On any CPU: every tensor the ``last`` index is computed from (the ArgMax and all it depends on) is an
    integer, so no runtime's float precision can move it."""
    from onnx import TensorProto

    model = _last_graph(8)
    types = _elem_types(model)
    by_output = {o: n for n in model.graph.node for o in n.output}
    (argmax,) = [n for n in model.graph.node if n.op_type == "ArgMax" and "last_idx" in n.output[0]]
    seen, todo = set(), list(argmax.input)
    while todo:
        name = todo.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        assert types.get(name) in (TensorProto.INT64, TensorProto.INT32), (name, types.get(name))
        if name in by_output:
            todo.extend(by_output[name].input)
    assert "attention_mask" in seen  # the walk reached the mask: the index is the mask's


def _rounded_to_float16(model):
    """``model`` with every float tensor a node makes rounded to float16 and back, as a runtime computing
    float ops in float16 would see it (integers above 2048 are not all float16 numbers)."""
    import onnx
    from onnx import TensorProto, helper

    types = _elem_types(model)
    nodes = []
    for n in model.graph.node:
        nodes.append(n)
        for i, out in enumerate(n.output):
            if types.get(out) == TensorProto.FLOAT and out not in {o.name for o in model.graph.output}:
                raw = out + "/f32"
                n.output[i] = raw
                nodes.append(helper.make_node("Cast", [raw], [out + "/f16"], to=TensorProto.FLOAT16))
                nodes.append(helper.make_node("Cast", [out + "/f16"], [out], to=TensorProto.FLOAT))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.graph.value_info[:]
    onnx.checker.check_model(model)
    return model


def test_graph_last_finds_the_last_token_when_floats_are_rounded_to_float16():
    """On any CPU, ONNX Runtime: the graph with every float tensor rounded to float16 (exact integers only up to
    2048) still pools the last real token of rows 2,049 to 2,300 tokens long."""
    import onnxruntime

    seq, hidden = 2300, 4
    model = _rounded_to_float16(_last_graph(hidden))
    lengths = [2300, 2297, 2049, 2101, 5]
    mask = np.array([[1] * n + [0] * (seq - n) for n in lengths], dtype=np.int64)
    states = np.zeros((len(lengths), seq, hidden), dtype=np.float32)
    states[np.arange(len(lengths)), np.array(lengths) - 1, :] = 1.0  # only the last real token is non-zero
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.zeros_like(mask)  # "last" reads no ids
    (pooled,) = session.run(None, {"attention_mask": mask, "input_ids": ids, "h0": states})
    np.testing.assert_array_equal(pooled.reshape(len(lengths), hidden), np.ones((len(lengths), hidden)))
