"""The bridge's one connection to Slurm: a slurmrestd client with the configured token source,
and the Slurm informer that every Slurm-facing component of the process shares (counted:
it polls while any of them runs)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import jwt

from slinky.bridge.config import BridgeConfig, ConfigError, SlurmAuth
from slinky.bridge.jobwatch import RecentReads
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.started import SlurmctldStart
from slinky.slurm.tokens import MintedToken, StaticToken, TokenFile, TokenProvider

DEFAULT_USER = "slurm"
# slurmctld does not advance `update_time` when a node is deleted (by an admin, say), so
# only a full list shows it: list everything this often (a few ms for hundreds of nodes;
# still one request, as the delta poll it replaces).
RESYNC_S = 30.0


def _user_of(token: str, configured: str | None) -> str:
    """The user a stored token was issued for (slurmrestd wants the header to agree)."""
    if configured:
        return configured
    with contextlib.suppress(jwt.PyJWTError):
        sun = jwt.decode(token, options={"verify_signature": False}).get("sun")
        if sun:
            return str(sun)
    return DEFAULT_USER


def token_provider(auth: SlurmAuth) -> TokenProvider:
    """The slurmrestd token source `auth` names (a key to mint with wins over a token file)."""
    if auth.jwt_key_file is not None:
        return MintedToken.from_file(
            auth.jwt_key_file, user=auth.user or DEFAULT_USER, lifetime=auth.token_lifetime
        )
    if auth.token_file is not None:
        first = auth.token_file.read_text().strip()
        return TokenFile(auth.token_file, user=_user_of(first, auth.user))
    assert auth.static_token is not None
    return StaticToken(auth.static_token, user=_user_of(auth.static_token, auth.user))


@dataclass
class SlurmConnection:
    """A slurmrestd client and the Slurm informer polling through it."""

    client: SlurmClient
    informer: SlurmInformer
    users: int = 0
    # The JWT key's file, when the bridge mints its tokens: then it can also act as the
    # Slurm user a pod's job runs as (see `tokens_for`). Followed when it changes.
    jwt_key_file: Path | None = None
    token_lifetime: float = 900.0
    _user_tokens: dict[str, MintedToken] = field(default_factory=dict, repr=False)
    # The job reads the process's job watches lend each other (`jobwatch.RecentReads`).
    recent_jobs: RecentReads = field(default_factory=RecentReads, repr=False)
    # When the slurmctld answering now started: every reader of job ids checks it.
    slurmctld: SlurmctldStart = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.slurmctld = SlurmctldStart(self.client)

    def tokens_for(self, user: str) -> TokenProvider | None:
        """Tokens to act as the Slurm `user` (a name or a uid): the client's own when that
        is its user, tokens minted for `user` when the bridge has the JWT key, else None
        (a stored token speaks for its own user only)."""
        own = self.client.tokens
        if user == own.user:
            return own
        if self.jwt_key_file is None:
            return None
        tokens = self._user_tokens.get(user)
        if tokens is None:
            tokens = MintedToken.from_file(
                self.jwt_key_file, user=user, lifetime=self.token_lifetime
            )
            self._user_tokens[user] = tokens
        return tokens

    @staticmethod
    def check(config: BridgeConfig, *, needed_by: str) -> None:
        """ConfigError naming the key when the config lacks what a Slurm connection needs."""
        if not config.slurm_rest_api:
            raise ConfigError("slurmRestApi", f"required by the {needed_by}")
        if config.slurm_auth is None:
            raise ConfigError(
                "slurmAuth",
                f"required by the {needed_by}: set slurmAuth.tokenFile or slurmAuth.jwtKeyFile "
                f"(or the SLURM_JWT environment variable)",
            )

    @classmethod
    def from_config(cls, config: BridgeConfig, *, needed_by: str) -> SlurmConnection:
        """The connection a component needs; ConfigError naming the key when the config lacks it."""
        cls.check(config, needed_by=needed_by)
        assert config.slurm_rest_api and config.slurm_auth is not None
        auth = config.slurm_auth
        client = SlurmClient(config.slurm_rest_api, token_provider(auth))
        informer = SlurmInformer(
            client,
            poll_interval=config.slurm_poll_interval,
            idle_interval=config.slurm_idle_poll_interval,
            resync_interval=RESYNC_S,
        )
        return cls(
            client, informer, jwt_key_file=auth.jwt_key_file, token_lifetime=auth.token_lifetime
        )

    def open(self) -> None:
        """A component starts using the connection: the informer polls while any does."""
        self.users += 1
        self.informer.start()

    async def close(self) -> None:
        """A component is done with it; the last one stops the informer and the client."""
        self.users = max(0, self.users - 1)
        if self.users:
            return
        await self.informer.stop()
        await self.client.close()
