"""The `vlmtrace` command and `python -m vlmtrace`: one entry point. `run` is served without the CLI's
libraries (typer, rich), so it also works in a bare serving image that has only vlmtrace's runtime
dependencies."""

import sys


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        from vlmtrace.launch import main as run

        sys.exit(run(sys.argv[2:]))
    from vlmtrace.cli.main import app

    app(prog_name="vlmtrace")


if __name__ == "__main__":
    main()
