"""The ATen graphs of one decode step of a Hugging Face causal LM as traced on device ``cuda`` — without a GPU.

What :func:`trace_fake_cuda_decode` does, and why each step is the way it is:

1. **The decode session is prepared on the CPU, for real** (:func:`superkernel.tools.decode.prepare`, by the
   caller): what the harness measures in eager — the full-length attention mask of
   models whose default one grows, the cache's growing Python ints, whether the model takes position ids,
   its cache keyword — needs values, which fake tensors do not have.
2. **Then everything moves to fake CUDA tensors** (``FakeTensorMode``; a fake tensor can say ``cuda:0``
   while its data is a meta tensor): ``model.to("cuda")`` moves parameters and buffers, as on a GPU, and
   leaves plain tensor attributes on the CPU, as on a GPU. The prefill then runs **again, eagerly, on fake
   CUDA tensors** into a fresh transformers ``StaticCache``, so that transformers itself decides where every
   tensor of the cache and every piece of decode state kept on the modules (RecurrentGemma) lives, exactly
   as a prefill on a GPU would. Where that eager fake prefill cannot run (a value read on the host: fake
   tensors have none), the cache of the real CPU prefill is used with every tensor moved to CUDA, which is
   what ``StaticLayer.lazy_initialization`` does on a GPU (``cumulative_length.to(device)``), and
   :attr:`FakeCudaDecode.prefill` says so (a model that also keeps decode state on its modules is then not
   traced: where that state would live is not known).
3. **The decode step is traced through Dynamo + AOTAutograd** the way the superkernel backend captures
   (:func:`superkernel.pipeline.capture.capture`: ``aot_module_simplified`` with the input mutations kept,
   the decompositions of the mode's CUDA realization), under the harness's Dynamo settings
   (``DecodeSession.dynamo_config``: ``.item()`` and data-dependent shapes captured, the capture fallback to a
   graph break where capturing makes Dynamo fail), with the inputs of ``DecodeSession.inputs`` — one token and
   its ``cache_position``, as fake CUDA tensors. Every graph Dynamo hands over is kept, with the reason Dynamo
   ended it (a graph break splits a step into several graphs, as in the backend).

**Why a C++ shim.** Dynamo traces fake CUDA tensors fine on a CPU-only build of PyTorch except where PyTorch's
C++ asks for the CUDA *device guard*: ``Tensor.__getitem__`` (``x[:, None]``: transformers' mask code),
``.to("cuda")`` without an index, and a few more fail with "PyTorch is not linked with support for cuda
devices". ``FakeTensorMode.__enter__`` calls ``torch._C._ensureCUDADeviceGuardSet()`` for exactly this, but
in the PyTorch used here (2.13; upstream's source says the same) that installs its no-op guard only in CUDA
builds that see no device (``c10/core/impl/DeviceGuardImplInterface.cpp``: ``if (p && p->deviceCount() ==
0)``), not in CPU-only builds.
:func:`fake_cuda_device_guard` installs c10's own ``FakeGuardImpl<CUDA>`` in the empty CUDA slot of c10's
device-guard registry while tracing and takes it out afterwards (a ~3 s g++ build of a 20-line library,
done once per directory). It computes nothing: a device guard only says which device is current.

**What differs from a trace on a GPU.** Compared with a trace of the same step on the CPU, the graphs of the
models of tests/backend/test_cuda_cut_rules.py are the same operator for operator and scope for scope (after
:func:`lift_constants_on_device`), but for attention:

- ``scaled_dot_product_attention`` becomes its math decomposition (``bmm``, ``_safe_softmax``): which fused
  kernel a GPU would run is chosen in C++ by ``_fused_sdp_choice``, which has no CUDA kernel in a CPU build.
  On a GPU the graph holds ``_scaled_dot_product_{flash,efficient,cudnn}_attention`` instead, whose fake
  outputs are all on the device too (their philox seed and offset included);
- ``torch.tensor(data, device="cuda")`` is traced as a CPU constant moved to the device, where a GPU traces a
  device constant: :func:`lift_constants_on_device` puts such chains back into the GPU's form;
- AOTAutograd's small-constant folding is off (it would compute on CUDA): :func:`host_reads_of_constants`
  lists what it would have folded;
- ``torch.cuda.is_available()`` is False (a model that branches on it takes its CPU branch), and transformers
  treats a FakeTensor as "tracing" in eager code (``is_tracing``), which only the eager prefill sees.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import torch
import torch.fx as fx

CUDA = torch.device("cuda", 0)

GUARD_SOURCE = r"""
// c10's FakeGuardImpl<CUDA> in the CUDA slot of the device-guard registry while installed (only if empty).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace {
c10::impl::FakeGuardImpl<c10::DeviceType::CUDA> fake_cuda_guard;
auto& cuda_slot() {
  return c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
}
}  // namespace

extern "C" int sk_install_fake_cuda_guard() {
  const c10::impl::DeviceGuardImplInterface* expected = nullptr;
  return cuda_slot().compare_exchange_strong(expected, &fake_cuda_guard) ? 1 : 0;
}

extern "C" int sk_remove_fake_cuda_guard() {
  const c10::impl::DeviceGuardImplInterface* expected = &fake_cuda_guard;
  return cuda_slot().compare_exchange_strong(expected, nullptr) ? 1 : 0;
}
"""


class FakeCudaUnavailable(RuntimeError):
    """The fake CUDA device guard cannot be built here (no C++ compiler, or the build failed)."""


def build_guard_library(directory: Path) -> Path:
    """The shim's shared library in ``directory`` (a private one: it is loaded as code), built if missing."""
    from superkernel.runtime.cpu.native.build import NativeBuildError, compiler

    torch_dir = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = hashlib.sha256(f"{GUARD_SOURCE}\0{torch.__version__}\0{abi}".encode()).hexdigest()[:16]
    library = Path(directory) / f"sk_fake_cuda_guard_{key}.so"
    if library.exists():
        return library
    try:
        cxx = compiler()
    except NativeBuildError as exc:
        raise FakeCudaUnavailable(f"the fake CUDA device guard needs a C++ compiler: {exc}") from None
    source = Path(directory) / f"sk_fake_cuda_guard_{key}.cpp"
    source.write_text(GUARD_SOURCE)
    partial = library.with_suffix(f".{os.getpid()}.tmp")
    cmd = [cxx, "-O1", "-std=c++17", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           f"-I{torch_dir / 'include'}", str(source), f"-L{torch_dir / 'lib'}", "-lc10",
           f"-Wl,-rpath,{torch_dir / 'lib'}", "-o", str(partial)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise FakeCudaUnavailable(f"building the fake CUDA device guard failed ({' '.join(cmd)}):\n"
                                  f"{done.stderr[-2000:]}")
    partial.replace(library)
    return library


@contextlib.contextmanager
def fake_cuda_device_guard(library: Path) -> Iterator[None]:
    """c10's ``FakeGuardImpl<CUDA>`` registered as the CUDA device guard inside (see the module doc);
    nothing is changed where a CUDA guard is registered already (a CUDA build)."""
    lib = ctypes.CDLL(str(library))
    installed = bool(lib.sk_install_fake_cuda_guard())
    try:
        yield
    finally:
        if installed:
            lib.sk_remove_fake_cuda_guard()


@dataclass
class CapturedGraph:
    """One ATen graph of the step, as the backend's ``compile_aten`` receives it."""

    gm: fx.GraphModule
    #: Dynamo's reason for ending this graph with a graph break (None: the graph ended the frame)
    break_reason: str | None
    #: the step ran this graph (False: compiled but never run, e.g. in a frame conversion the capture fallback
    #: threw away)
    ran: bool = False


@dataclass
class FakeCudaDecode:
    model_type: str
    graphs: list[CapturedGraph]
    #: "fake-cuda": the prefill ran on fake CUDA tensors; "cpu, moved": the CPU prefill's cache, moved (why: see
    #: :attr:`prefill_error`)
    prefill: str
    prefill_error: str | None = None
    #: the capture fallbacks Dynamo took (a frame traced again with graph breaks), as their warnings say
    capture_fallbacks: list[str] = field(default_factory=list)
    #: None when the whole step was traced; else why it stopped after :attr:`graphs`: after a graph break,
    #: the model's code runs eagerly until Dynamo takes over again, and a value it reads on the host there
    #: (``.item()``) does not exist on a fake tensor
    incomplete: str | None = None


def _to_cuda(value: Any) -> Any:
    """``value`` with every tensor inside (dicts, lists, tuples) on fake CUDA; call under the fake mode."""
    if isinstance(value, torch.Tensor):
        return value.to(CUDA)
    if isinstance(value, torch.device) and value.type == "cpu":  # a layer's ``device``, set by lazy_initialization
        return CUDA
    if isinstance(value, dict):
        return type(value)((k, _to_cuda(v)) for k, v in value.items()) if type(value) is dict else value
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_cuda(v) for v in value)
    return value


def _move_cache(cache: Any) -> None:
    """Every tensor of ``cache`` and of its layers on fake CUDA (the CPU prefill's cache, see the module doc)."""
    for obj in [cache, *getattr(cache, "layers", [])]:
        for name, value in list(vars(obj).items()):
            moved = _to_cuda(value)
            if moved is not value:
                setattr(obj, name, moved)


def _fake_prefill(model: torch.nn.Module, session: Any) -> Any:
    """A fresh StaticCache filled by an eager prefill on fake CUDA tensors (the prompt's shape; no values)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=session.max_cache_len)
    prompt = torch.zeros(session.prompt_ids.shape, dtype=session.prompt_ids.dtype, device=CUDA)
    model(input_ids=prompt, cache_position=torch.arange(session.prompt_len, device=CUDA), use_cache=True,
          **{session.cache_kwarg: cache})
    return cache


def trace_fake_cuda_decode(model_type: str, model: torch.nn.Module, session: Any, *, guard_library: Path,
                           mode: str = "reduce-overhead") -> FakeCudaDecode:
    """The ATen graphs of one decode step of ``model`` traced on fake CUDA tensors (see the module doc).

    ``session``: :func:`superkernel.tools.decode.prepare` of ``model`` on the CPU; scopes, if any, are applied to
    ``model`` by the caller. Both are spent afterwards: ``model``'s weights and the session's cache are fake.
    """
    import superkernel
    from superkernel.pipeline.capture import break_text, capture
    from superkernel.pipeline.capture_fallback import SuperKernelCaptureFallbackWarning
    from superkernel.runtime.realizations import realization_for
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
    from torch.fx.experimental import proxy_tensor

    cfg = superkernel.CompilerConfig.from_dict({"mode": mode})
    decompositions = realization_for(cfg, "cuda").decompositions(cfg)
    graphs: list[CapturedGraph] = []

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        reason = getattr(gm, "compile_subgraph_reason", None)
        broke = break_text(reason) if getattr(reason, "graph_break", False) else None

        def keep(aten: fx.GraphModule, _inputs: list[Any]) -> Any:
            captured = CapturedGraph(aten, broke)
            graphs.append(captured)

            def run(*args: Any) -> Any:
                captured.ran = True
                return aten(*args)

            return run

        return capture(gm, example_inputs, keep, decompositions=decompositions)

    prefill, prefill_error = "fake-cuda", None
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_cuda_device_guard(guard_library), fake_mode, torch.no_grad():
        model.to(CUDA)
        try:
            session.cache = _fake_prefill(model, session)
        except Exception as exc:  # noqa: BLE001 - a prefill fake tensors cannot run: the CPU one's cache, moved
            prefill, prefill_error = "cpu, moved", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            kept = [k for k, (kind, _) in session.module_snapshot.items() if kind == "tensor" and "|_buffers." not in k]
            if kept:  # where they would live after a prefill on a GPU is not known: no trace rather than a guess
                raise RuntimeError(f"{model_type}: the prefill cannot run on fake tensors ({prefill_error}) and the "
                                   f"model keeps decode state on its modules ({', '.join(kept[:4])}): not traced") \
                    from exc
            session.restore_cache()
            _move_cache(session.cache)
        if session.attention_mask is not None:
            session.attention_mask = session.attention_mask.to(CUDA)
        ids = torch.zeros((session.batch, 1), dtype=session.tokens.dtype, device=CUDA)
        position = torch.full((1,), session.prompt_len, dtype=torch.long, device=CUDA)
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as caught, session.dynamo_config(), \
                mock.patch.object(proxy_tensor, "CONSTANT_NUMEL_LIMIT", 0):
            warnings.simplefilter("always")
            step = torch.compile(session.step_fn(), backend=backend, dynamic=session.compile_dynamic)
            try:
                step(ids, position)
            except DataDependentOutputException as exc:
                if not graphs:
                    raise
                incomplete = (f"after graph {len(graphs) - 1} the model's code runs eagerly and reads a value on "
                              f"the host ({exc.func}) at {_model_line(exc.__traceback__)}: fake tensors have no "
                              f"values, so the graphs after it are not traced")
            else:
                incomplete = None
        torch._dynamo.reset()
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, SuperKernelCaptureFallbackWarning)]
    return FakeCudaDecode(model_type, graphs, prefill, prefill_error, fallbacks, incomplete)


def _moves_device_only(node: fx.Node) -> bool:
    """``_to_copy(x, device=d)`` (reduce-overhead), or ``prims.device_put(x, d)`` (Inductor's decompositions,
    max-autotune): a copy that changes nothing but the device."""
    if node.target is torch.ops.aten._to_copy.default:
        return len(node.args) == 1 and set(node.kwargs) == {"device"}
    if node.target is torch.ops.prims.device_put.default:
        return len(node.args) == 2 and not node.kwargs.get("non_blocking", False)
    return False


def _source_fn(node: fx.Node) -> str | None:
    """The name of the Dynamo graph node (the user's call) an ATen node was traced from."""
    stack = node.meta.get("source_fn_stack")
    return stack[-1][0] if stack else None


def host_reads_of_constants(gm: fx.GraphModule) -> list[str]:
    """Operators with a data-dependent output (``.item()``, ``equal``, ...) that read only values computed from
    the graph's constants, no input.

    AOTAutograd's tracer (``make_fx``) computes small constants along for real (``proxy_tensor.proxy_call``,
    ``CONSTANT_NUMEL_LIMIT`` elements) and answers such a read from them: a trace on a GPU has no such node.
    Here that computation would allocate on CUDA, so :func:`trace_fake_cuda_decode` turns it off
    (``CONSTANT_NUMEL_LIMIT = 0``) and such a read stays in the graph. This lists them, so that a cut one of
    them makes is known to be this trace's and not the GPU's (none in the models tested)."""
    from superkernel.pipeline.segments import source_line

    from_inputs: set[fx.Node] = set()
    found = []
    for node in gm.graph.nodes:
        if node.op == "placeholder" or any(a in from_inputs for a in node.all_input_nodes):
            from_inputs.add(node)
        elif (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
              and torch.Tag.data_dependent_output in node.target.tags and node.all_input_nodes):
            found.append(f"{node.name} = {node.target.name()} ({source_line(node)})")
    return found


def lift_constants_on_device(gm: fx.GraphModule) -> list[str]:
    """Make the graph's ``torch.tensor(data, device="cuda")`` constants what a trace on a GPU makes of them.

    ``torch.tensor`` builds its tensor in C++ (``internal_new_from_data``, torch/csrc/utils/tensor_new.cpp) on
    the CPU. In a process that can use CUDA it moves it to the device *below* the tracing modes and lifts the
    device tensor (``at::lift_fresh``): the traced graph holds a CUDA constant and a ``lift_fresh_copy`` on the
    device. Here FakeTensorMode cannot allocate on CUDA (``avoid_device_init``, no CUDA available), sets
    ``torch._C._set_only_lift_cpu_tensors(True)``, and the same call lifts the CPU tensor and moves it with a
    traced ``.to(device)``: ``get_attr (cpu) -> lift_fresh_copy (cpu) -> _to_copy(device=cuda)`` (Inductor's
    decompositions make it ``prims.device_put``), a CPU operator and a host-to-device copy a GPU trace does not
    have. This rewrites exactly that chain — the lifted copy read only by a copy that changes nothing but the
    device, both traced from the same ``torch.tensor`` call (``source_fn_stack``: an explicit
    ``torch.tensor(data).to("cuda")`` is a real transfer and stays) — into the GPU's form: the constant and its
    ``lift_fresh_copy`` described on the device, the device copy gone. Run it on a graph that will not be
    executed again (the constant's own tensor stays on the CPU; only the nodes' descriptions move).
    Returns one line per rewritten chain.
    """
    from superkernel.pipeline.segments import source_line

    aten = torch.ops.aten
    done = []
    for node in list(gm.graph.nodes):
        if not _moves_device_only(node):
            continue
        lift = node.args[0]
        if not (isinstance(lift, fx.Node) and lift.target is aten.lift_fresh_copy.default and len(lift.users) == 1):
            continue
        constant = lift.args[0]
        if not (isinstance(constant, fx.Node) and constant.op == "get_attr" and len(constant.users) == 1):
            continue
        if _source_fn(node) is None or _source_fn(node) != _source_fn(lift):  # one torch.tensor call, no .to()
            continue
        on_device, on_host = node.meta.get("val"), lift.meta.get("val")
        if not (isinstance(on_device, torch.Tensor) and isinstance(on_host, torch.Tensor)
                and on_host.device.type == "cpu" and on_device.device.type != "cpu"
                and on_host.dtype == on_device.dtype and on_host.shape == on_device.shape):
            continue
        node.replace_all_uses_with(lift)
        gm.graph.erase_node(node)
        constant.meta["val"] = lift.meta["val"] = on_device
        done.append(f"{lift.name} ({source_line(lift)})")
    if done:
        gm.recompile()
    return done


def _model_line(tb: Any) -> str:
    """``file.py:LINE`` of the innermost frame of model code (transformers) in a traceback."""
    import traceback

    frames = [f for f in traceback.extract_tb(tb) if "/transformers/" in f.filename]
    if not frames:
        return "an unknown line"
    frame = frames[-1]
    return f"{os.path.basename(frame.filename)}:{frame.lineno} ({(frame.line or '').strip()})"
