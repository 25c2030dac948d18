"""The ``gpupool-cli`` command group, its options, and how errors end a command.

API errors are printed as the server's ``code`` and ``detail`` and end the command with a distinct exit code
(:mod:`gpupool_client.errors`): 0 ok, 2 usage, 3 auth, 4 not found, 5 refused, 6 server, 7 network.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
from rich.text import Text

from gpupool_client import __version__
from gpupool_client.cli.output import console
from gpupool_client.client import Client
from gpupool_client.errors import EXIT_OK, ApiError, GpupoolError
from gpupool_client.spec import SpecError

PROG = "gpupool-cli"
COMPLETE_VAR = "_GPUPOOL_CLI_COMPLETE"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class State:
    """Options of the command group, and the client made from them on first use."""

    url: str | None = None
    token: str | None = None
    timeout_s: float | None = None
    max_retries: int = 4
    _client: Client | None = field(default=None, repr=False)

    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_config(
                url=self.url, token=self.token, timeout_s=self.timeout_s, max_retries=self.max_retries
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def api_command(function: F) -> F:
    """Turn the SDK's errors into a message on stderr (JSON with ``--json``) and the error's exit code."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except SpecError as exc:
            raise click.UsageError(str(exc)) from None
        except GpupoolError as exc:
            print_error(exc, as_json=bool(kwargs.get("as_json")))
            raise click.exceptions.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def print_error(exc: GpupoolError, *, as_json: bool = False) -> None:
    err = console(stderr=True)
    if as_json:
        body = exc.as_dict() if isinstance(exc, ApiError) else {"code": type(exc).__name__, "detail": str(exc)}
        click.echo(json.dumps(body), err=True)
    elif isinstance(exc, ApiError):
        err.print(Text.assemble(("error", "bold red"), f" [{exc.code}]: {exc.detail}"))
        for name, messages in exc.errors.items():
            text = "; ".join(str(m) for m in messages) if isinstance(messages, list) else str(messages)
            if text not in exc.detail:
                err.print(Text(f"  {name}: {text}"))
    else:
        err.print(Text.assemble(("error", "bold red"), f": {exc}"))


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (the API's objects) instead of text.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--url", metavar="URL", help="Server URL (default: $GPUPOOL_URL, else the saved login).")
@click.option("--token", metavar="TOKEN", help="API token (default: $GPUPOOL_TOKEN, else the saved login).")
@click.option("--timeout", "timeout_s", type=float, metavar="SECONDS", help="Wait this long for each answer.")
@click.option(
    "--retries",
    "max_retries",
    type=click.IntRange(0, 10),
    default=4,
    show_default=True,
    help="Times to retry a request refused for load (429, 503) or that did not reach the server.",
)
@click.version_option(__version__, prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, url: str | None, token: str | None, timeout_s: float | None, max_retries: int) -> None:
    """Run and watch jobs on a gpupool GPU pool.

    Start with `gpupool-cli login URL`, then `gpupool-cli submit --gpus 1 -- python train.py`.
    """
    state = State(url=url, token=token, timeout_s=timeout_s, max_retries=max_retries)
    ctx.obj = state
    ctx.call_on_close(state.close)


def current_state() -> State:
    return click.get_current_context().find_object(State)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module's docstring)."""
    try:
        code = cli.main(args=list(argv) if argv is not None else None, prog_name=PROG, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return code if isinstance(code, int) else EXIT_OK


def main() -> None:
    # The completion hook (``_GPUPOOL_CLI_COMPLETE=bash_source``) runs through click's standalone path.
    if os.environ.get(COMPLETE_VAR):
        cli.main(prog_name=PROG)
        return
    sys.exit(run())
