"""CPU reduce-overhead segments as one native call each.

The segment's straight-line ATen program (the same program :mod:`superkernel.runtime.cpu.flat`
runs from Python) is emitted as C++ that calls the very same ATen operators through the
dispatcher. An operator whose arguments the typed signature can take is called through
its typed entry point ``at::_ops::<op>::call`` (what ``at::<op>(...)`` calls); any other
is looked up once, when the module loads, into a table of ``c10::OperatorHandle`` and
called with ``callBoxed`` on one reused IValue stack, the path
``torch.ops.aten.X.overload(...)`` takes from Python. Same kernels, same arguments, same
order, so results are bit-identical to the flat program and to the exactness reference;
only the Python interpreter between the operators is gone. If a typed call does not
compile against this torch's headers, the module is generated again with every operator
boxed. Python integer arithmetic on symbolic sizes (``n - 3``, ``max(n, 0)``, ``//``, ``%``
with Python's semantics) is emitted as C++ integer arithmetic.

Arguments are converted exactly as the Python operator call converts them: a Python
number given for a ``Tensor`` argument (``aten.add.Tensor(x, 1e-06)``) becomes a
*wrapped-number* 0-dim CPU tensor (``scalar_to_tensor`` + ``set_wrapped_number``) so type
promotion treats it as a scalar; numbers for ``float`` arguments become doubles; schema
defaults fill omitted arguments. Constant lists and wrapped numbers are built once at
load time and shared by every call (no operator mutates them: they only ever bind to
non-mutable arguments).

All segments of one graph go into one C++ translation unit (one compiler run per graph,
each segment one entry point); segments whose programs are identical (the decoder layers
of a per-layer plan: the same operators on other weights, which are arguments) share one
C++ function. Built modules are cached by content: the key is a hash of the generated
source, torch's version and the compiler command (:func:`native_key`), the shared library
lives in a private per-user cache directory (``$SUPERKERNEL_CACHE_DIR``, else
``$XDG_CACHE_HOME/superkernel`` or ``~/.cache/superkernel``; created 0700 and refused when
another user could write it), so a later process with the same graph loads it without
compiling. The torch headers are precompiled once per torch version and compiler
(a GCC precompiled header in the same cache) to keep a graph's build to seconds.

:func:`native_source` (source text + key) and :func:`build_library` / :func:`load_library`
are the seams a static-kernel package uses to carry these objects: with static kernels on,
``NativeGroup(provider=...)`` takes a graph's module from the package (named by
:func:`source_key`, loaded only where :func:`abi_fingerprint` matches) or builds it and adds
it to the package being built (``superkernel.static_kernel.native``).

Partitions of an inference graph (no output requires grad), called with grad mode off,
dispatch below the autograd layers (``ExcludeDispatchKeyGuard`` of the autograd keys and
ADInplaceOrView, what autograd's own kernels do before redispatching): with grad off
those layers compute nothing; they only keep bookkeeping (view bases, version counters)
of tensors that live inside the partition, and AOTAutograd restores the observable part
itself (it regenerates outputs that alias inputs and bumps the version of inputs the graph
mutates). The kernels, their arguments and their order are the same, so values stay
bit-identical. With grad mode on, or for a training graph, every layer runs.

Inputs that are tensor subclasses (anything but ``torch.Tensor``/``Parameter``) are not
unpacked natively: the entry point returns ``NotImplemented`` and the caller runs the
flat Python program instead (same kernels).
"""

from __future__ import annotations

from superkernel.runtime.cpu.native.literals import NativeBuildError, NativeUnsupported  # noqa: F401
from superkernel.runtime.cpu.native.codegen import NativeSource, native_source  # noqa: F401
from superkernel.runtime.cpu.native.build import (  # noqa: F401
    GENERATOR_VERSION, abi_fingerprint, build_fingerprint, build_library, cache_dir, compiler, compiler_available,
    library_path, load, load_library, native_key, source_key,
)
from superkernel.runtime.cpu.native.typed import _INT_OPS  # noqa: F401
from superkernel.runtime.cpu.native.segment import NativeGroup, NativeSegment  # noqa: F401
