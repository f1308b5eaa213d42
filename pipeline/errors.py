"""One error hierarchy. Every user-facing failure is a `PipelineError`: one line, a fix, exit code 2."""

from __future__ import annotations


class PipelineError(Exception):
    """Base class: the message names the problem and the fix; the CLI prints it and exits with `exit_code`."""

    exit_code = 2


class SpecError(PipelineError):
    """The build spec or the model registry is invalid or incoherent."""


class RegistryError(SpecError):
    """A model registry file is missing, malformed or names an unknown model."""


class DownloadError(PipelineError):
    """A checkpoint could not be acquired or verified."""


class CalibrationError(PipelineError):
    """Calibration data, quantization, the quality gate or the export failed."""


class CompileError(PipelineError):
    """The engine build cannot run here or its result is not what was planned."""


class PackageError(PipelineError):
    """The Triton model repository is invalid."""


class ServeError(PipelineError):
    """tritonserver did not start, load or answer."""


class VerifyError(PipelineError):
    """An artifact does not match its manifest or this host."""
