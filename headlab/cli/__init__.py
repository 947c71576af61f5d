"""The command line: `headlab.cli.parser` parses (its subcommands are the table `COMMANDS`) without
loading torch, `headlab.cli.arguments` holds the options they take, `headlab.cli.main` runs a parsed
command and `headlab.cli.commands` holds what each one does."""
