"""Where the client finds its server and token: the environment first, then the file ``gpupool-cli login`` wrote.

``GPUPOOL_URL`` and ``GPUPOOL_TOKEN`` (and ``GPUPOOL_TIMEOUT``, seconds) override the file, so CI jobs and
containers need no file at all. The file is ``$GPUPOOL_CONFIG`` if set, else ``gpupool/cli.json`` in the user's
config directory (``$XDG_CONFIG_HOME``, by default ``~/.config``; ``%APPDATA%`` on Windows). It holds a secret:
it is written readable by its owner only (0600, in a 0700 directory) and replaced atomically.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpupool_client.errors import ConfigError

ENV_URL = "GPUPOOL_URL"
ENV_TOKEN = "GPUPOOL_TOKEN"
ENV_TIMEOUT = "GPUPOOL_TIMEOUT"
ENV_CONFIG = "GPUPOOL_CONFIG"
#: Seconds to wait for an answer (connecting takes at most 10 of them).
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Settings:
    url: str
    token: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: Where the values came from, for messages ("environment", the file's path).
    source: str = ""


def config_path(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get(ENV_CONFIG):
        return Path(environ[ENV_CONFIG]).expanduser()
    if sys.platform == "win32" and environ.get("APPDATA"):
        base = Path(environ["APPDATA"])
    else:
        base = Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "gpupool" / "cli.json"


def read_config(path: Path) -> dict[str, str]:
    """The saved login ({} when there is none); a file that is not the JSON we write is a ``ConfigError``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}; run `gpupool-cli login` again to rewrite it.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object; run `gpupool-cli login` again to rewrite it.")
    return {key: str(value) for key, value in data.items() if value is not None}


def load_settings(
    *,
    url: str | None = None,
    token: str | None = None,
    timeout_s: float | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Settings:
    """The settings to use: explicit arguments, else the environment, else the saved login."""
    path = config_path(environ)
    saved = read_config(path)
    chosen_url = (url or environ.get(ENV_URL) or saved.get("url", "")).rstrip("/")
    # The saved token goes only to the server it was saved for: another --url must bring its own token.
    saved_token = saved.get("token", "") if chosen_url == saved.get("url", "").rstrip("/") else ""
    chosen_token = token or environ.get(ENV_TOKEN) or saved_token
    if not chosen_url:
        raise ConfigError(
            f"no server: run `gpupool-cli login <URL>`, or set {ENV_URL} (e.g. https://pool.example.com)."
        )
    if not chosen_token:
        raise ConfigError(
            f"no API token for {chosen_url}: run `gpupool-cli login`, or set {ENV_TOKEN} (create a token in the "
            "console under your profile, or POST /api/v1/tokens/)."
        )
    raw_timeout = timeout_s if timeout_s is not None else environ.get(ENV_TIMEOUT) or saved.get("timeout_s")
    try:
        chosen_timeout = float(raw_timeout) if raw_timeout not in (None, "") else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"{ENV_TIMEOUT} must be a number of seconds, not {raw_timeout!r}.") from None
    source = "environment" if (environ.get(ENV_URL) or environ.get(ENV_TOKEN)) else str(path)
    return Settings(url=chosen_url, token=chosen_token, timeout_s=chosen_timeout, source=source)


def save_login(*, url: str, token: str, environ: Mapping[str, str] = os.environ) -> Path:
    """Write the login to the config file, readable by its owner only; returns the file's path."""
    path = config_path(environ)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = json.dumps({"url": url.rstrip("/"), "token": token}, indent=2) + "\n"
    # A temporary file created 0600 in the same directory, then renamed over the old one: the token is never
    # readable by others, not even for a moment, and a crash leaves the old file whole.
    descriptor, temporary = tempfile.mkstemp(prefix=".cli-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(body)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def forget_login(environ: Mapping[str, str] = os.environ) -> bool:
    """Remove the saved login; whether there was one."""
    path = config_path(environ)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
