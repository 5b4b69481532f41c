"""The shared analysis of one file, computed once and read by every rule."""

from mgpu_migrate.analysis.file import FileAnalysis

__all__ = ["FileAnalysis"]
