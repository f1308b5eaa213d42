"""One error hierarchy. Every user-facing failure is a `PipelineError`: one line naming the problem and the fix,
printed by the CLI as `error: <line>`, which then exits with the class's `exit_code`:

| code | meaning | classes |
|---|---|---|
| 0 | success | |
| 1 | unexpected failure (a bug: Python prints a traceback) | |
| 2 | bad input, or a prerequisite output is missing: fix the command, the spec or run the earlier stage | most |
| 3 | integrity: an artifact differs from its manifest or release record (corrupt, modified, extra) | `IntegrityError` |
| 4 | this host cannot do it: no GPU / TensorRT-LLM, too little GPU memory, RAM or disk for the build, or an engine built for another toolchain or GPU | `HostError` |
| 5 | the work ran and failed: an I/O error (disk full, file too large, permission), requests failed, or a served server failed | `RunError` |
"""

from __future__ import annotations

from typing import Any


class PipelineError(Exception):
    """Base class: the message names the problem and the fix; the CLI prints it and exits with `exit_code`.

    Args:
        message: the one line to print.
        path: the file or directory the error is about, when there is one.
        expected, actual: what was recorded or required, and what was found.
    """

    exit_code = 2

    def __init__(self, message: str, *, path: Any = None, expected: Any = None, actual: Any = None):
        super().__init__(" ".join(str(message).split()))  # always one line
        self.path, self.expected, self.actual = path, expected, actual


class SpecError(PipelineError):
    """The build spec or the model registry is invalid or incoherent."""


class RegistryError(SpecError):
    """A model registry file is missing, malformed or names an unknown model."""


class DownloadError(PipelineError):
    """A checkpoint could not be acquired or verified."""


class CalibrationError(PipelineError):
    """Calibration data, quantization, the quality gate or the export failed."""


class QualityGateFailed(CalibrationError):
    """A quantized checkpoint's held-out perplexity delta exceeds the gate: `actual` is the delta (%), `expected` the
    threshold (%)."""


class CompileError(PipelineError):
    """The engine build cannot run here or its result is not what was planned."""


class PackageError(PipelineError):
    """The Triton model repository is invalid."""


class ServeError(PipelineError):
    """tritonserver did not start, load or answer."""


class BuildError(PipelineError):
    """The build options are inconsistent, or a stage output needed by the task is missing."""


class ReleaseError(PipelineError):
    """A release cannot be assembled from the current stage outputs."""


class VerifyError(PipelineError):
    """The path given to verify is not something verifiable (not a release, or unreadable)."""


class BenchError(PipelineError):
    """The benchmark cannot run (server unreachable, not local, model missing, bad options)."""


class DeployError(PipelineError):
    """Deployment files cannot be rendered: bad options, an unplaceable model, or a manifest that fails its schema."""


class IntegrityError(PipelineError):
    """An artifact does not match its manifest or release record: corrupt, truncated, modified or incomplete."""

    exit_code = 3


class HashMismatchError(IntegrityError, VerifyError):
    """verify: files differ from, are missing from, or are extra to the recorded hashes (`report` has the list)."""

    def __init__(self, message: str, report: Any = None, **fields: Any):
        super().__init__(message, **fields)
        self.report = report


class CorruptArtifactError(IntegrityError, VerifyError):
    """verify: the artifact is unreadable, or its release.json / manifest is malformed or oversized."""


class HostError(PipelineError):
    """This host lacks what the task needs (GPU, TensorRT-LLM) or does not match what an artifact was built for."""

    exit_code = 4


class ToolchainError(HostError, CompileError):
    """The compile preflight failed: no suitable GPU or TensorRT-LLM on this host."""


class HostMismatchError(HostError, VerifyError):
    """verify: an engine was built for another TensorRT-LLM/TensorRT version or GPU architecture than this host."""

    def __init__(self, message: str, report: Any = None, **fields: Any):
        super().__init__(message, **fields)
        self.report = report


class HostResourceError(HostError):
    """This host lacks the GPU memory, RAM or disk a build needs (checked before any download)."""


class RunError(PipelineError):
    """The work ran and failed: an I/O error, or a served deployment failed requests."""

    exit_code = 5


class RequestsFailed(RunError, BenchError):
    """The benchmark ran but some requests failed (the report is still printed)."""


class ServerFailed(RunError, ServeError):
    """A server that was serving failed: it exited, or a model instance lost its Python stub (it was stopped)."""


def os_error_in(exc: BaseException) -> OSError | None:
    """The `OSError` behind `exc`: itself, or the one a native library (safetensors, tokenizers) reports only as text
    ("... (os error 27)"); None when `exc` is not an I/O failure."""
    import os
    import re

    if isinstance(exc, OSError):
        return exc
    m = re.search(r"\(os error (\d+)\)", str(exc))
    return OSError(int(m.group(1)), os.strerror(int(m.group(1)))) if m else None


def io_error(exc: OSError, doing: str) -> RunError:
    """A `RunError` line for an `OSError` raised while `doing` something (disk full, file too large, permission)."""
    import errno

    hints = {
        errno.ENOSPC: "free disk space",
        errno.EFBIG: "raise the file size limit (ulimit -f) or write elsewhere",
        errno.EDQUOT: "free quota",
        errno.EACCES: "fix the permissions",
        errno.EPERM: "fix the permissions",
        errno.EROFS: "write to a writable location (PIPELINE_ROOT / PIPELINE_CACHE)",
    }
    where = f" {exc.filename}" if exc.filename else ""
    where += f" -> {exc.filename2}" if getattr(exc, "filename2", None) else ""
    reason = exc.strerror or type(exc).__name__
    hint = hints.get(exc.errno or 0, "check the path and the disk")
    return RunError(f"{doing} failed{':' if where else ''}{where}: {reason}; {hint}, then re-run (nothing half-written "
                    "is kept)",
                    path=exc.filename)
