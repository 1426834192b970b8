"""The complete state of a transformers cache: snapshot and restore.

transformers' cache layers keep their state in tensors (keys, values, a write position
``cumulative_length``, the conv and recurrent states of linear attention, quantized
payloads) *and* in Python attributes (a sliding window's ``cumulative_length_int``,
``is_initialized``, per-state ``has_previous_state`` dicts, a quantized layer's int
length). Restoring only some of it makes two runs from "the same" state differ. So the
snapshot is generic: every attribute of the cache and of every layer, recursively
through dicts, lists and tuples; tensors are cloned, everything else is copied.

Some models also keep decode state on their modules, outside the cache (RecurrentGemma's
convolution and recurrent states): :func:`snapshot_module_state` saves that part.
"""

from __future__ import annotations

from typing import Any

import torch

_ATOMS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def _snap(value: Any) -> tuple[str, Any]:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().clone())
    if isinstance(value, dict):
        return ("dict", (type(value), {k: _snap(v) for k, v in value.items()}))
    if isinstance(value, (list, tuple)):
        return ("seq", (type(value), [_snap(v) for v in value]))
    if isinstance(value, _ATOMS):
        return ("atom", value)
    if _is_layer(value):
        return ("layer", (value, _snap_vars(value)))
    return ("ref", value)  # functions, quantizer objects, modules: kept by reference, never mutated by a step


def _is_layer(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module.startswith("transformers.cache_utils") and hasattr(value, "__dict__")


def _snap_vars(obj: Any) -> dict[str, tuple[str, Any]]:
    return {k: _snap(v) for k, v in vars(obj).items()}


def _restore(current: Any, saved: tuple[str, Any]) -> Any:
    """The value to put back; tensors and containers are updated in place where they still fit."""
    kind, data = saved
    if kind == "tensor":
        if (isinstance(current, torch.Tensor) and current.shape == data.shape and current.dtype == data.dtype
                and current.device == data.device and current.stride() == data.stride()):
            current.copy_(data)
            return current
        return data.clone()
    if kind == "dict":
        cls, items = data
        if isinstance(current, dict) and type(current) is cls:
            for key in [k for k in current if k not in items]:
                del current[key]
            for key, value in items.items():
                current[key] = _restore(current.get(key), value)
            return current
        return cls((k, _restore(None, v)) for k, v in items.items())
    if kind == "seq":
        cls, items = data
        if isinstance(current, list) and cls is list and len(current) == len(items):
            for i, value in enumerate(items):
                current[i] = _restore(current[i], value)
            return current
        values = [_restore(current[i] if isinstance(current, (list, tuple)) and i < len(current) else None, v)
                  for i, v in enumerate(items)]
        return cls(values) if cls in (list, tuple) else cls(*values)
    if kind == "layer":
        obj, attrs = data
        _restore_vars(obj, attrs)
        return obj
    return data  # atom or reference


def _restore_vars(obj: Any, attrs: dict[str, tuple[str, Any]]) -> None:
    for key in [k for k in vars(obj) if k not in attrs]:
        delattr(obj, key)  # created after the snapshot (lazy initialization): undo it
    for key, value in attrs.items():
        current = vars(obj).get(key)
        restored = _restore(current, value)
        if restored is not current:
            setattr(obj, key, restored)


def snapshot_state(cache: Any) -> dict[str, Any]:
    """Every tensor and Python attribute of a transformers cache and of each of its layers."""
    return _snap_vars(cache)


def restore_state(cache: Any, snapshot: dict[str, Any]) -> None:
    """Put ``cache`` back to ``snapshot`` (see :func:`snapshot_state`); tensors in place."""
    _restore_vars(cache, snapshot)


def _module_state_items(module: torch.nn.Module) -> dict[str, Any]:
    """The decode state a module keeps outside the cache: plain tensor / None / number attributes.

    Some models keep their recurrent state on the modules themselves (RecurrentGemma's
    ``conv1d_state`` and ``rg_lru.recurrent_states``, reassigned every step), and some update
    buffers in place; a cache snapshot alone does not bring those back.
    """
    items = {k: v for k, v in vars(module).items()
             if not k.startswith("_") and (v is None or isinstance(v, (torch.Tensor, int, float)))}
    items.update({f"_buffers.{k}": v for k, v in module._buffers.items() if v is not None})
    return items


def snapshot_module_state(model: torch.nn.Module) -> dict[str, tuple[str, Any]]:
    """Every submodule's state outside the cache (see :func:`_module_state_items`), by qualified name."""
    return {f"{prefix}|{key}": _snap(value)
            for prefix, module in model.named_modules() for key, value in _module_state_items(module).items()}


def restore_module_state(model: torch.nn.Module, snapshot: dict[str, tuple[str, Any]]) -> None:
    """Put back what :func:`snapshot_module_state` saved; tensors in place where they still fit."""
    modules = dict(model.named_modules())
    for name, saved in snapshot.items():
        prefix, key = name.split("|", 1)
        module = modules[prefix]
        if key.startswith("_buffers."):
            buffer_name = key[len("_buffers."):]
            buffer = module._buffers.get(buffer_name)
            restored = _restore(buffer, saved)  # in place where it fits: the same object stays registered
            if restored is not buffer:
                module._buffers[buffer_name] = restored
            continue
        current = vars(module).get(key)
        restored = _restore(current, saved)
        if restored is not current:
            setattr(module, key, restored)
