"""``antdt broker``: run the embedded Kafka-compatible broker in the foreground."""

from __future__ import annotations

import typer

from antdt.embedded.broker import DEFAULT_PORT, RUNTIME_THREADS, EmbeddedBroker, parse_user
from antdt.errors import BrokerError
from antdt.runtime.shutdown import stop_on_signals


def broker(
    port: int = typer.Option(
        DEFAULT_PORT, "--port", "-p", min=1, max=65535, help="Loopback port to listen on."
    ),
    authentication: bool = typer.Option(
        False, "--authentication", help="Require SASL/SCRAM logins (implied by --user)."
    ),
    users: list[str] = typer.Option(
        [], "--user", metavar="NAME:PASSWORD", help="A SCRAM user (repeatable)."
    ),
    threads: int = typer.Option(
        RUNTIME_THREADS,
        "--threads",
        min=1,
        help="The broker's runtime threads (more cost more CPU on a small machine).",
    ),
) -> None:
    """Run the embedded broker (Tansu, in memory) until Ctrl-C or SIGTERM."""
    accounts = _accounts(users)
    with (
        stop_on_signals() as stop,
        EmbeddedBroker(
            port=port, authentication=authentication, users=accounts, threads=threads
        ) as running,
    ):
        typer.echo(f"embedded broker ready in {running.ready_after_s:.3f} s")
        typer.echo(f"bootstrap servers: {running.bootstrap_servers}")
        typer.echo(
            f"export ANTDT_BOOTSTRAP_SERVERS={running.bootstrap_servers}"
            " ANTDT_BROKER_PROFILE=embedded"
        )
        if running.authentication:
            typer.echo(_credentials_hint(next(iter(accounts), "<user>")))
        while not stop.wait(0.2):
            if not running.is_running():
                raise typer.Exit(1)
        typer.echo("stopping embedded broker")


def _accounts(users: list[str]) -> dict[str, str]:
    """``--user`` values as {name: password}; a bad one is a usage error (exit 2)."""
    try:
        accounts = dict(parse_user(user) for user in users)
    except BrokerError as exc:
        raise typer.BadParameter(str(exc), param_hint="--user") from None
    if len(accounts) < len(users):
        raise typer.BadParameter("the same user is given twice", param_hint="--user")
    return accounts


def _credentials_hint(user: str) -> str:
    """The settings a client needs here (the password is never printed)."""
    return (
        "SASL/SCRAM required: export ANTDT_SECURITY_PROTOCOL=SASL_PLAINTEXT"
        " ANTDT_SASL_MECHANISM=SCRAM-SHA-512"
        f" ANTDT_SASL_USERNAME={user} ANTDT_SASL_PASSWORD=<password>"
    )
