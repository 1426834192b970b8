"""The rule catalog: what graph-autofusion can fuse, at which opt level, in which order,
and the parsing of ``--fusion-rules``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from onnxscript.rewriter import pattern

from . import rules as R


class RuleSelectionError(ValueError):
    """--fusion-rules names an unknown rule or selects nothing."""


@dataclass(frozen=True)
class RuleSpec:
    name: str
    pattern: str
    fused_op: str
    opt_level: int
    stage: int
    description: str
    variants: Callable[[], list[R.FusionPattern]] = field(repr=False, compare=False)

    def build(self) -> list[tuple[R.FusionPattern, pattern.RewriteRule]]:
        """The rule instances with their onnxscript rules, built (and commuted, which is the
        slow part) once per process; their per-run state (near misses, match state) is reset."""
        hit = _BUILT.get(id(self))
        if hit is None or hit[0] is not self:
            out = []
            for inst in self.variants():
                # bind the rule to this instance so its near misses and state land on it
                rule = pattern.RewriteRule(inst.pattern, inst.rewrite, inst.check, name=inst.name)
                variants = rule.commute() if inst.commute_rule else [rule]
                out.extend((inst, r) for r in variants)
            hit = _BUILT[id(self)] = (self, out)
        for inst, _rule in hit[1]:
            inst.near_misses.clear()
            inst.state = {}
        return list(hit[1])


_BUILT: dict[int, tuple[RuleSpec, list]] = {}


def _v(cls, **grid):
    """All combinations of the keyword grids as instances of cls."""
    import itertools

    keys = list(grid)

    def make():
        out = []
        for combo in itertools.product(*(grid[k] for k in keys)):
            params = dict(zip(keys, combo))
            variant = ",".join(f"{k}={v}" for k, v in params.items())
            out.append(cls(variant, **params))
        return out

    return make


# Stage order: norms and activations, then residual+norm, then rotary, then attention
# (which consumes the rotary nodes and the raw QK^T MatMul), then MatMul epilogues on
# what is left. Within a stage, overlapping candidates are resolved by net benefit.
CATALOG: tuple[RuleSpec, ...] = (
    RuleSpec("layernorm", "ReduceMean,Sub,Pow|Mul,ReduceMean,[Add eps],Sqrt,Div|Reciprocal+Mul,Mul,[Add]",
             "LayerNormalization", 1, 10,
             "Decomposed LayerNorm over the last axis (with or without epsilon and bias).",
             _v(R.LayerNormDecomposed, eps=(True, False), bias=(True, False), axes_attr=(False, True))),
    RuleSpec("rmsnorm", "Pow|Mul,ReduceMean,Add eps,Sqrt,Reciprocal+Mul|Div,Mul",
             "SimplifiedLayerNormalization (opset<23) / RMSNormalization (opset>=23)", 1, 10,
             "Decomposed RMSNorm (Llama) over the last axis.",
             _v(R.RMSNormDecomposed, axes_attr=(False, True), cast=(False, True))),
    RuleSpec("gelu_erf", "Div|Mul,Erf,Add 1,Mul 0.5,Mul", "com.microsoft Gelu (opset<20) / Gelu", 1, 10,
             "Exact GELU: x * 0.5 * (1 + erf(x / sqrt(2))).", _v(R.GeluErf, form=("a", "b", "c"))),
    RuleSpec("gelu_tanh", "Pow 3,Mul,Add,Mul,Tanh,Add 1,Mul 0.5,Mul",
             "com.microsoft FastGelu (opset<20) / Gelu(approximate=tanh)", 1, 10,
             "tanh-approximated GELU: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).",
             _v(R.GeluTanh, form=("a", "b", "c"))),
    RuleSpec("silu", "Sigmoid,Mul", "com.microsoft QuickGelu(alpha=1)", 1, 10,
             "SiLU / Swish x*sigmoid(x), the gate of SwiGLU.", _v(R.SiLU)),
    RuleSpec("quick_gelu", "Mul alpha,Sigmoid,Mul", "com.microsoft QuickGelu", 1, 10,
             "QuickGELU x*sigmoid(alpha*x) (CLIP).", _v(R.QuickGelu)),
    RuleSpec("embed_layernorm", "Gather(word table, ids),Add position rows (constant, or gathered by computed ids) "
             "[+ token type],LayerNormalization",
             "com.microsoft EmbedLayerNormalization", 1, 20,
             "Embedding lookup plus position/token-type rows and LayerNorm (BERT-style embeddings; RoBERTa's "
             "cumsum position ids become the op's position_ids).",
             _v(R.EmbedLayerNorm, extra=(False, True))),
    RuleSpec("skip_layernorm", "Add,LayerNormalization", "com.microsoft SkipLayerNormalization", 1, 20,
             "Residual add followed by LayerNorm; the sum stays available when it is used later.",
             _v(R.SkipNorm, kind=("ln", "ln_nobias"), sum_out=(True, False))),
    RuleSpec("sum_layernorm", "Add,LayerNormalization (equal [B, S, D] operands)", "Sum + LayerNormalization", 1, 20,
             "Residual Add then LayerNorm written as Sum then LayerNorm, so ONNX Runtime does not fuse them into "
             "its SkipLayerNormalization, whose CPU kernel can be several times slower than the two ops; kept "
             "only when calibration measures it faster (not applied by the static estimate).",
             _v(R.SumLayerNorm, kind=("ln", "ln_nobias"), sum_out=(True, False))),
    RuleSpec("skip_rmsnorm", "Add,SimplifiedLayerNormalization|RMSNormalization",
             "com.microsoft SkipSimplifiedLayerNormalization", 1, 20,
             "Residual add followed by RMSNorm; the sum stays available when it is used later.",
             lambda: _v(R.SkipRMSNorm, kind=("sln", "rms"), sum_out=(True, False))()
             + _v(R.SkipRMSNormDecomposed, axes_attr=(False, True), cast=(False, True), in_cast=(False, True),
                  sum_out=(True, False), scale_first=(True, False))()),
    RuleSpec("rotary", "Mul cos,Slice,Slice,Neg,Concat,Mul sin,Add", "com.microsoft RotaryEmbedding", 3, 30,
             "Half-rotation rotary embedding q*cos + rotate_half(q)*sin (Llama); cos/sin from "
             "Cos/Sin(Concat(freqs, freqs)) or constants.", _v(R.Rotary)),
    RuleSpec("gqa", "Reshape,Transpose,[RotaryEmbedding],[Unsqueeze,Expand,Reshape],MatMul,Div|Mul,Add causal,"
             "Softmax,MatMul,Transpose,Reshape; or a decode step: the 'attention' pattern on Concat(past, new) K/V",
             "com.microsoft GroupQueryAttention", 3, 40,
             "Causal (grouped-query or multi-head) attention with a constant causal mask, or a decode step "
             "(one new token, static shapes) with past K/V inputs and present outputs and any additive mask "
             "(as attention_bias); rotary folded into 3-D RotaryEmbedding.",
             lambda: [v for v in _v(R.CausalGQA, rotary=(True, False), repeat=(True, False),
                                    kt=("double", "direct"), op=("div", "mul"))()
                      if v.params["kt"] == "double" or not (v.params["rotary"] or v.params["repeat"])]
             + [v for v in _v(R.DecodeGQA, scale=("qk", "mul", "div", "none"), mask=(True, False),
                              guard=(True, False), casts=(0, 1), tail=(True, False))()
                if not (v.params["guard"] and v.params["casts"])]),
    RuleSpec("mha", "Reshape,Transpose,MatMul,Div|Mul,[Add mask],Softmax,MatMul,Transpose,Reshape",
             "com.microsoft MultiHeadAttention", 3, 40,
             "Bidirectional attention with an optional additive mask [B,1,1|S,T] (BERT).",
             _v(R.PaddedMHA, kt=("direct", "double"), op=("div", "mul"), mask=(True, False))),
    RuleSpec("attention", "[Mul q, Mul k^T],MatMul,[Mul|Div scale],[Add mask],Softmax,[IsNaN,Where],[Cast],MatMul",
             "com.microsoft MultiHeadAttention (BNSH key/value)", 3, 40,
             "Scaled dot-product attention on [B,N,S,hd] tensors as exported today: HF eager attention, SDPA "
             "decompositions of both exporters (split scale, NaN guard), repeated K/V, decode with past K/V "
             "concatenated; the mask (causal/padding, from inputs) becomes the attention bias.",
             lambda: [v for v in _v(R.AttentionCore, scale=("qk", "mul", "div", "none"), mask=(True, False),
                                    guard=(True, False), casts=(0, 1, 2), tail=(True, False))()
                      if not (v.params["guard"] and v.params["casts"])]),
    RuleSpec("packed_attention", "MatMul x3 (same input, constant weights),[Add bias],Reshape,Transpose,"
             "attention as in 'attention'", "com.microsoft Attention (packed QKV weights)", 3, 40,
             "Self-attention with its Q/K/V projections: the three weights packed into one GEMM inside "
             "com.microsoft Attention (what ONNX Runtime's CPU provider lacks as a separate MatMul fusion).",
             lambda: [v for v in _v(R.PackedAttention, scale=("qk", "mul", "div", "none"), mask=(True, False),
                                    guard=(True, False), casts=(0, 1, 2), tail=(True, False))()
                      if not (v.params["guard"] and v.params["casts"])]),
    RuleSpec("bias_gelu", "Add bias,Gelu|FastGelu", "com.microsoft BiasGelu / FastGelu(bias)", 2, 50,
             "Bias add (the MatMul epilogue) folded into the GELU.",
             lambda: _v(R.BiasGelu, form=("ms_gelu", "ms_fast", "onnx"))() + _v(R.BiasGeluErf, form=("a", "b", "c"))()),
    RuleSpec("matmul_concat", "MatMul x2+ (same input, constant 2-D weights of one dtype)",
             "MatMul (concatenated weights) + Split", 2, 50,
             "MatMuls sharing their input (Q/K/V projections where attention is not fused, gate + up of a "
             "SwiGLU MLP) as one MatMul on the weights concatenated along N, then Split; ONNX Runtime's CPU "
             "provider has no such fusion.", _v(R.MatMulConcat)),
    RuleSpec("gemm", "MatMul,Add", "Gemm", 2, 50,
             "2-D MatMul plus a broadcastable bias (Gemm is only valid for 2-D operands).", _v(R.Gemm)),
    RuleSpec("fused_matmul_scale", "MatMul,Mul|Div scalar", "com.microsoft FusedMatMul(alpha)", 2, 50,
             "MatMul followed by a scalar scale (attention scores).", _v(R.MatMulScale, op=("div", "mul"))),
    RuleSpec("fused_matmul_transpose", "Transpose(last two axes),MatMul|FusedMatMul",
             "com.microsoft FusedMatMul(transA/transB)", 2, 60,
             "Transpose of the last two axes folded into the MatMul.",
             _v(R.MatMulTranspose, base=("matmul", "fused"), side=("b", "a"))),
)

BY_NAME = {r.name: r for r in CATALOG}


def select_rules(spec: str, opt_level: int) -> list[RuleSpec]:
    """Parse ``all | rule,rule | all,-rule`` and keep rules at or below ``opt_level``.

    Raises RuleSelectionError for unknown names or when nothing is left."""
    tokens = [t.strip() for t in (spec or "all").split(",") if t.strip()]
    if not tokens:
        tokens = ["all"]
    chosen: dict[str, None] = {}
    for t in tokens:
        neg = t.startswith("-")
        name = t[1:] if neg else t
        if name == "all":
            names = [r.name for r in CATALOG]
        elif name in BY_NAME:
            names = [name]
        else:
            raise RuleSelectionError(f"unknown fusion rule {name!r} (known: all, {', '.join(BY_NAME)})")
        for n in names:
            if neg:
                chosen.pop(n, None)
            else:
                chosen[n] = None
    if opt_level == 0:
        return []
    selected = [BY_NAME[n] for n in BY_NAME if n in chosen and BY_NAME[n].opt_level <= opt_level]
    if not selected:
        asked = ", ".join(chosen) or "none"
        raise RuleSelectionError(f"no fusion rule matches --fusion-rules {spec!r} at --opt-level {opt_level} "
                                 f"(selected before the level filter: {asked})")
    return selected
