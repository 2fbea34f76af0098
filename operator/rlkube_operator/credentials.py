"""Credentials kept out of URLs: the check in Python (`url_credentials`), and the same check as
the CRD's CEL rule on the object store's URLs sees it (`URL_CREDENTIALS_RE`)."""

from urllib.parse import parse_qsl, urlsplit

CREDENTIAL_QUERY_KEYS = ("key", "secret", "token", "password", "passwd", "credential", "signature", "sig")
"""Query parameters that carry credentials (`?access_key=`, `?X-Amz-Signature=`, `?sig=`)."""


URL_CREDENTIALS_RE = (r"^[a-z][a-z0-9+.-]*://[^/?#]*@|[?&][^=&#]*(?i:"
                      + "|".join(CREDENTIAL_QUERY_KEYS) + ")")
"""`url_credentials` as the CRD's CEL rule sees it (RE2)."""


def url_credentials(url: str) -> str | None:
    """What in `url` is a credential (user info, or a query parameter named like one), or None.
    URLs land in the run's ConfigMap and the pods' command lines, readable by anyone who may
    read those: credentials belong in a Secret."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        return "user info before '@'"
    names = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
    if found := [n for n in names if any(word in n.lower() for word in CREDENTIAL_QUERY_KEYS)]:
        return f"query parameter {found[0]!r}"
    return None


def urls_in(node, path: str):
    """(path, value) of every string under a key that names a URL (`url`, `*_url`, `*_urls`)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith(("url", "urls")) and isinstance(value, str):
                yield f"{path}.{key}", value
            elif key.endswith("urls") and isinstance(value, list):
                yield from ((f"{path}.{key}[{i}]", v) for i, v in enumerate(value) if isinstance(v, str))
            else:
                yield from urls_in(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from urls_in(value, f"{path}[{i}]")
