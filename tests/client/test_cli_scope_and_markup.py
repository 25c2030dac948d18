"""``gpupool-cli`` says what its token may do, and prints user data as it is (issue 33, item 4): ``login`` and
``whoami`` show the token's scope, with a hint when that scope cannot submit jobs; ``show`` and ``ls`` print
commands, names and reasons holding ``[...]`` literally (rich read them as markup and dropped them)."""

from __future__ import annotations

import pytest

from tenants.models import TokenScope, User
from tests.client.conftest import submitted_id
from tests.factories import ApiTokenFactory

pytestmark = [pytest.mark.django_db(transaction=True)]
NO_ENV_LOGIN = {"GPUPOOL_URL": "", "GPUPOOL_TOKEN": ""}


def test_login_and_whoami_show_a_write_tokens_scope_and_no_hint(pool, run_cli):
    ran = run_cli("login", pool.url, "--token", pool.member_token, env=NO_ENV_LOGIN)
    assert ran.exit_code == 0, ran.stderr
    assert "scope write (enough to submit and cancel jobs)" in ran.stdout
    assert "hint:" not in ran.stderr
    whoami = run_cli("whoami", env=NO_ENV_LOGIN)
    [token_line] = [line for line in whoami.stdout.splitlines() if line.strip().startswith("token ")]
    assert "scope write (enough to submit and cancel jobs)" in token_line
    assert "hint:" not in whoami.stderr
    assert run_cli("whoami", "--json").json()["token"]["scope"] == TokenScope.WRITE


def test_a_read_token_is_named_as_such_with_the_scope_to_make_instead(pool, run_cli):
    read = ApiTokenFactory(user=User.objects.get(username="alice"), name="looker", scope=TokenScope.READ)
    ran = run_cli("login", pool.url, "--token", read.secret, env=NO_ENV_LOGIN)
    assert ran.exit_code == 0, ran.stderr
    assert "Token looker: scope read (read only: cannot submit or cancel jobs)" in ran.stdout
    assert "make a token with scope write" in ran.stderr
    whoami = run_cli("whoami", env=NO_ENV_LOGIN)
    assert "token looker: scope read (read only" in whoami.stdout
    assert "make a token with scope write" in whoami.stderr
    body = run_cli("whoami", "--json", env=NO_ENV_LOGIN).json()["token"]
    assert (body["scope"], body["submits_jobs"], body["submit_scope"]) == ("read", False, "write")
    # What the hint warns of: this token's submit is refused.
    refused = run_cli("submit", "--gpus", "1", "--", "python", "a.py", env=NO_ENV_LOGIN)
    assert refused.exit_code == 3 and "needs scope 'write'" in refused.stderr, refused.stderr


def test_show_and_ls_print_brackets_in_commands_names_and_reasons_literally(pool, run_cli):
    command = ["python", "-c", "print(x[i]) # [...]", "[bold]x[/bold]", ":smile:", "[link=http://e.x]y[/link]"]
    ran = run_cli("submit", "--gpus", "1", "--name", "[exp] sweep", "--", *command)
    assert ran.exit_code == 0, ran.stderr
    job_id = submitted_id(ran.stdout)
    assert run_cli("cancel", str(job_id), "--reason", "[red]wrong[/red] data").exit_code == 0

    shown = run_cli("show", str(job_id))
    assert shown.exit_code == 0, shown.stderr
    [command_line] = [line for line in shown.stdout.splitlines() if line.startswith("Command")]
    for part in ("print(x[i]) # [...]", "[bold]x[/bold]", ":smile:", "[link=http://e.x]y[/link]"):
        assert part in command_line, (part, command_line)
    assert f"{job_id}  [exp] sweep" in shown.stdout
    history = shown.stdout.split("History", 1)[1]
    assert "[red]wrong[/red] data" in history  # the reason, in the state line and the history
    assert "[red]wrong[/red] data" in shown.stdout.split("History", 1)[0]

    listed = run_cli("ls", "--all")
    [row] = [line for line in listed.stdout.splitlines() if line.strip().startswith(str(job_id))]
    assert "[exp] sweep" in row and "[red]wrong[/red] data" in row
