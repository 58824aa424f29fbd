"""Where sandbox bytes live: one small interface, two backends.

- :class:`LocalStore`: a folder on the service host, shared by every matcher process of the
  host; the matcher streams the bytes in and out.
- :class:`S3Store`: an S3-compatible object store through ``boto3`` (imported only when this
  backend is chosen); uploads and downloads go straight to the store through presigned URLs,
  so the matcher never handles the bytes.

Keys are sandbox ids (``sb:sha256:<hex>``); the records (owners, sizes, jobs) are in
taskqueue.files.sandboxes.
"""

from __future__ import annotations

import base64
import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast

from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import SandboxSettings, Settings

ARCHIVE_TYPE = "application/gzip"


@dataclass(frozen=True)
class UploadTicket:
    """Where a client sends a sandbox's bytes: the method, URL and headers to use."""

    url: str
    method: str = "PUT"
    headers: dict[str, str] | None = None


class SandboxStore(Protocol):
    """What the matcher and the cleanup agent need of a store."""

    #: True when clients move the bytes themselves through presigned URLs.
    presigned: bool

    def size(self, sandbox_id: str) -> int | None:
        """The stored object's size, or None when there is none."""

    def put(self, sandbox_id: str, data: bytes) -> None:
        """Store the bytes (atomically: a reader sees all of them or nothing)."""

    def get(self, sandbox_id: str) -> bytes:
        """The bytes; FileNotFoundError when there are none."""

    def delete(self, sandbox_id: str) -> None:
        """Remove the bytes (nothing happens when there are none)."""

    def keys(self) -> Iterator[str]:
        """Every stored sandbox id."""

    def modified_at(self, sandbox_id: str) -> datetime | None:
        """When the object was stored (UTC), or None when there is none."""

    def upload_ticket(self, sandbox_id: str, size: int) -> UploadTicket | None:
        """A presigned upload for exactly these bytes, or None (upload to the matcher)."""

    def download_url(self, sandbox_id: str) -> str | None:
        """A presigned download URL, or None (download from the matcher)."""


def hex_of(sandbox_id: str) -> str:
    prefix, _, digest = sandbox_id.rpartition(":")
    if prefix != "sb:sha256" or len(digest) != 64:
        raise ValueError(f"{sandbox_id!r} is not a sandbox id")
    return digest


class LocalStore:
    """Sandboxes as files ``<directory>/<hex[:2]>/<hex>``."""

    presigned = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, sandbox_id: str) -> Path:
        digest = hex_of(sandbox_id)
        return self.directory / digest[:2] / digest

    def size(self, sandbox_id: str) -> int | None:
        try:
            return self._path(sandbox_id).stat().st_size
        except FileNotFoundError:
            return None

    def put(self, sandbox_id: str, data: bytes) -> None:
        path = self._path(sandbox_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def get(self, sandbox_id: str) -> bytes:
        return self._path(sandbox_id).read_bytes()

    def delete(self, sandbox_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(sandbox_id).unlink()

    def keys(self) -> Iterator[str]:
        if not self.directory.is_dir():
            return
        for sub in sorted(self.directory.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    if len(f.name) == 64 and not f.name.startswith("."):
                        yield f"sb:sha256:{f.name}"

    def modified_at(self, sandbox_id: str) -> datetime | None:
        try:
            return datetime.fromtimestamp(self._path(sandbox_id).stat().st_mtime, UTC)
        except FileNotFoundError:
            return None

    def upload_ticket(self, sandbox_id: str, size: int) -> UploadTicket | None:
        return None

    def download_url(self, sandbox_id: str) -> str | None:
        return None


class S3Store:
    """Sandboxes as objects ``sandboxes/<hex>`` of one bucket."""

    presigned = True

    def __init__(self, settings: SandboxSettings) -> None:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import ClientError
        except ImportError as exc:  # pragma: no cover - the server extra installs it
            raise ConfigurationError("sandboxes.backend = s3 needs boto3: pip install "
                                     "boto3") from exc
        self.settings = settings
        self.bucket = settings.bucket
        self.client: Any = boto3.client(
            "s3", endpoint_url=settings.endpoint_url or None, region_name=settings.region,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          retries={"max_attempts": 3}))
        self._errors: type[Exception] = ClientError

    @staticmethod
    def _key(sandbox_id: str) -> str:
        return f"sandboxes/{hex_of(sandbox_id)}"

    def _head(self, sandbox_id: str) -> dict[str, Any] | None:
        try:
            head: dict[str, Any] = self.client.head_object(Bucket=self.bucket,
                                                           Key=self._key(sandbox_id))
        except self._errors as exc:
            if _status(exc) == 404:
                return None
            raise
        return head

    def size(self, sandbox_id: str) -> int | None:
        head = self._head(sandbox_id)
        return None if head is None else int(head["ContentLength"])

    def modified_at(self, sandbox_id: str) -> datetime | None:
        head = self._head(sandbox_id)
        return None if head is None else cast(datetime, head["LastModified"]).astimezone(UTC)

    def put(self, sandbox_id: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(sandbox_id), Body=data,
                               ContentType=ARCHIVE_TYPE,
                               ChecksumSHA256=_b64(hex_of(sandbox_id)))

    def get(self, sandbox_id: str) -> bytes:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(sandbox_id))
        except self._errors as exc:
            if _status(exc) == 404:
                raise FileNotFoundError(sandbox_id) from exc
            raise
        data: bytes = answer["Body"].read()
        return data

    def delete(self, sandbox_id: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(sandbox_id))

    def keys(self) -> Iterator[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix="sandboxes/"):
            for item in page.get("Contents", []):
                name = str(item["Key"]).removeprefix("sandboxes/")
                if len(name) == 64:
                    yield f"sb:sha256:{name}"

    def upload_ticket(self, sandbox_id: str, size: int) -> UploadTicket | None:
        # The signature covers the length and the checksum: the store refuses other bytes.
        checksum = _b64(hex_of(sandbox_id))
        url = self.client.generate_presigned_url(
            "put_object", ExpiresIn=self.settings.url_lifetime,
            Params={"Bucket": self.bucket, "Key": self._key(sandbox_id),
                    "ContentLength": size, "ContentType": ARCHIVE_TYPE,
                    "ChecksumSHA256": checksum})
        return UploadTicket(str(url), "PUT", {"Content-Type": ARCHIVE_TYPE,
                                              "x-amz-checksum-sha256": checksum})

    def download_url(self, sandbox_id: str) -> str | None:
        return str(self.client.generate_presigned_url(
            "get_object", ExpiresIn=self.settings.url_lifetime,
            Params={"Bucket": self.bucket, "Key": self._key(sandbox_id)}))

    def ensure_bucket(self) -> None:
        """Create the bucket when it does not exist (tests, the demo)."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except self._errors:
            self.client.create_bucket(Bucket=self.bucket)


def _b64(digest_hex: str) -> str:
    return base64.b64encode(bytes.fromhex(digest_hex)).decode("ascii")


def _status(exc: Any) -> int:
    try:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    except (KeyError, TypeError, ValueError):
        return 0


def local_directory(settings: Settings) -> Path:
    """The local store's folder: the setting, or beside the SQLite database."""
    if settings.sandboxes.directory:
        return Path(settings.sandboxes.directory)
    url = settings.database.url
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url.removeprefix("sqlite:///")).parent / "sandboxes"
    return Path("work/sandboxes")


def open_store(settings: Settings) -> SandboxStore:
    """The store the settings choose."""
    if settings.sandboxes.backend == "s3":
        return S3Store(settings.sandboxes)
    return LocalStore(local_directory(settings))
