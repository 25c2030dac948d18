"""``login``, ``logout``, ``whoami`` and ``completion``."""

from __future__ import annotations

import sys

import click
from click.shell_completion import get_completion_class

from gpupool_client.cli.app import COMPLETE_VAR, PROG, api_command, cli, current_state, json_option, print_json
from gpupool_client.client import Client
from gpupool_client.config import forget_login, save_login
from gpupool_client.models import MeToken


@cli.command()
@click.argument("url", required=False)
@click.option("--token", "token_option", metavar="TOKEN", help="The API token; asked for (hidden) when not given.")
@click.option("--token-stdin", is_flag=True, help="Read the token from standard input (for scripts).")
@api_command
def login(url: str | None, token_option: str | None, token_stdin: bool) -> None:
    """Save the server URL and your API token (checked against the server first).

    The file is written readable by you only (0600), in your config directory; GPUPOOL_URL and
    GPUPOOL_TOKEN override it. Create a token in the console (your profile) or with POST /api/v1/tokens/:
    scope write to submit and cancel jobs, read to look only."""
    state = current_state()
    url = url or state.url or click.prompt("Server URL (e.g. https://pool.example.com)")
    if token_stdin:
        token = sys.stdin.readline().strip()
    else:
        token = token_option or state.token or click.prompt("API token", hide_input=True)
    if not token:
        raise click.UsageError("an empty token: give --token, --token-stdin or type it when asked.")
    try:
        with Client(url, token, timeout_s=state.timeout_s or 30.0) as client:
            me = client.me()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    path = save_login(url=url, token=token)
    tenants = ", ".join(sorted({m.tenant_slug for m in me.memberships})) or "no tenant"
    role = f", {me.platform_role}" if me.platform_role and me.platform_role != "none" else ""
    click.echo(f"Signed in to {url.rstrip('/')} as {me.username} ({tenants}{role}). Saved to {path}.")
    click.echo(f"Token {token_text(me.token)}.")
    _scope_hint(me.token)


@cli.command()
def logout() -> None:
    """Forget the saved login (the token itself stays valid until it expires or is revoked)."""
    click.echo("Signed out." if forget_login() else "There was no saved login.")


@cli.command()
@json_option
@api_command
def whoami(as_json: bool) -> None:
    """Who the token belongs to, its scope (what it may do), and your tenants."""
    me = current_state().client().me()
    if as_json:
        print_json(me.raw)
        return
    role = me.platform_role if me.platform_role and me.platform_role != "none" else "no platform role"
    click.echo(f"{me.username} on {current_state().client().url} ({role})")
    click.echo(f"  token {token_text(me.token)}")
    for membership in me.memberships:
        click.echo(f"  {membership.tenant_slug}: {membership.role}")
    _scope_hint(me.token)


def token_text(token: MeToken | None) -> str:
    """The token in use, its scope and what that scope allows: ``ci: scope write (enough to submit and cancel
    jobs), expires 2026-03-01``. A server too old to say gets "scope unknown"."""
    if token is None:
        return "scope unknown (the server does not say)"
    allows = "enough to submit and cancel jobs" if token.submits_jobs else "read only: cannot submit or cancel jobs"
    expires = f", expires {token.expires_at.astimezone():%Y-%m-%d}" if token.expires_at else ""
    return f"{token.name}: scope {token.scope} ({allows}){expires}"


def _scope_hint(token: MeToken | None) -> None:
    """On stderr, when the token's scope cannot submit jobs: which scope to make instead, and where."""
    if token is None or token.submits_jobs:
        return
    click.echo(
        f"hint: to submit and cancel jobs, make a token with scope {token.submit_scope} in the console (your name "
        f"in the top bar, API tokens) or with POST /api/v1/tokens/, then run {PROG} login again.",
        err=True,
    )


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh"]))
def completion(shell: str) -> None:
    """Print the shell completion script.

    \b
      bash:  echo 'eval "$(gpupool-cli completion bash)"' >> ~/.bashrc
      zsh:   echo 'eval "$(gpupool-cli completion zsh)"' >> ~/.zshrc
    """
    completion_class = get_completion_class(shell)
    assert completion_class is not None
    click.echo(completion_class(cli, {}, PROG, COMPLETE_VAR).source())
