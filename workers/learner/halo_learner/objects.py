"""The object store named by HALO_STORE=s3://bucket/prefix (same rules as blob/location.ts and blob/s3.ts).

Configured by the standard variables: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (absent: AWS itself),
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (or any source of boto3's credential chain), AWS_REGION (default
us-east-1). A custom endpoint is addressed path-style. Every key is built by `key()`, from parts that cannot
leave the prefix.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PART = re.compile(r"^[A-Za-z0-9._-]+$")


class BadKey(ValueError):
    pass


class ObjectNotFound(Exception):
    pass


class ConditionalPutUnsupported(RuntimeError):
    """The server refuses `If-None-Match: *`, so a write that must happen once (a manifest's commit) cannot."""


def check_part(part: str, what: str = "key part") -> str:
    if not isinstance(part, str) or not _PART.match(part) or part in (".", ".."):
        raise BadKey(f'{what} {part!r}: letters, digits, ".", "_" and "-" only, and not "." or ".."')
    return part


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str  # no leading/trailing slash; "" for the bucket root

    def key(self, *parts: str) -> str:
        for p in parts:
            check_part(p)
        return "/".join(p for p in (self.prefix, *parts) if p)

    def url(self, *parts: str) -> str:
        return f"s3://{self.bucket}/{self.key(*parts)}"

    def child(self, *parts: str) -> "Location":
        return Location(self.bucket, self.key(*parts))


def parse_store_url(url: str, what: str = "HALO_STORE") -> Location:
    m = re.match(r"^s3://([^/]+)(?:/(.*))?$", url.strip())
    if not m:
        raise ValueError(f"{what}={url!r}: expected s3://bucket/prefix (or leave it unset for the local folder)")
    bucket, rest = m.group(1), m.group(2) or ""
    if not _BUCKET.match(bucket):
        raise ValueError(f"{what}: {bucket!r} is not a valid bucket name")
    parts = [p for p in rest.split("/") if p]
    for p in parts:
        check_part(p, f"{what} prefix")
    return Location(bucket, "/".join(parts))


def store_location(env=None) -> Location | None:
    v = (env if env is not None else os.environ).get("HALO_STORE", "").strip()
    return parse_store_url(v) if v else None


_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def client_from_env(env=None):
    env = env if env is not None else os.environ
    import boto3
    from botocore.config import Config

    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    cache_key = (endpoint, region, env.get("AWS_ACCESS_KEY_ID"))
    with _clients_lock:
        c = _clients.get(cache_key)
        if c is None:
            cfg = Config(
                retries={"max_attempts": 5, "mode": "standard"},
                s3={"addressing_style": "path"} if endpoint else {},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                max_pool_connections=32,
            )
            keys = {}
            if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
                keys = {
                    "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
                    "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
                    "aws_session_token": env.get("AWS_SESSION_TOKEN") or None,
                }
            c = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region, config=cfg, **keys)
            _clients[cache_key] = c
        return c


def _status(err) -> int | None:
    return (getattr(err, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")


def _code(err) -> str:
    return str((getattr(err, "response", None) or {}).get("Error", {}).get("Code", ""))


class S3Objects:
    """exists / get / put_if_absent / list on one bucket."""

    def __init__(self, loc: Location, client=None):
        self.loc = loc
        self.client = client or client_from_env()
        # Servers that refuse If-None-Match get head-then-put for content-addressed keys only.
        self.conditional = True

    def where(self) -> str:
        return f"s3://{self.loc.bucket}" + (f"/{self.loc.prefix}" if self.loc.prefix else "")

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.loc.bucket, Key=key)
            return True
        except ClientError as e:
            if _status(e) == 404 or _code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=self.loc.bucket, Key=key)["Body"].read()
        except ClientError as e:
            if _status(e) == 404 or _code(e) in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(f"object {key} not found in {self.where()}") from None
            raise

    def size(self, key: str) -> int | None:
        """The object's length, None when it is not there."""
        from botocore.exceptions import ClientError

        try:
            return int(self.client.head_object(Bucket=self.loc.bucket, Key=key)["ContentLength"])
        except ClientError as e:
            if _status(e) == 404 or _code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def put_if_absent(
        self, key: str, body: bytes, content_type: str | None = None, *, same_bytes_everywhere: bool = False
    ) -> bool:
        """True when this call created `key`; False when it existed (or a concurrent writer won).

        The server decides, with `If-None-Match: *`. On a server that refuses conditional writes (501, 400
        NotImplemented) this raises ConditionalPutUnsupported, unless `same_bytes_everywhere` (a content-addressed
        key: every writer writes the same bytes), where head-then-put is race-safe and is used instead. A commit
        (an adapter version's manifest) is never written that way: two learners could both see it absent."""
        from botocore.exceptions import ClientError

        extra = {"ContentType": content_type} if content_type else {}
        if self.conditional:
            for attempt in range(6):
                try:
                    self.client.put_object(Bucket=self.loc.bucket, Key=key, Body=body, IfNoneMatch="*", **extra)
                    return True
                except ClientError as e:
                    status = _status(e)
                    if status == 412:
                        return False
                    if status == 409 and attempt < 5:  # ConditionalRequestConflict: a concurrent write in flight
                        if self.exists(key):
                            return False
                        time.sleep(0.05 * (attempt + 1))
                        continue
                    if status == 501 or (status == 400 and "NotImplemented" in _code(e)):
                        self.conditional = False
                        break
                    raise
        if not same_bytes_everywhere:
            raise ConditionalPutUnsupported(
                f"{self.where()} does not support conditional writes (PUT with If-None-Match: *), which committing "
                f"{key} needs so that two writers cannot both commit it. Use a store that does (AWS S3, MinIO, "
                "Cloudflare R2, recent Ceph RGW), or leave HALO_STORE unset for the local folder"
            )
        if self.exists(key):
            return False
        self.client.put_object(Bucket=self.loc.bucket, Key=key, Body=body, **extra)
        return True

    def touch(self, key: str) -> None:
        """A new LastModified for an existing object: a copy onto itself (S3 allows that only with
        MetadataDirective REPLACE), server-side, no bytes sent."""
        self.client.copy_object(
            Bucket=self.loc.bucket,
            Key=key,
            CopySource={"Bucket": self.loc.bucket, "Key": key},
            MetadataDirective="REPLACE",
        )

    def list(self, prefix: str) -> list[str]:
        out, token = [], None
        while True:
            kw = {"Bucket": self.loc.bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            res = self.client.list_objects_v2(**kw)
            out += [o["Key"] for o in res.get("Contents", [])]
            if not res.get("IsTruncated"):
                return out
            token = res.get("NextContinuationToken")

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.loc.bucket, Key=key)
