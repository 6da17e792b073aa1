"""Who is asking: API tokens (only their hashes are configured) and, optionally, OIDC JWTs.

API tokens are 32 random bytes (`netsleuth controller hash-token --new`), so one SHA-256 is as strong as a
slow hash against guessing; scrypt hashes are accepted too for tokens people chose themselves. Hashes are
compared in constant time. A JWT is checked with PyJWT against a key of the configured JWKS file (by `kid`),
its issuer, audience and expiry; its roles come from a claim and only roles the config defines count.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

import jwt

from netsleuth.controller.config import ControllerConfig, OidcConfig
from netsleuth.errors import UsageError

__all__ = ["AuthError", "Authenticator", "Principal", "hash_token", "new_token", "token_matches"]

_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


class AuthError(Exception):
    """401: the sentence says what was wrong with the credentials, never which user exists."""


@dataclass(frozen=True)
class Principal:
    user: str
    roles: tuple[str, ...]
    via: str  # "token" | "oidc"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str, scheme: str = "sha256") -> str:
    if scheme == "sha256":
        return "sha256:" + hashlib.sha256(token.encode()).hexdigest()
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(token.encode(), salt=salt, dklen=32, **_SCRYPT)
    return f"scrypt:{salt.hex()}:{digest.hex()}"


def token_matches(token: str, stored: str) -> bool:
    scheme, _, rest = stored.partition(":")
    if scheme == "sha256":
        candidate = hashlib.sha256(token.encode()).hexdigest()
        return hmac.compare_digest(candidate, rest)
    if scheme == "scrypt":
        salt, _, digest = rest.partition(":")
        candidate = hashlib.scrypt(token.encode(), salt=bytes.fromhex(salt), dklen=32, **_SCRYPT).hex()
        return hmac.compare_digest(candidate, digest)
    return False


def _load_jwks(config: OidcConfig) -> jwt.PyJWKSet:
    try:
        return jwt.PyJWKSet.from_dict(json.loads(config.jwks_file.read_text()))
    except (OSError, ValueError, jwt.PyJWTError) as error:
        raise UsageError(f"oidc.jwks_file {config.jwks_file} is not a usable JWKS: {error}") from error


class Authenticator:
    def __init__(self, config: ControllerConfig) -> None:
        self._config = config
        self._sha256 = {
            user.token_hash.partition(":")[2]: user
            for user in config.users
            if user.token_hash.startswith("sha256:")
        }
        self._slow = [user for user in config.users if not user.token_hash.startswith("sha256:")]
        self._jwks = _load_jwks(config.oidc) if config.oidc is not None else None

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise AuthError("this request needs an Authorization: Bearer <token> header.")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError("the Authorization header must be 'Bearer <token>'.")
        if len(token) > 8192:
            raise AuthError("the bearer token is too long to be one of ours.")
        if token.count(".") == 2 and self._jwks is not None:
            return self._from_jwt(token)
        digest = hashlib.sha256(token.encode()).hexdigest()
        # Dictionary lookup by the digest, then a constant-time compare of the one candidate.
        user = self._sha256.get(digest)
        if user is not None and hmac.compare_digest(user.token_hash, "sha256:" + digest):
            return Principal(user=user.name, roles=user.roles, via="token")
        for user in self._slow:
            if token_matches(token, user.token_hash):
                return Principal(user=user.name, roles=user.roles, via="token")
        raise AuthError("the token is not valid.")

    def _from_jwt(self, token: str) -> Principal:
        oidc = self._config.oidc
        assert oidc is not None and self._jwks is not None
        try:
            header = jwt.get_unverified_header(token)
            kid = header.get("kid")
            keys = [key for key in self._jwks.keys if kid is None or key.key_id == kid]
            if not keys:
                raise AuthError("the token was signed by a key the JWKS file does not hold.")
            claims: dict[str, Any] = jwt.decode(
                token,
                key=keys[0],
                algorithms=["RS256", "ES256", "EdDSA", "PS256"],
                audience=oidc.audience,
                issuer=oidc.issuer,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as error:
            raise AuthError("the token has expired.") from error
        except jwt.PyJWTError as error:
            raise AuthError(f"the token is not valid: {error}.") from error
        user = claims.get(oidc.user_claim)
        if not isinstance(user, str) or not user:
            raise AuthError(f"the token has no {oidc.user_claim} claim.")
        raw_roles = claims.get(oidc.roles_claim, [])
        if isinstance(raw_roles, str):
            raw_roles = raw_roles.split()
        roles = tuple(r for r in raw_roles if isinstance(r, str) and r in self._config.roles)
        return Principal(user=user, roles=roles, via="oidc")
