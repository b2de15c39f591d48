"""Built-in demo cases: a real model, deterministic data and a task metric, in one call."""

from .ocr import DemoCase, load_demo

__all__ = ["DemoCase", "load_demo"]
