"""Loading and validating the input model; writing outputs atomically.

Every problem with the input becomes an :class:`InputError` whose message is one line
naming the problem (exit code 2 on the command line)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from superkernel.util import (
    InputFileError, OutputError, check_not_input, check_output_file, check_regular_file, read_limited, safe_text,
)

MIN_OPSET = 11   # the rules read axes / split sizes from attributes (11-12) or inputs (13+); below 11
                 # is untested (Slice before 10, Clip/Pad before 11 take attributes) and refused
MAX_OPSET = 25   # newest default-domain opset verified to load in the ONNX Runtime we test with


MAX_MODEL_BYTES = 2 << 30         # protobuf's own limit for one message
MAX_EXTERNAL_BYTES = 256 << 30    # one external data file


class InputError(Exception):
    """Bad input: missing file, not ONNX, truncated protobuf, checker failure, unsupported
    opset, rule filter matching nothing, bad output path."""


@dataclass
class LoadedModel:
    path: str
    model: ir.Model
    opset: int
    external_data: bool
    external_files: list[str]


def _one_line(msg: object) -> str:
    return safe_text(" ".join(str(msg).split()), 300)


def load(path: str) -> LoadedModel:
    if not os.path.exists(path):
        raise InputError(f"input file not found: {safe_text(path)}")
    if os.path.isdir(path):
        raise InputError(f"input is a directory, not an ONNX file: {safe_text(path)}")
    try:
        blob = read_limited(path, MAX_MODEL_BYTES, "--input")  # a FIFO or device is never read
    except InputFileError as e:
        raise InputError(str(e)) from None
    try:
        proto = onnx.load_model_from_string(blob)
    except DecodeError as e:
        raise InputError(f"{path}: not an ONNX model or truncated protobuf ({_one_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - onnx raises assorted errors for garbage
        raise InputError(f"{path}: cannot read as ONNX ({_one_line(e)})") from None
    if not proto.HasField("graph") or proto.ir_version == 0 or len(proto.opset_import) == 0:
        raise InputError(f"{path}: not an ONNX model (no graph, IR version or opset import)")
    base = os.path.dirname(os.path.abspath(path))
    files = []
    for t in onnx.external_data_helper._get_all_tensors(proto):
        if onnx.external_data_helper.uses_external_data(t):
            loc = {e.key: e.value for e in t.external_data}.get("location", "")
            full = os.path.normpath(os.path.join(base, loc))
            if not os.path.lexists(full):
                raise InputError(f"{path}: external data file {safe_text(loc)!r} of tensor {safe_text(t.name)!r} "
                                 "not found")
            try:
                check_regular_file(full, MAX_EXTERNAL_BYTES, "external data file")
            except InputFileError as e:
                raise InputError(f"{path}: {e}") from None
            if full not in files:
                files.append(full)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise InputError(f"{path}: model imports no default ONNX opset")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise InputError(f"{path}: unsupported opset {opset} (supported: {MIN_OPSET}-{MAX_OPSET})")
    try:
        onnx.checker.check_model(path if files else proto)
    except Exception as e:  # noqa: BLE001 - ValidationError and friends
        raise InputError(f"{path}: ONNX checker failed: {_one_line(e)}") from None
    try:
        model = ir.load(path)
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{path}: cannot convert to the ONNX IR: {_one_line(e)}") from None
    return LoadedModel(path, model, int(opset), bool(files), files)


def check_output_path(input_path: str, output_path: str, external_files: list[str], *, flag: str = "--output") -> None:
    """Refuse, before any work, an output that could lose data or cannot be written.

    The shared check (:func:`superkernel.util.check_output_file`: not a directory, not a file
    of the input, writable) plus what an ONNX output needs: its folder must exist (the model
    is staged inside it and moved into place), and for ``--output`` its external-data twin
    ``PATH.data`` may not be a file of the input either.
    """
    if not output_path:
        raise InputError(f"{flag} is required")
    inputs = [input_path, *external_files]
    out_dir = os.path.dirname(os.path.abspath(output_path))
    if not os.path.isdir(output_path) and not os.path.isdir(out_dir):
        raise InputError(f"{flag}: output directory does not exist: {out_dir}")
    check_output_file(output_path, flag, inputs)
    if flag == "--output":
        twin = external_data_path(output_path)
        try:
            check_not_input(twin, inputs)
        except OutputError as exc:
            raise OutputError(f"{flag}: its external data file would be written to {twin}: {exc}") from None


def external_data_path(output_path: str) -> str:
    return output_path + ".data"


@dataclass
class StagedModel:
    """A fused model written to a temporary directory next to the output, not yet visible."""

    tmpdir: str
    model_path: str
    data_path: str | None
    output_path: str

    @property
    def targets(self) -> list[str]:
        """The paths :meth:`commit` writes: the output, then its external data file when there is one."""
        has_data = bool(self.data_path) and os.path.exists(self.data_path)
        return [self.output_path] + ([external_data_path(self.output_path)] if has_data else [])

    def commit(self) -> list[str]:
        """Move the model and its external data into place together, or leave both as they were;
        returns :attr:`targets`.

        Files already at the targets are first renamed aside inside the staging folder;
        if a move fails, what was moved is taken back and the old files are restored.
        """
        pairs = list(zip((self.model_path, self.data_path), self.targets))[::-1]  # the external data first
        backups: list[tuple[str, str]] = []
        moved: list[tuple[str, str]] = []
        try:
            for i, (_, target) in enumerate(pairs):
                if os.path.lexists(target):
                    aside = os.path.join(self.tmpdir, f".previous-{i}")
                    os.replace(target, aside)
                    backups.append((aside, target))
            for source, target in pairs:
                os.replace(source, target)
                moved.append((source, target))
        except BaseException:
            for source, target in reversed(moved):
                with contextlib.suppress(OSError):
                    os.replace(target, source)
            for aside, target in backups:
                with contextlib.suppress(OSError):
                    os.replace(aside, target)
            raise
        self.discard()
        return [target for _, target in reversed(pairs)]

    def discard(self) -> None:
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def inline_external_attributes(model: ir.Model) -> int:
    """Read into memory every tensor *attribute* (a ``Constant``'s value) that lives in the input's external data,
    and return how many there were. ``ir.save`` moves initializers into the output's data file but writes an
    attribute tensor as it is: one still pointing at the input's data file would name that file relative to the
    output, where it does not exist (ONNX Runtime's quantizers write small ``Constant`` values to external data)."""
    count = 0
    graphs = [model.graph, *model.functions.values()]
    for g in graphs:
        for node in ir.traversal.RecursiveGraphIterator(g):
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                    t = attr.value
                    node.attributes[name] = ir.AttrTensor(name, ir.Tensor(t.numpy(), dtype=t.dtype, name=t.name))
                    count += 1
    return count


def stage_model(model: ir.Model, output_path: str, *, external_data: bool) -> StagedModel:
    """Save ``model`` under a temporary directory in the output's directory (same file
    system, so the final os.replace is atomic). With ``external_data`` the tensors go to
    ``<output>.data``, referenced by that final name (attribute tensors the input kept in its
    external data are read into the model first: :func:`inline_external_attributes`)."""
    if external_data:
        inline_external_attributes(model)
    out_dir = os.path.dirname(os.path.abspath(output_path))
    base = os.path.basename(output_path)
    tmp = tempfile.mkdtemp(prefix=".graph-autofusion-", dir=out_dir)
    data_name = os.path.basename(external_data_path(output_path)) if external_data else None
    try:
        ir.save(model, os.path.join(tmp, base), external_data=data_name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return StagedModel(tmp, os.path.join(tmp, base), os.path.join(tmp, data_name) if data_name else None,
                       output_path)


