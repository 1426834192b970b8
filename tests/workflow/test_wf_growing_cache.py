"""A cache tensor whose size grows with the position (Qwen4-exp's indexer position history).

The harness measures which cache tensors change size over the reference decode (as it does
for growing Python ints) and compiles such a decode with symbolic sizes: the grown size
reaches the frame after a graph break as a local no dynamic-source pattern can name, and
with static shapes every step recompiled (qwen4_exp: 101 recompiles in the timed steps).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

from superkernel.tools.advisor.compiling import compile_superkernel
from superkernel.tools.decode import prepare, run_decode


class GrowingHistory(torch.nn.Module):
    """Keeps every embedded token on the cache (``history``, concatenated each step) and attends to it."""

    def __init__(self) -> None:
        super().__init__()
        self.config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, 16)
        self.head = torch.nn.Linear(16, 32)

    def forward(self, input_ids, past_key_values=None, cache_position=None, use_cache=True):
        layer = past_key_values.layers[0]
        h = self.embed(input_ids)
        history = getattr(layer, "history", None)
        history = h if history is None else torch.cat([history, h], dim=1)
        layer.history = history
        torch._dynamo.graph_break()  # `history` reaches the next frame as a local
        weights = torch.softmax(h @ history.transpose(1, 2), dim=-1)
        return CausalLMOutputWithPast(logits=self.head(weights @ history))


def test_growing_cache_tensor_is_detected_and_compiles_once():
    session = prepare(GrowingHistory(), prompt_len=6, steps=3, warmup=2)
    assert session.growing_tensors == ["history:1"] and session.compile_dynamic
    assert session.growing_ints == []

    reference = run_decode(session, compile_superkernel(session, "reduce-overhead", run_eagerly=True)[0])
    torch._dynamo.reset()
    planned = run_decode(session, compile_superkernel(session, "reduce-overhead")[0])
    torch._dynamo.reset()
    assert torch.equal(planned.logits, reference.logits)
    assert planned.dynamo.recompiles_timed == 0, planned.dynamo.reasons

    # what the detection prevents: the same decode with static shapes recompiles in the timed steps
    static = run_decode(session, torch.compile(session.step_fn(), backend="eager", dynamic=False))
    torch._dynamo.reset()
    assert static.dynamo.recompiles_timed > 0
    assert torch.equal(static.logits, run_decode(session, session.step_fn()).logits)


def _backed_symint(value: int):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()
    source = ConstantSource("cumulative_length_int")
    symbol = env.create_symbol(value, source, dynamic_dim=DimDynamic.DYNAMIC)
    return env, env.create_symintnode(symbol, hint=value, source=source)


def test_max_autotune_timing_inputs_do_not_specialize_a_growing_int():
    """CPU max-autotune times each partition plain vs frozen at real shapes; a growing cache int
    (a dynamic source) reaches a partition as a SymInt. Timing with ``int(sym)``, or passing the
    SymInt itself to the compiled partition, put a guard ``== value`` on it: every max-autotune
    plan of gemma2 then recompiled at every decode step (15 in 16 timed steps)."""
    from superkernel.runtime.inductor.cpu_freezing import measurement_inputs

    env, sym = _backed_symint(32)
    args = measurement_inputs([sym], [None], {})
    assert args == [32] and type(args[0]) is int
    assert not env.guards, env.guards

    int(sym)  # what the timing did before: the same ShapeEnv now holds a guard
    assert env.guards


def test_timing_inputs_refuse_a_data_dependent_size():
    """An unbacked (data-dependent) size has no example value: the choice keeps the plain compile."""
    import pytest
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from superkernel.runtime.inductor.cpu_freezing import measurement_inputs

    unbacked = ShapeEnv().create_unbacked_symint()
    with pytest.raises(ValueError, match="data-dependent"):
        measurement_inputs([unbacked], [None], {})
