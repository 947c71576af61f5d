"""The command line: `headlab.cli.parser` parses (its subcommands are the table `COMMANDS`) without
loading torch, `headlab.cli.arguments` holds the options they take, `headlab.cli.main` runs a parsed
command, `headlab.cli.model_commands` holds what `info` and `train` do, `headlab.cli.report_commands`
what `report` and `docs` do and `headlab.cli.commands` what the others do."""
