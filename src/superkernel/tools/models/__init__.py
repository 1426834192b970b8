"""Models for the workflow: the embedded zoo and local checkpoint loading."""

from superkernel.tools.models.loader import LoadedModel, ModelLoadError, load_model, looks_like_path
from superkernel.tools.models.zoo import DEFAULT_MODEL, ZOO, ZooEntry, zoo_listing

__all__ = ["DEFAULT_MODEL", "ZOO", "LoadedModel", "ModelLoadError", "ZooEntry", "load_model", "looks_like_path",
           "zoo_listing"]
