"""Names a Kubernetes API server and a container runtime accept, checked before anything is rendered.

- DNS-1123 label (namespaces): 1-63 lowercase letters, digits and '-', starting and ending alphanumeric.
- DNS-1123 subdomain (PersistentVolumeClaim and Secret names): dot-separated labels, 253 characters at most.
- Image reference (the grammar of distribution/reference, which containerd and CRI-O parse):
  `[host[:port]/]path[:tag][@digest]`, path components lowercase `[a-z0-9]+` joined by `.`, `_`, `__` or `-`s,
  tag `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`, digest `algorithm:hex` (32+ hex digits), name 255 characters at most.
- Label key (nodeSelector, tolerations; also an extended resource name): `[prefix/]name`, prefix a DNS-1123
  subdomain, name 1-63 letters, digits, '-', '_', '.' starting and ending alphanumeric; label value: the same
  pattern, empty allowed (Kubernetes `IsQualifiedName` / `IsValidLabelValue`).
- Registry host of an image reference: the first '/'-separated component when it holds '.' or ':' or is
  `localhost` (distribution/reference `splitDockerDomain`); without one a runtime pulls from Docker Hub.
- Release URL: http(s) with a host, no whitespace or control characters, and no `user:password@` (it would be
  written in clear into serving.yaml / serve.sbatch).
"""

from __future__ import annotations

import re
import urllib.parse

from pipeline.core.errors import DeployError

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(rf"{_LABEL}")
DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
LABEL_MAX, SUBDOMAIN_MAX = 63, 253

_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>{_NAME})(?::(?P<tag>[\w][\w.-]{{0,127}}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
NAME_MAX = 255
_QUALIFIED = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def dns1123_label(value: str, flag: str) -> str:
    """`value` if it is a DNS-1123 label (a namespace), else a DeployError naming `flag`."""
    if len(value) > LABEL_MAX or not DNS1123_LABEL.fullmatch(value):
        raise DeployError(f"{flag} {value!r}: not a DNS-1123 label (1-{LABEL_MAX} lowercase letters, digits and '-', "
                          "starting and ending with a letter or digit); e.g. inference")
    return value


def dns1123_subdomain(value: str, flag: str) -> str:
    """`value` if it is a DNS-1123 subdomain (a PVC or Secret name), else a DeployError naming `flag`."""
    if len(value) > SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.fullmatch(value):
        raise DeployError(f"{flag} {value!r}: not a DNS-1123 subdomain (at most {SUBDOMAIN_MAX} lowercase letters, "
                          "digits, '-' and '.', each dot-separated part starting and ending with a letter or digit); "
                          "e.g. model-releases")
    return value


def image_reference(value: str, flag: str) -> str:
    """`value` if it is an image reference a container runtime can pull, else a DeployError naming `flag`."""
    m = IMAGE_REFERENCE.fullmatch(value)
    if m is None or len(m.group("name")) > NAME_MAX:
        raise DeployError(f"{flag} {value!r}: not an image reference ([host[:port]/]path[:tag][@sha256:HEX], "
                          f"lowercase path, name at most {NAME_MAX} characters); "
                          "e.g. nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3")
    return value


def label_key(value: str, flag: str) -> str:
    """`value` if it is a label key (`[prefix/]name`), else a DeployError naming `flag`."""
    prefix, _, name = value.rpartition("/")
    if (not name or len(name) > LABEL_MAX or not _QUALIFIED.fullmatch(name)
            or ("/" in value and (len(prefix) > SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.fullmatch(prefix)))):
        raise DeployError(f"{flag} {value!r}: not a label key ([DNS-1123 prefix/]name, name 1-{LABEL_MAX} letters, "
                          "digits, '-', '_', '.', starting and ending with a letter or digit); e.g. nvidia.com/gpu")
    return value


def label_value(value: str, flag: str) -> str:
    """`value` if it is a label value, else a DeployError naming `flag`."""
    if len(value) > LABEL_MAX or not _QUALIFIED.fullmatch(value):
        raise DeployError(f"{flag} {value!r}: not a label value (at most {LABEL_MAX} letters, digits, '-', '_', '.', "
                          "starting and ending with a letter or digit); e.g. NVIDIA-H100-80GB-HBM3")
    return value


def registry_host(image: str) -> str | None:
    """The registry host of image reference `image`, or None (a bare name: Docker Hub)."""
    first, slash, _ = image.partition("/")
    return first if slash and ("." in first or ":" in first or first == "localhost") else None


def check_release_url(url: str) -> str:
    """`url` when it is an http(s) URL with a host and no credentials in it, else `DeployError` (exit 2); messages
    never repeat what sits before an `@`."""
    bad = f"--release-url {re.sub(r'//[^/]*@', '//***@', url)!r}"
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise DeployError(f"{bad}: holds whitespace or control characters; percent-encode them")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise DeployError(f"{bad}: not a URL ({exc}); give http(s)://host/path/release.tar") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeployError(f"{bad}: give an http(s) URL with a host, or --release-volume for a volume")
    if parts.username is not None or parts.password is not None:
        raise DeployError(f"{bad}: credentials in the URL would be written in clear into the deployment files; drop "
                          "user:password@ and put the credentials in a Kubernetes Secret (--release-secret NAME, key "
                          "`header`) or, on Slurm, export RELEASE_AUTH_HEADER before sbatch; or use --release-volume")
    return url


def kube_label(item: str, flag: str) -> tuple[str, str]:
    """`KEY=VALUE` as a Kubernetes label (`label_key`, `label_value`; the value may be empty); else a DeployError
    naming `flag`."""
    key, sep, value = item.partition("=")
    try:
        if not sep:
            raise DeployError("no '='")
        return label_key(key, flag), label_value(value, flag)
    except DeployError:
        raise DeployError(f"{flag} {item!r}: not a Kubernetes label KEY=VALUE (KEY [prefix/]name, name and VALUE at "
                          f"most {LABEL_MAX} letters, digits, '-', '_' or '.', starting and ending with a letter or "
                          "digit); e.g. release=kube-prometheus-stack") from None
