"""The package version, in a module that imports nothing, so any module can read it without loading the package's
public API (and pyproject.toml reads it from here)."""

__version__ = "0.1.0"
