"""The fusion rules: onnxscript rewriter patterns plus our checks and replacements.

Each class in this package matches one decomposed form (a *variant*) of a fusion from the catalog
(:mod:`superkernel.onnx.catalog`). The onnxscript pattern API does the structural
matching; ``validate`` checks what the structure cannot express (constants, axes,
shapes, opset) and returns a failed ``MatchResult`` with a reason, which the engine
reports as a near miss. ``rewrite`` builds the replacement, always with operators that
ONNX Runtime's CPU execution provider runs (see docs/graph_autofusion.md).
"""

from __future__ import annotations

from superkernel.onnx.rules.base import FusionPattern, MS, QUIET, _fail, _opset  # noqa: F401
from superkernel.onnx.rules.norms import LayerNormDecomposed, RMSNormDecomposed, SkipNorm, SkipRMSNorm, SumLayerNorm, _same_shape  # noqa: F401
from superkernel.onnx.rules.activations import GeluErf, GeluTanh, QuickGelu, SiLU, _close, _half_times  # noqa: F401
from superkernel.onnx.rules.matmul import BiasGelu, Gemm, MatMulConcat, MatMulScale, MatMulTranspose, _bias_ok  # noqa: F401
from superkernel.onnx.rules.rotary import Rotary, _cos_sin_source, _through_identity, rotary_cache  # noqa: F401
from superkernel.onnx.rules.attention_decode import DecodeGQA  # noqa: F401
from superkernel.onnx.rules.attention import (  # noqa: F401
    AttentionCore, CausalGQA, PackedAttention, PaddedMHA, _heads_view, _is_causal_mask, _k_of_kt, _kt_chain, _mask_value,
    _projection,
)
from superkernel.onnx.rules.embedding import EmbedLayerNorm  # noqa: F401
from superkernel.onnx.rules.composite import BiasGeluErf, SkipRMSNormDecomposed  # noqa: F401
