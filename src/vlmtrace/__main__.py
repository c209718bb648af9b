"""The `vlmtrace` command and `python -m vlmtrace`: one entry point. `run` is served without the CLI's
libraries (typer, rich), so it also works in a bare serving image that has only vlmtrace's runtime
dependencies; its `-h` is the CLI's, where those libraries are installed."""

import sys

EXIT_NO_EXTRA = 4  # the command needs an extra that is not installed (cli/traces.py)


def main() -> None:
    if sys.argv[1:2] == ["run"] and not (sys.argv[2:3] in (["-h"], ["--help"]) and _cli_installed()):
        from vlmtrace.launch import main as run

        sys.exit(run(sys.argv[2:]))
    try:
        from vlmtrace.cli.main import app
    except ImportError as error:
        sys.stderr.write(
            f"vlmtrace: the commands but `run` need the report extra ({error}): pip install 'vlmtrace[report]'\n"
        )
        sys.exit(EXIT_NO_EXTRA)
    app(prog_name="vlmtrace")


def _cli_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("typer") is not None and find_spec("rich") is not None


if __name__ == "__main__":
    main()
