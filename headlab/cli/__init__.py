"""The command line: `headlab.cli.main` parses (its subcommands are the table `COMMANDS`),
`headlab.cli.arguments` holds the options they take, `headlab.cli.commands` what each one does."""
