"""Standard Webhooks signatures (https://www.standardwebhooks.com/).

``webhook-signature`` carries one ``v1,<base64 HMAC-SHA256>`` per secret over
``"{id}.{timestamp}.{body}"``; several secrets let a receiver rotate keys.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets as _secrets
from collections.abc import Sequence

PREFIX = "whsec_"
_SECRET = re.compile(r"whsec_[A-Za-z0-9+/]+=*")


def redact_secrets(text: str) -> str:
    """``text`` with every signing secret replaced: the last line of defence for
    anything that is printed or logged (error messages, log lines)."""
    return _SECRET.sub("whsec_***", text) if PREFIX in text else text


def decode_secret(secret: str) -> bytes:
    if not secret.startswith(PREFIX):
        raise ValueError("signing secrets must look like whsec_<base64>")
    return base64.b64decode(secret[len(PREFIX) :], validate=True)


def new_secret() -> str:
    """A fresh random secret in the whsec_ format (24 random bytes)."""
    return PREFIX + base64.b64encode(_secrets.token_bytes(24)).decode()


class Signer:
    """Signs request bodies with every configured secret."""

    def __init__(self, secrets: Sequence[str]) -> None:
        self._keys = [decode_secret(s) for s in secrets]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def sign(self, msg_id: str, timestamp: int, body: bytes) -> str:
        signed = f"{msg_id}.{timestamp}.".encode() + body
        return " ".join(
            "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode() for key in self._keys
        )
