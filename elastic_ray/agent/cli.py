"""`elastic-agent`: the per-node agent's command line."""

from __future__ import annotations

import click

from .. import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="elastic-agent")
def main() -> None:
    """The per-node agent of elastic-ray: starts, supervises, drains and moves Ray."""


if __name__ == "__main__":  # pragma: no cover
    main()
