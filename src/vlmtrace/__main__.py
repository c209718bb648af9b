"""The `vlmtrace` command and `python -m vlmtrace`: one entry point. `run` is served without the CLI's
libraries (typer, rich: the `report` extra), so it also works in a bare serving image that has only
vlmtrace's runtime dependencies; every other command says which extra to install where they are missing."""

import sys


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        from vlmtrace.launch import main as run

        sys.exit(run(sys.argv[2:]))
    try:
        from vlmtrace.cli.main import app
    except ImportError as error:  # a base install: the instrumentation only
        sys.stderr.write(f"vlmtrace: this command needs the report libraries, which are not installed ({error.name}): "
                         "pip install 'vlmtrace[report]'\n")
        sys.exit(2)
    app(prog_name="vlmtrace")


if __name__ == "__main__":
    main()
