"""Export: Optimum ONNX export with every hidden state, in-graph pooling, parity and manifest."""
