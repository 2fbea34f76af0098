"""Each run's token, derived from a key only the operator holds: an HMAC of the run's uid; and
the run's credentials, one per scope, derived from the token (`rlkube.scopes`).

The operator writes a run's token Secret and never needs its values: the same run always gets
the same token, so creating the Secret again (a restarted operator, a retried pass) needs no look
at them; a Secret it finds there is read only for its keys, to add those an older operator left
out (`builders.upgraded_token_secret`). Whoever
lacks the key cannot compute a run's token from its uid, which every reader of the run sees.
"""

import base64
import hashlib
import hmac
from pathlib import Path

from rlkube.scopes import MEMBER_SCOPES, SCOPES, member_scoped, scoped

MIN_KEY_BYTES = 32
KEY_SETTING = "--token-key-file"
"""The operator's setting naming the key's file (the chart mounts it from a Secret: `tokenKey`)."""
PREVIOUS_KEY_SETTING = "--previous-token-key-file"
"""The key before a rotation (`tokenKey.previousSecret`): signatures it made are still trusted,
and signed again with the new key."""


def run_token(key: bytes, uid: str) -> str:
    """The run's token: HMAC-SHA256 of its uid, URL-safe base64 without padding (43 characters,
    as `secrets.token_urlsafe(32)`)."""
    digest = hmac.new(key, uid.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def run_credentials(key: bytes, uid: str) -> dict[str, str]:
    """The run's credential for each scope, by scope: what its Secret holds. The token itself
    is in no Secret: no pod needs it."""
    token = run_token(key, uid)
    return {scope: scoped(token, scope) for scope in SCOPES}


def member_credentials(key: bytes, pool_uid: str, member: str) -> dict[str, str]:
    """A pool member's credential for each of its scopes (`rlkube.scopes.member_scoped`), from the
    POOL's token alone: what the member run's Secret holds. Another member's differ, and none
    gives back the pool's token."""
    token = run_token(key, pool_uid)
    return {scope: member_scoped(token, member, scope) for scope in MEMBER_SCOPES}


def checkpoint_key(key: bytes, uid: str) -> str:
    """The run's checkpoint key (`rlkube.manifest`), which signs what its trainer writes and
    loads: derived from the token like a scope's credential, which none of them gives back."""
    return scoped(run_token(key, uid), "checkpoint")


def read_key(path: str | None, setting: str = KEY_SETTING) -> bytes:
    """The key from its file, surrounding whitespace stripped; ValueError naming the setting when
    it is not given, unreadable or shorter than `MIN_KEY_BYTES`."""
    if not path:
        raise ValueError(f"{setting} is required: the key each run's token is derived from (the Helm "
                         "chart mounts one from its Secret, `tokenKey` in its values)")
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        raise ValueError(f"{setting}: cannot read {path}: {e.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{setting}: the key in {path} has {len(key)} bytes; at least {MIN_KEY_BYTES} are needed")
    return key
