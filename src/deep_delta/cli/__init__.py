"""The ``ddl`` command. Each subcommand lives in its own module here and exposes ``add_parser(subparsers)``."""
