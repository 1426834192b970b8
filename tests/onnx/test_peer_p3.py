"""The benchmarks' P3 peer (onnxscript ``optimize_for_ort``) writes a model that loads from its own folder."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from tests._benchmarks import load_benchmark


def _bench():
    return load_benchmark("onnx_autofusion")


def test_p3_of_a_model_with_external_data_loads_from_another_folder(tmp_path):
    weight = numpy_helper.from_array(np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    src_dir, dst_dir = tmp_path / "src", tmp_path / "p3"
    src_dir.mkdir(), dst_dir.mkdir()
    src = src_dir / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), src,
              save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    dst = dst_dir / "p3.onnx"
    _bench().run_p3(str(src), str(dst))
    x = np.ones((1, 64), dtype=np.float32)
    out = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.allclose(out, x @ numpy_helper.to_array(weight))
    assert (dst_dir / "p3.onnx.data").is_file()
