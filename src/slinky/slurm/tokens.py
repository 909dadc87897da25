"""Where the JWT for slurmrestd comes from.

Three providers behind one interface: a static token, a token file re-read when it changes
(e.g. a mounted Secret), and tokens minted from the Slurm JWT key (HS256, claims `sun`,
`iat`, `exp`) and renewed before they expire. On a 401 the client calls `invalidate()` and
asks once more. No provider ever puts a token in its repr, a log line or an exception.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

import jwt
from prometheus_client import Counter

MINTED = Counter("slinky_slurm_tokens_minted_total", "JWTs minted from a Slurm JWT key", ["user"])


class TokenProvider(Protocol):
    user: str

    async def token(self) -> str:
        """A token to send now."""
        ...

    def invalidate(self) -> None:
        """The server refused the last token; produce a fresh one if possible."""
        ...


class StaticToken:
    def __init__(self, token: str, *, user: str = "slurm") -> None:
        self._token = token
        self.user = user

    def __repr__(self) -> str:
        return f"StaticToken(user={self.user!r})"

    async def token(self) -> str:
        return self._token

    def invalidate(self) -> None:
        """A static token cannot be renewed; the caller will see the auth error."""


class TokenFile:
    """A token in a file, re-read whenever the file changes (mtime/size) or after a 401."""

    def __init__(self, path: str | Path, *, user: str = "slurm") -> None:
        self.path = Path(path)
        self.user = user
        self._stamp: tuple[int, int] | None = None
        self._token = ""

    def __repr__(self) -> str:
        return f"TokenFile(path={str(self.path)!r}, user={self.user!r})"

    async def token(self) -> str:
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp or not self._token:
            self._token = self.path.read_text().strip()
            self._stamp = stamp
        return self._token

    def invalidate(self) -> None:
        self._stamp = None


class MintedToken:
    """Short-lived HS256 tokens signed with the cluster's JWT key.

    A token is reused until `refresh_before` seconds before it expires, then a new one is
    minted; so a token in flight is always valid for at least that long. Made `from_file`,
    the key is read again whenever the file changes (a rotated key in a mounted Secret: the
    kubelet swaps the file) and after a refused token, so a rotation needs no restart.
    """

    def __init__(
        self,
        key: bytes,
        *,
        user: str = "slurm",
        lifetime: float = 900.0,
        refresh_before: float | None = None,
    ) -> None:
        if lifetime < 2:
            raise ValueError("token lifetime must be at least 2 seconds")
        self._key = key
        self.user = user
        self.lifetime = lifetime
        self.refresh_before = refresh_before if refresh_before is not None else lifetime / 3
        self._token = ""
        self._expires = 0.0
        self.minted = 0
        self._key_file: Path | None = None
        self._key_stamp: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return f"MintedToken(user={self.user!r}, lifetime={self.lifetime})"

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: object) -> MintedToken:
        """Tokens from the key in `path`, followed when the file changes."""
        minted = cls(Path(path).read_bytes(), **kwargs)  # type: ignore[arg-type]
        minted._key_file = Path(path)
        minted._key_stamp = _stamp(minted._key_file)
        return minted

    def _follow_key_file(self) -> None:
        if self._key_file is None:
            return
        try:
            stamp = _stamp(self._key_file)
        except OSError:
            return  # mid-swap, or gone: keep the key in hand
        if stamp == self._key_stamp:
            return
        try:
            key = self._key_file.read_bytes()
        except OSError:
            return
        self._key_stamp = stamp
        if key.strip() and key != self._key:
            self._key = key
            self._token = ""

    @property
    def expires_at(self) -> float:
        """Unix time the current token expires (0 before the first)."""
        return self._expires

    async def token(self) -> str:
        self._follow_key_file()
        now = time.time()
        if not self._token or now >= self._expires - self.refresh_before:
            iat = int(now)
            exp = int(now + self.lifetime)
            self._token = jwt.encode({"sun": self.user, "iat": iat, "exp": exp}, self._key, "HS256")
            self._expires = float(exp)
            self.minted += 1
            MINTED.labels(self.user).inc()
        return self._token

    def invalidate(self) -> None:
        self._token = ""
        self._key_stamp = None  # the key may have changed without a new stamp: read it again


def _stamp(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size)
