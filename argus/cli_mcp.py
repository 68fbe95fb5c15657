"""`argus mcp`: Argus's tools for an ops agent over the Model Context Protocol (argus/mcp_server.py).

stdio (the default) for an agent that starts it as a subprocess, with the agent's token in ARGUS_TOKEN; `--http`
serves streamable HTTP at /mcp for agents elsewhere, each bringing its own token as `Authorization: Bearer`.
Either way it talks to a running `argus serve` at --url: it holds no data and no credentials of its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from core.errors import ConfigError
from core.settings import load_settings

TOKEN_ENV = "ARGUS_TOKEN"

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML settings file (default: $ARGUS_CONFIG)", show_default=False),
]


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)


def mcp(
    config: ConfigOption = None,
    url: Annotated[str | None, typer.Option(help="the Argus API to serve (default: api_host:api_port of the "
                                                 "settings)")] = None,
    http: Annotated[bool, typer.Option("--http", help="serve streamable HTTP at /mcp instead of stdio")] = False,
    host: Annotated[str, typer.Option(help="with --http: the address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="with --http: the port to listen on")] = 8765,
) -> None:
    """Serve Argus's tools, runbooks and triage prompt to an ops agent over MCP."""
    from argus.mcp_server import ArgusApi, build_mcp

    settings = load_settings(config)
    if url is None:
        api_host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::", "") else settings.api_host
        url = f"http://{api_host}:{settings.api_port}"
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url[:200]!r} is not an http(s) URL", hint="e.g. --url http://argus-head:8080")
    token = os.environ.get(TOKEN_ENV) or None
    if not http and token is None:
        raise ConfigError(f"argus mcp over stdio needs the agent's Argus token in {TOKEN_ENV}",
                          hint="create one with `argus tokens create ops-agent --role agent` and export it")
    # Over HTTP each request brings its own token: the environment's is not lent to whoever connects.
    server = build_mcp(ArgusApi(url, token=None if http else token, timeout_s=settings.request_timeout_s))
    if http:
        server.run("streamable-http", host=host, port=port)
    else:
        server.run("stdio")
