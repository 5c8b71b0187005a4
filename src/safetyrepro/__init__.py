"""SafetyRepro: does "model A is safer than model B" survive ordinary harness choices?

Python API (imported on first use, so ``import safetyrepro`` stays cheap):
``safetyrepro.certify(df_or_path, config_cols=..., alpha=..., ...)`` -> ``CertifyResult``;
``read_lmeval(...)``, ``read_inspect(...)``, ``read_helm(...)`` -> the item-level DataFrame."""

from importlib import import_module as _import_module

__version__ = "0.1.0"

# name -> (module, attribute); ``certify`` is the module itself, which is callable
_API = {
    "certify": ("safetyrepro.certify", None),
    "CertifyResult": ("safetyrepro.certify", "CertifyResult"),
    "read_lmeval": ("safetyrepro.api", "read_lmeval"),
    "read_inspect": ("safetyrepro.api", "read_inspect"),
    "read_helm": ("safetyrepro.api", "read_helm"),
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'safetyrepro' has no attribute {name!r}")
    module, attr = _API[name]
    mod = _import_module(module)
    return mod if attr is None else getattr(mod, attr)


def __dir__():
    return sorted(set(globals()) | set(_API))
