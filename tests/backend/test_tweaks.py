"""The list of torch internals superkernel patches or reads (runtime/inductor/tweaks.py) against the installed torch,
and that nothing of torch stays changed after a superkernel compile (a process shared with vLLM)."""

from __future__ import annotations

import sys
import types
import warnings

import pytest

from superkernel.runtime.inductor import tweaks


def test_every_name_a_tweak_touches_exists_in_this_torch():
    assert tweaks.missing() == [], "torch moved what these tweaks patch:\n" + "\n".join(tweaks.missing())


def test_every_tweak_enters_through_a_function_that_exists():
    for tweak in tweaks.TWEAKS:
        assert callable(tweak.function()), tweak.name


def test_a_name_deleted_on_a_fake_module_is_listed(monkeypatch):
    fake = types.ModuleType("fake_inductor")
    fake.Kernel = type("Kernel", (), {"render": lambda self: None, "load": lambda self: None})
    monkeypatch.setitem(sys.modules, "fake_inductor", fake)
    tweak = tweaks.Tweak("fake", ("fake_inductor:Kernel.render", "fake_inductor:Kernel.load"), "never", "x:y")
    assert tweaks.missing((tweak,)) == []
    delattr(fake.Kernel, "load")
    assert tweaks.missing((tweak,)) == ["fake_inductor:Kernel.load (fake)"]
    monkeypatch.delitem(sys.modules, "fake_inductor")
    assert tweaks.missing((tweak,)) == ["fake_inductor:Kernel.render (fake)", "fake_inductor:Kernel.load (fake)"]


def test_a_tweak_whose_names_moved_is_skipped_with_one_warning(monkeypatch):
    moved = tweaks.Tweak("moved", ("torch._inductor:no_such_name_anywhere",), "in this test", "x:y")
    monkeypatch.setitem(tweaks.BY_NAME, "moved", moved)
    monkeypatch.setattr(tweaks, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="no torch._inductor:no_such_name_anywhere; the compile runs without"):
        with tweaks.context("moved", absent=[]) as value:
            assert value == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tweaks.context("moved"):
            pass  # warned once


def test_docs_list_every_tweak_with_the_names_it_touches():
    from pathlib import Path

    api = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in api.splitlines() if line.startswith("| ")}
    for tweak in tweaks.TWEAKS:
        assert tweak.name in rows, f"docs/api.md lists no tweak {tweak.name!r}"
        assert all(f"`{name}`" in rows[tweak.name] for name in tweak.touches), tweak.name


# --- a good guest in a shared process (vLLM compiles in the same process): nothing of torch stays changed -------

def _torch_functions():
    import torch
    from torch._dynamo.convert_frame import ConvertFrame

    return {"_TorchCompileWrapper.__init__": torch._TorchCompileWrapper.__dict__["__init__"],
            "ConvertFrame.__call__": ConvertFrame.__dict__["__call__"],
            "TracingContext.output_strides": vars(torch._guards.TracingContext).get("output_strides")}


def _defined_by_torch(fn) -> bool:
    """``fn`` is torch's own function, not a wrapper of it (ours were made with functools.wraps)."""
    import os

    import torch

    return os.path.dirname(fn.__code__.co_filename).startswith(os.path.dirname(torch.__file__)) \
        and not hasattr(fn, "__wrapped__")


def _scoped(sk):
    def f(x):
        with sk.super_kernel("s"):
            return x.sin() * 2
    return f


def _seen_at_compile_start(seen):
    """A Dynamo compile-start callback recording what the compile starting now runs under."""
    import torch
    from torch._dynamo.convert_frame import ConvertFrame

    def record(_args=None):
        seen.append({"ConvertFrame.__call__": ConvertFrame.__dict__["__call__"],
                     "capture_scalar_outputs": torch._dynamo.config.capture_scalar_outputs})
    torch._dynamo.callback_handler.register_start_callback(record)
    return record


def test_after_a_superkernel_compile_and_call_torch_has_its_own_functions_back():
    import torch

    import superkernel as sk

    before = _torch_functions()  # torch's own, superkernel imported (checked below: _defined_by_torch)
    backend = sk.get_backend(sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "cpu": {"native": False}}))
    seen = []
    record = _seen_at_compile_start(seen)  # after superkernel's callback: sees what it applied
    try:
        f = _scoped(sk)
        fn = torch.compile(f, backend=backend, dynamic=False)
        x = torch.randn(4)
        assert torch.equal(fn(x), f(x)) and "s" in sk.explain(fn).scopes
    finally:
        torch._dynamo.callback_handler.remove_start_callback(record)
    after = _torch_functions()
    assert all(after[name] is before[name] for name in before), after
    assert _defined_by_torch(after["_TorchCompileWrapper.__init__"]) and _defined_by_torch(after["ConvertFrame.__call__"])
    from torch._dynamo.convert_frame import ConvertFrame

    assert not getattr(before["ConvertFrame.__call__"], "_superkernel_fallback", False)
    assert "backend_ctx_ctor" not in vars(torch._TorchCompileWrapper)
    # while the compiled object ran, its frame was converted under the fallback wrapper and the capture settings
    assert seen and getattr(seen[0]["ConvertFrame.__call__"], "_superkernel_fallback", False), seen
    assert seen[0]["capture_scalar_outputs"] is True
    assert ConvertFrame.__dict__["__call__"] is before["ConvertFrame.__call__"]


def test_a_plain_torch_compile_after_ours_runs_as_without_superkernel():
    import torch

    import superkernel as sk
    from superkernel.pipeline import tracing

    backend = sk.get_backend(sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "cpu": {"native": False}}))
    f = _scoped(sk)
    ours = torch.compile(f, backend=backend, dynamic=False)
    x = torch.randn(8)
    ours(x)
    torch_own = _torch_functions()

    def g(x):
        return (x.sin() * 2 + 1).sum(0, keepdim=True)

    seen = []
    record = _seen_at_compile_start(seen)
    try:
        plain = torch.compile(g)  # the default Inductor backend, as vLLM's own compile
        assert torch.allclose(plain(x), g(x))
    finally:
        torch._dynamo.callback_handler.remove_start_callback(record)
    assert seen, "the plain compile did not compile"
    assert all(s["ConvertFrame.__call__"] is torch_own["ConvertFrame.__call__"] for s in seen), seen
    assert not any(s["capture_scalar_outputs"] for s in seen), "superkernel's capture settings leaked into it"
    assert tracing._applied is None and not tracing._active.stack
    assert _torch_functions() == torch_own


def test_another_backend_with_a_context_gets_what_torch_gives_it():
    """superkernel's context reaches Dynamo for its own backends only: another backend object with a
    ``backend_ctx_ctor`` (which torch.compile drops) is compiled as torch compiles it, without it."""
    import contextlib

    import torch

    entered = []

    def other(gm, example_inputs):
        return gm.forward

    other.backend_ctx_ctor = lambda: contextlib.nullcontext(entered.append(1))
    fn = torch.compile(lambda x: x.cos() + 1, backend=other)
    x = torch.randn(3)
    assert torch.equal(fn(x), x.cos() + 1) and entered == []


def test_the_converter_wrapping_is_undone_also_on_an_error():
    from torch._dynamo.convert_frame import ConvertFrame

    from superkernel.pipeline import capture_fallback

    own = ConvertFrame.__dict__["__call__"]
    with pytest.raises(KeyError):
        with capture_fallback.converter_wrapped():
            with capture_fallback.converter_wrapped():  # nested: one wrapping
                assert getattr(ConvertFrame.__dict__["__call__"], "_superkernel_fallback", False)
            assert ConvertFrame.__dict__["__call__"] is not own
            raise KeyError("inside")
    assert ConvertFrame.__dict__["__call__"] is own


def test_a_partition_compile_reports_no_strides_and_puts_the_graphs_back_also_on_an_error():
    import torch
    from torch._guards import TracingContext, tracing

    from superkernel.runtime.inductor.compile import partition_reports_no_strides

    context = TracingContext(None)
    assert hasattr(context, "output_strides")  # an instance attribute: the row names what reads and sets it
    graphs = [(1,)]
    context.output_strides = graphs
    with tracing(context):
        with pytest.raises(RuntimeError):
            with tweaks.context("partitions report no output strides"):
                assert context.output_strides is None
                raise RuntimeError("a failing partition compile")
        assert context.output_strides is graphs
    with partition_reports_no_strides():  # outside a trace: nothing to do
        assert TracingContext.try_get() is None


def test_compile_partition_leaves_the_graphs_output_strides_as_they_were():
    import torch
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from superkernel.runtime.inductor.compile import compile_partition

    gm = make_fx(lambda x: ((x * 2).view(-1),))(torch.randn(2, 3))
    fake_mode = FakeTensorMode()
    context = TracingContext(fake_mode)
    graphs = [(3, 1)]
    context.output_strides = graphs
    with tracing(context):
        fn = compile_partition(gm, [fake_mode.from_tensor(torch.randn(2, 3))], device="cpu", cpp_wrapper=False)
        assert context.output_strides is graphs
    x = torch.randn(2, 3)
    (out,) = fn(x)
    assert torch.equal(out, (x * 2).view(-1))


def test_the_compile_frame_still_names_its_backend_compiler_fn():
    """``backend_context.context_of_this_compile`` reads ``_compile``'s ``compiler_fn`` argument."""
    import inspect

    from torch._dynamo.convert_frame import _compile

    assert "compiler_fn" in inspect.signature(_compile).parameters


def test_another_backends_compile_inside_a_superkernel_call_traces_with_torchs_settings():
    """A function compiled with another backend (vLLM's own helpers) and first called from an eager part of a
    superkernel-compiled step compiles while our call runs: superkernel's capture settings stay out of it."""
    import sys

    import torch

    import superkernel as sk

    inner = torch.compile(lambda y: y.cos() + 1, backend="eager")

    @torch._dynamo.disable
    def eager_part(y):
        return inner(y)

    def f(x):
        with sk.super_kernel("s"):
            y = x.sin() * 2
        return eager_part(y)

    backend = sk.get_backend(sk.CompilerConfig.from_dict({"mode": "reduce-overhead", "cpu": {"native": False}}))
    seen = []

    def record(_args=None):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "_compile":
            frame = frame.f_back
        code = frame.f_locals.get("code") if frame is not None else None
        seen.append((getattr(code, "co_name", "?"), torch._dynamo.config.capture_scalar_outputs))
    torch._dynamo.callback_handler.register_start_callback(record)  # after superkernel's (get_backend above)
    try:
        fn = torch.compile(f, backend=backend, dynamic=False)
        x = torch.randn(4)
        assert torch.equal(fn(x), f(x))
    finally:
        torch._dynamo.callback_handler.remove_start_callback(record)
    assert ("f", True) in seen and ("<lambda>", False) in seen, seen
