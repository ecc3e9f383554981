"""The one version of queueworker: the package's (pyproject reads it), the chart's version and
appVersion, and the images' default tag and label are kept equal to it (tests/test_packaging.py)."""

__version__ = "0.1.0"
